"""One-hour soak on the loopback: many clients, each on its own film, with pauses, questions, reports and New case,
while the mode flips between PyTorch and TensorRT; the server's RSS is sampled throughout. Not part of the test
suite (it runs for an hour). Issue 19, section 7.

    python -m benchmarks.soak --clients 16 --minutes 60 --switch-every-s 300 --output-dir test-artifacts/soak

It starts its own server through scripts/start_gradio.sh (its own LOG_DIR, a free loopback port), builds the demo
INT8 bundle first when --engine_path is not given (as the test suite's fixture does; --no-switch skips both),
and stops the server at the end. Every minute it rewrites soak.json in the output folder, so a run cut short
still leaves its figures (marked "complete": false). At the end: soak.json, soak.md (a table) and soak.png (RSS
and answer times over time). Target (issue 19): 0 failures and RSS growth <= 0.5 MiB/min over the last 30 minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts"
TARGET_GROWTH_MIB_PER_MIN = 0.5


@dataclass
class SoakRecord:
    started_at: str
    command: str
    clients: int
    planned_s: float
    elapsed_s: float = 0.0
    complete: bool = False
    rss: list[tuple[float, float]] = field(default_factory=list)  # (s since start, MiB)
    answers: list[tuple[float, str, float]] = field(default_factory=list)  # (s since start, kind, seconds)
    failures: list[tuple[float, str]] = field(default_factory=list)
    switches: list[dict] = field(default_factory=list)
    new_cases: int = 0

    def summary(self) -> dict:
        from devtools.loadtest import percentiles

        by_kind: dict[str, list[float]] = {}
        for _, kind, seconds in self.answers:
            by_kind.setdefault(kind, []).append(seconds)
        window_s = min(1800.0, self.elapsed_s / 2)
        return {
            "elapsed_min": round(self.elapsed_s / 60, 1),
            "complete": self.complete,
            "answers": {kind: len(values) for kind, values in by_kind.items()},
            "answer_time_s": {
                kind: {key: round(value, 3) for key, value in percentiles(values).items() if value is not None}
                for kind, values in by_kind.items()
            },
            "new_cases": self.new_cases,
            "failures": len(self.failures),
            "switches": len(self.switches),
            "switches_failed": sum(1 for s in self.switches if not s["ok"]),
            "rss_first_mib": self.rss[0][1] if self.rss else None,
            "rss_last_mib": self.rss[-1][1] if self.rss else None,
            "rss_max_mib": max(value for _, value in self.rss) if self.rss else None,
            "growth_window_min": round(window_s / 60, 1),
            "rss_growth_mib_per_min": growth_per_minute(self.rss, window_s),
            "pytorch_phases": self.phases("pytorch"),
        }

    def phases(self, mode: str) -> list[dict]:
        """RSS in each stretch served by `mode` (between switches), from its second half: TensorRT loads and
        unloads swing RSS by hundreds of MiB, so growth is judged like for like, PyTorch phase against PyTorch
        phase, as well as by the overall slope."""
        edges = [0.0] + [s["at_s"] for s in self.switches] + [self.elapsed_s]
        modes = ["pytorch"] + [s["to"] for s in self.switches]
        found = []
        for start, end, phase_mode in zip(edges, edges[1:], modes, strict=False):
            if phase_mode != mode:
                continue
            inside = [(t, v) for t, v in self.rss if (start + end) / 2 <= t <= end]
            tail = sorted(v for _, v in inside)
            if tail:
                found.append(
                    {
                        "from_min": round(start / 60, 1),
                        "to_min": round(end / 60, 1),
                        "median_mib": tail[len(tail) // 2],
                        "slope_mib_per_min": growth_per_minute(inside, end - start),
                    }
                )
        return found

    def write(self, folder: Path) -> None:
        body = {"summary": self.summary(), **self.__dict__}
        temporary = folder / "soak.json.tmp"
        temporary.write_text(json.dumps(body, indent=1))
        temporary.replace(folder / "soak.json")


def growth_per_minute(samples: list[tuple[float, float]], window_s: float) -> float | None:
    """Least-squares slope of RSS (MiB) against time over the last window_s seconds, in MiB per minute."""
    if not samples or window_s <= 0:
        return None
    end = samples[-1][0]
    tail = [(t, v) for t, v in samples if t >= end - window_s]
    if len(tail) < 3:
        return None
    mean_t = sum(t for t, _ in tail) / len(tail)
    mean_v = sum(v for _, v in tail) / len(tail)
    spread = sum((t - mean_t) ** 2 for t, _ in tail)
    if spread == 0:
        return None
    slope = sum((t - mean_t) * (v - mean_v) for t, v in tail) / spread
    return round(slope * 60, 3)


def client_loop(index: int, url: str, film: Path, deadline: float, started: float, record: SoakRecord, lock) -> None:
    """One user: New case, upload their film, ask 1-3 questions with pauses, every third case a report."""
    from gradio_client import Client, handle_file

    rng = random.Random(index)
    client = Client(url, verbose=False)
    cycle = 0
    while time.monotonic() < deadline:
        cycle += 1
        try:
            client.predict(api_name="/new_case")
            client.predict(handle_file(str(film)), api_name="/upload_film")
            with lock:
                record.new_cases += 1
            for turn in range(rng.randint(1, 3)):
                time.sleep(rng.uniform(0.5, 4.0))  # reading the answer, typing the next question
                asked = time.monotonic()
                chat = client.predict(f"Client {index}, turn {turn}: findings?", api_name="/ask")[0]
                if not chat or chat[-1]["role"] != "assistant":
                    raise AssertionError("no answer in the conversation")
                with lock:
                    record.answers.append((round(asked - started, 1), "ask", time.monotonic() - asked))
            if cycle % 3 == 0:
                asked = time.monotonic()
                text = client.predict(api_name="/report")[0]
                if not text:
                    raise AssertionError("empty report")
                with lock:
                    record.answers.append((round(asked - started, 1), "report", time.monotonic() - asked))
            time.sleep(rng.uniform(1.0, 6.0))
        except Exception as exc:  # counted and reported: the target is none
            with lock:
                record.failures.append((round(time.monotonic() - started, 1), f"client {index}: {exc!r}"[:300]))
            time.sleep(2.0)
    client.close()


def build_bundle(workdir: Path) -> Path:
    """The demo model's INT8 bundle, built as the test suite's int8_bundle fixture builds it."""
    from medgemma_xray.phantoms.films import write_phantom_set

    films = workdir / "calib"
    write_phantom_set(films, 12)
    bundle = workdir / "engines" / "demo-int8"
    args = ["--model_path", str(REPO_ROOT / "models" / "medgemma-demo"), "--calib_images", str(films)]
    args += ["--precision", "int8", "--output_path", str(bundle), "--target", "tensorrt-rtx", "--max_seq_len", "1024"]
    args += ["--max_batch", "2", "--keep_fp32_onnx", "--allow_few_films"]
    done = subprocess.run(
        [sys.executable, "optimize_trt_engine.py", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800
    )
    (workdir / "build.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"building the demo bundle failed; see {workdir / 'build.log'}")
    return bundle


def plot(record: SoakRecord, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.plot([t / 60 for t, _ in record.rss], [v for _, v in record.rss], lw=1)
    for switch in record.switches:
        top.axvline(switch["at_s"] / 60, color="grey", lw=0.5, ls=":")
    top.set_ylabel("server RSS (MiB)")
    top.set_title(f"Soak: {record.clients} clients, {record.elapsed_s / 60:.0f} min (dotted: mode switches)")
    for kind, colour in (("ask", "tab:blue"), ("report", "tab:orange")):
        points = [(t / 60, s) for t, k, s in record.answers if k == kind]
        bottom.scatter([t for t, _ in points], [s for _, s in points], s=2, color=colour, label=kind)
    bottom.set_ylabel("answer time (s)")
    bottom.set_xlabel("minutes")
    bottom.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def markdown(record: SoakRecord) -> str:
    s = record.summary()
    rows = [
        ("date, command", f"{record.started_at}, `{record.command}`"),
        (
            "clients / duration",
            f"{record.clients} / {s['elapsed_min']} min ({'complete' if s['complete'] else 'PARTIAL'})",
        ),
        ("answers (ask, report)", f"{s['answers'].get('ask', 0)}, {s['answers'].get('report', 0)}"),
        ("new cases", s["new_cases"]),
        ("failures", s["failures"]),
        ("mode switches (failed)", f"{s['switches']} ({s['switches_failed']})"),
    ]
    for kind, figures in s["answer_time_s"].items():
        rows.append(
            (
                f"{kind} time p50 / p99 / max (s)",
                f"{figures.get('p50_s')} / {figures.get('p99_s')} / {figures.get('max_s')}",
            )
        )
    rows += [
        ("RSS first / last / max (MiB)", f"{s['rss_first_mib']} / {s['rss_last_mib']} / {s['rss_max_mib']}"),
        (
            f"RSS growth over the last {s['growth_window_min']} min",
            f"{s['rss_growth_mib_per_min']} MiB/min (target <= {TARGET_GROWTH_MIB_PER_MIN})",
        ),
    ]
    phases = ", ".join(f"{p['median_mib']:.0f} ({p['from_min']:g}-{p['to_min']:g} min)" for p in s["pytorch_phases"])
    rows.append(("RSS median in each PyTorch phase (MiB)", phases or "-"))
    slopes = ", ".join(str(p["slope_mib_per_min"]) for p in s["pytorch_phases"])
    rows.append(("RSS slope within each PyTorch phase, second half (MiB/min)", slopes or "-"))
    lines = ["| figure | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)]
    if record.failures:
        lines += ["", "Failures (first 10):", *(f"- at {t} s: {text}" for t, text in record.failures[:10])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--minutes", type=float, default=60)
    parser.add_argument("--switch-every-s", type=float, default=300)
    parser.add_argument("--sample-every-s", type=float, default=10)
    parser.add_argument("--engine_path", type=Path)
    parser.add_argument("--no-switch", action="store_true", help="PyTorch only (no bundle built)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--output-dir", type=Path, default=REPO_ROOT / "test-artifacts" / "soak")
    parser.add_argument("--report-only", type=Path, help="redraw soak.md and soak.png from this soak.json")
    args = parser.parse_args(argv)
    if args.report_only is not None:
        return report_only(args.report_only, args.output_dir.resolve())

    from devtools.loadtest import _free_port, rss_bytes
    from medgemma_xray.phantoms.films import chest_phantom, dicom_bytes, quantize

    output = args.output_dir.resolve()
    output.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="medgemma-soak-", dir=output))
    engine = None if args.no_switch else (args.engine_path or build_bundle(workdir))
    films = []
    for index in range(args.clients):  # each client its own film, so no two share a cached image
        film = workdir / f"film-{index}.dcm"
        film.write_bytes(
            dicom_bytes(quantize(chest_phantom(seed=100 + index), 12), bits_stored=12, window=(2048, 4096))
        )
        films.append(film)
    port = _free_port()
    env = {
        **os.environ,
        "LOG_DIR": str(workdir / "logs"),
        "PORT": str(port),
        "MAX_NEW_TOKENS": str(args.max_new_tokens),
    }
    env.pop("KEEP_BOTH_BACKENDS", None)

    def script(name: str, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(SCRIPTS / name), *extra], env=env, capture_output=True, text=True, timeout=900)

    started_proc = script("start_gradio.sh", *(("--engine_path", str(engine)) if engine else ()))
    if started_proc.returncode != 0:
        sys.stderr.write(started_proc.stdout + started_proc.stderr)
        return 1
    pid = int((workdir / "logs" / "gradio_app.pid").read_text())
    record = SoakRecord(
        started_at=time.strftime("%Y-%m-%d %H:%M %Z"),
        command="python -m benchmarks.soak " + " ".join(argv if argv is not None else sys.argv[1:]),
        clients=args.clients,
        planned_s=args.minutes * 60,
    )
    lock = threading.Lock()
    started = time.monotonic()
    deadline = started + args.minutes * 60
    url = f"http://127.0.0.1:{port}"
    threads = [
        threading.Thread(
            target=client_loop, args=(i, url, films[i], deadline, started, record, lock), name=f"soak-client-{i}"
        )
        for i in range(args.clients)
    ]
    for thread in threads:
        thread.start()
    mode, next_switch, next_sample, next_write = "pytorch", started + args.switch_every_s, started, started + 60
    try:
        while any(thread.is_alive() for thread in threads):
            now = time.monotonic()
            if now >= next_sample:
                with lock:
                    record.rss.append((round(now - started, 1), round(rss_bytes(pid) / 2**20, 1)))
                next_sample += args.sample_every_s
            if engine and now >= next_switch and now < deadline - 30:
                mode = "trt" if mode == "pytorch" else "pytorch"
                done = script(f"switch_to_{mode}.sh")
                ok = done.returncode == 0
                with lock:
                    record.switches.append({"at_s": round(now - started, 1), "to": mode, "ok": ok})
                next_switch += args.switch_every_s
            if now >= next_write:
                with lock:
                    record.elapsed_s = now - started
                    record.write(output)
                next_write += 60
            time.sleep(0.5)
        for thread in threads:
            thread.join()
        record.rss.append((round(time.monotonic() - started, 1), round(rss_bytes(pid) / 2**20, 1)))
        record.elapsed_s = time.monotonic() - started
        record.complete = record.elapsed_s >= args.minutes * 60
    finally:
        script("stop_gradio.sh")
    record.write(output)
    (output / "soak.md").write_text(markdown(record))
    plot(record, output / "soak.png")
    print(markdown(record))
    summary = record.summary()
    growth = summary["rss_growth_mib_per_min"]
    ok = not record.failures and not summary["switches_failed"]
    return 0 if ok and growth is not None and growth <= TARGET_GROWTH_MIB_PER_MIN else 1


def report_only(source: Path, output: Path) -> int:
    """Re-render a finished (or cut-short) run's table and plot from its JSON."""
    body = json.loads(source.read_text())
    body.pop("summary", None)
    record = SoakRecord(**{key: value for key, value in body.items()})
    output.mkdir(parents=True, exist_ok=True)
    (output / "soak.md").write_text(markdown(record))
    plot(record, output / "soak.png")
    record.write(output)
    print(markdown(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
