"""The soak's accounting and figures, from its JSON alone (so a cut-short run's file can be re-read):

- every answer counted once, by door and outcome;
- a kill window is [kill, the restarted server ready]; an answer "in flight at a kill" started before a kill and
  ended after it; answers lost outside every kill window are the figure whose target is 0;
- RSS growth over the second half: least squares with one level per (process, backend), samples within SETTLE_S
  of a switch or a start left out, so a switch's swing is not growth but a step that stays after a round trip is;
  the plain fit beside it.
"""

from __future__ import annotations

SETTLE_S = 30.0  # after a switch or a (re)start, RSS moves for a while as the new backend warms up


def _answers(body: dict) -> list[dict]:
    fields = body["answers_fields"]
    return [dict(zip(fields, row, strict=True)) for row in body["answers"]]


def kill_windows(body: dict, end_s: float) -> list[tuple[float, float]]:
    return [(k["at_s"], k["ready_s"] if k["ready_s"] is not None else end_s) for k in body["kills"]]


def account(body: dict) -> dict:
    answers = _answers(body)
    end_s = body.get("elapsed_min", 0) * 60
    windows = kill_windows(body, end_s)

    def in_flight_at_kill(a: dict) -> bool:
        return any(a["t0_s"] <= at <= a["t1_s"] for at, _ in windows)

    def in_kill_window(a: dict) -> bool:
        return any(a["t0_s"] <= ready and a["t1_s"] >= at for at, ready in windows)

    by_door: dict[str, dict[str, int]] = {}
    for a in answers:
        counts = by_door.setdefault(a["door"], {"ok": 0, "failed": 0, "refused": 0, "lost": 0})
        counts[a["outcome"]] += 1
    lost_outside = [a for a in answers if a["outcome"] == "lost" and not in_kill_window(a)]
    not_retryable = [a for a in answers if a["outcome"] == "failed" and not a["retryable"]]
    at_kill = [a for a in answers if in_flight_at_kill(a)]
    messages: dict[str, int] = {}
    for a in answers:
        if a["outcome"] != "ok":
            key = f"{a['outcome']}: {a['message'][:160]}"
            messages[key] = messages.get(key, 0) + 1
    total = sum(sum(c.values()) for c in by_door.values())
    return {
        "answers": total,
        "by_door": by_door,
        "ok": sum(c["ok"] for c in by_door.values()),
        "in_flight_at_kills": len(at_kill),
        "in_flight_at_kills_outcomes": _count(a["outcome"] for a in at_kill),
        "lost_in_kill_windows": sum(1 for a in answers if a["outcome"] == "lost" and in_kill_window(a)),
        "lost_outside_kill_windows": len(lost_outside),
        "lost_outside_kill_windows_list": [[a[k] for k in body["answers_fields"]] for a in lost_outside[:50]],
        "failed_not_retryable": len(not_retryable),
        "failed_not_retryable_list": [[a[k] for k in body["answers_fields"]] for a in not_retryable[:50]],
        "accounting_consistent": total == len(answers)
        and all(k["ready_s"] is not None for k in body["kills"][:-1])
        and all(a["t0_s"] <= a["t1_s"] for a in answers),
        "messages": dict(sorted(messages.items(), key=lambda item: -item[1])),
        "kills": len(body["kills"]),
        "restart_s": [round(k["ready_s"] - k["at_s"], 1) for k in body["kills"] if k["ready_s"] is not None],
        "switches": len(body["switches"]),
        "switches_failed": sum(1 for s in body["switches"] if not s["ok"]),
        "log_disk_full_windows": len(body["log_disk"]),
        "log_disk_warnings_logged": sum(1 for d in body["log_disk"] if d["warning_logged"]),
        "answers_ok_while_log_disk_full": _ok_within(answers, [(d["from_s"], d["to_s"]) for d in body["log_disk"]]),
        "slow_client_windows": len(body["slow_clients"]),
        "answers_ok_while_slow_clients": _ok_within(answers, [(s["from_s"], s["to_s"]) for s in body["slow_clients"]]),
        "rss": rss_figures(body, end_s),
    }


