"""The soak's accounting (benchmarks/soak_report.py) on a hand-made run: which answers count as lost, which were in
flight at a kill, and the RSS slope with one level per backend."""

from __future__ import annotations

from benchmarks.soak_report import account

FIELDS = ["door", "client", "t0_s", "t1_s", "outcome", "retryable", "message"]


def run(answers, rss=(), switches=(), kills=({"at_s": 100.0, "pid": 1, "ready_s": 160.0},)) -> dict:
    return {
        "answers_fields": FIELDS,
        "answers": [list(a) for a in answers],
        "kills": list(kills),
        "switches": list(switches),
        "log_disk": [],
        "slow_clients": [],
        "rss": [list(s) for s in rss],
        "elapsed_min": 10.0,
    }


def test_a_loss_counts_against_the_target_only_outside_a_kill_window():
    summary = account(
        run(
            [
                ("main", 0, 10, 20, "ok", None, ""),
                ("main", 1, 90, 101, "lost", None, "CancelledError"),  # in flight at the kill
                ("api", 2, 130, 130, "refused", True, "connection refused"),  # while the server was down
                ("api", 2, 150, 170, "lost", None, "ReadError"),  # overlaps the window's end
                ("api", 3, 300, 310, "lost", None, "ReadTimeout"),  # long after the restart: a real loss
                ("main", 4, 320, 321, "failed", False, "Internal error"),
                ("main", 4, 330, 331, "failed", True, "The server is busy; try again in a moment."),
            ]
        )
    )
    assert summary["answers"] == 7 and summary["ok"] == 1 and summary["accounting_consistent"]
    assert summary["in_flight_at_kills"] == 1 and summary["lost_in_kill_windows"] == 2
    assert summary["lost_outside_kill_windows"] == 1
    assert summary["lost_outside_kill_windows_list"][0][2] == 300
    assert summary["failed_not_retryable"] == 1 and summary["restart_s"] == [60.0]


def test_rss_growth_is_judged_per_backend_so_a_switch_swing_is_not_growth_but_a_drift_is():
    switches = [{"at_s": t, "to": to, "ok": True} for t, to in ((350, "trt"), (450, "pytorch"), (550, "trt"))]
    flat = [(t, 1000.0 if 350 <= t < 450 or t >= 550 else 600.0, 7) for t in range(300, 600, 5)]
    drifting = [(t, v + t / 60, pid) for t, v, pid in flat]  # 1 MiB a minute on top of the swing
    still = account(run([], rss=flat, switches=switches, kills=()))["rss"]
    growing = account(run([], rss=drifting, switches=switches, kills=()))["rss"]
    assert still["growth_mib_per_min"] == 0 and still["plain_fit_mib_per_min"] > 10
    assert growing["growth_mib_per_min"] == 1.0