def _count(values) -> dict[str, int]:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return counts


def _ok_within(answers: list[dict], windows: list[tuple]) -> int:
    return sum(
        1
        for a in answers
        if a["outcome"] == "ok" and any(to is not None and start <= a["t1_s"] <= to for start, to in windows)
    )


def backend_at(body: dict, t: float) -> str:
    """The backend serving at t: PyTorch after each (re)start, then whatever the last successful switch chose."""
    starts = [k["at_s"] for k in body["kills"] if k["at_s"] <= t]
    since = starts[-1] if starts else 0.0
    mode = "pytorch"
    for switch in body["switches"]:
        if since <= switch["at_s"] <= t and switch["ok"]:
            mode = switch["to"]
    return mode


def slope_per_min(points: list[tuple[float, float, object]]) -> float | None:
    """Least-squares slope of value against time with one level per group: within each group, time and value are
    taken about the group's means, and one slope fits all groups. In MiB per minute."""
    groups: dict[object, list[tuple[float, float]]] = {}
    for t, v, group in points:
        groups.setdefault(group, []).append((t, v))
    num = den = 0.0
    for members in groups.values():
        mean_t = sum(t for t, _ in members) / len(members)
        mean_v = sum(v for _, v in members) / len(members)
        num += sum((t - mean_t) * (v - mean_v) for t, v in members)
        den += sum((t - mean_t) ** 2 for t, _ in members)
    return round(num / den * 60, 3) if den > 0 and len(points) >= 3 else None


def rss_figures(body: dict, end_s: float) -> dict:
    samples = body["rss"]
    if not samples:
        return {"growth_mib_per_min": None}
    half = end_s / 2
    events = [s["at_s"] for s in body["switches"]] + [k["ready_s"] or k["at_s"] for k in body["kills"]]
    second = [(t, v, pid) for t, v, pid in samples if t >= half]
    settled = [
        (t, v, (pid, backend_at(body, t))) for t, v, pid in second if not any(0 <= t - e < SETTLE_S for e in events)
    ]
    values = [v for _, v, _ in samples]
    return {
        "first_mib": values[0],
        "last_mib": values[-1],
        "max_mib": max(values),
        "second_half_from_min": round(half / 60, 1),
        "growth_mib_per_min": slope_per_min(settled),
        "plain_fit_mib_per_min": slope_per_min([(t, v, "all") for t, v, _ in second]),
        "processes_in_second_half": len({pid for _, _, pid in second}),
        "median_by_backend_second_half": {
            mode: _median([v for _, v, g in settled if g[1] == mode]) for mode in ("pytorch", "trt")
        },
    }


def _median(values: list[float]) -> float | None:
    return sorted(values)[len(values) // 2] if values else None


def markdown(body: dict) -> str:
    s = body["summary"]
    r = s["rss"]
    doors = "; ".join(
        f"{door}: " + ", ".join(f"{n} {k}" for k, n in counts.items() if n) for door, counts in s["by_door"].items()
    )
    rows = [
        ("date, machine", f"{body['started_at']}, {body['machine']}"),
        ("command", f"`{body['command']}`"),
        ("duration", f"{body.get('elapsed_min')} min ({'complete' if body['complete'] else 'PARTIAL'})"),
        ("answers", f"{s['answers']} ({doors})"),
        ("kills / restart to ready (s)", f"{s['kills']} / {s['restart_s']}"),
        ("in flight at a kill (outcomes)", f"{s['in_flight_at_kills']} ({s['in_flight_at_kills_outcomes']})"),
        ("lost outside a kill window (target 0)", s["lost_outside_kill_windows"]),
        ("failed without a retryable message", s["failed_not_retryable"]),
        ("switches (failed)", f"{s['switches']} ({s['switches_failed']})"),
        (
            "log disk full: windows / warning logged / answers ok meanwhile",
            f"{s['log_disk_full_windows']} / {s['log_disk_warnings_logged']} / {s['answers_ok_while_log_disk_full']}",
        ),
        (
            "slow clients: windows / answers ok meanwhile",
            f"{s['slow_client_windows']} / {s['answers_ok_while_slow_clients']}",
        ),
        ("RSS first / last / max (MiB)", f"{r.get('first_mib')} / {r.get('last_mib')} / {r.get('max_mib')}"),
        (
            f"RSS growth from minute {r.get('second_half_from_min')} (target <= {body['target_growth_mib_per_min']})",
            f"{r.get('growth_mib_per_min')} MiB/min per backend level; plain fit {r.get('plain_fit_mib_per_min')}",
        ),
    ]
    if "server_log" in body:
        log = body["server_log"]
        rows.append(
            (
                "server log: internal errors / tracebacks / logging errors / lost-record warnings",
                f"{log['internal_errors']} / {log['tracebacks']} / {log['logging_errors']} / {log['lost_record_warnings']}",
            )
        )
    lines = ["| figure | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)]
    if s["messages"]:
        lines += [
            "",
            "Messages of answers that were not ok (count):",
            *(f"- {n}: {m}" for m, n in s["messages"].items()),
        ]
    if body["skipped"]:
        lines += ["", "Skipped:", *(f"- {text}" for text in body["skipped"])]
    return "\n".join(lines) + "\n"


def plot(body: dict, path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    rss = body["rss"]
    top.plot([t / 60 for t, _, _ in rss], [v for _, v, _ in rss], lw=1, color="tab:blue")
    for window, colour, label in (
        ("log_disk", "tab:orange", "log disk full"),
        ("slow_clients", "tab:purple", "slow clients"),
    ):
        for i, w in enumerate(body[window]):
            to = w["to_s"] if w["to_s"] is not None else w["from_s"]
            for axis in (top, bottom):
                axis.axvspan(
                    w["from_s"] / 60, to / 60, color=colour, alpha=0.15, label=label if axis is top and i == 0 else None
                )
    for switch in body["switches"]:
        top.axvline(switch["at_s"] / 60, color="grey", lw=0.6, ls=":")
    for i, kill in enumerate(body["kills"]):
        for axis in (top, bottom):
            axis.axvline(kill["at_s"] / 60, color="red", lw=1, label="kill -9" if axis is top and i == 0 else None)
    top.set_ylabel("server RSS (MiB)")
    s = body["summary"]
    top.set_title(
        f"Soak {body['started_at']}: {s['answers']} answers, {s['lost_outside_kill_windows']} lost outside kill "
        f"windows; RSS growth {s['rss']['growth_mib_per_min']} MiB/min (dotted: switches)",
        fontsize=9,
    )
    top.legend(loc="upper left", fontsize=7)
    fields = body["answers_fields"]
    answers = [dict(zip(fields, row, strict=True)) for row in body["answers"]]
    styles = {"ok": ("o", 3), "failed": ("x", 14), "refused": ("+", 14), "lost": ("X", 24)}
    colours = {"main": "tab:blue", "main-report": "tab:cyan", "api": "tab:green", "api-stream": "tab:olive",
               "teaching": "tab:brown"}  # fmt: skip
    for door, colour in colours.items():
        for outcome, (marker, size) in styles.items():
            points = [
                (a["t0_s"] / 60, a["t1_s"] - a["t0_s"])
                for a in answers
                if a["door"] == door and a["outcome"] == outcome
            ]
            if points:
                bottom.scatter(*zip(*points, strict=True), s=size, marker=marker, color=colour,
                               label=f"{door} {outcome}")  # fmt: skip
    bottom.set_ylabel("answer time (s)")
    bottom.set_xlabel("minutes")
    bottom.legend(loc="upper right", fontsize=6, ncol=3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
