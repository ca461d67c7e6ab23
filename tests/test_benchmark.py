"""benchmark.py on the demo checkpoint, all three modes (the engine through ONNX Runtime), a few requests each:
it must write every figure the performance issue asks for, as JSON, a Markdown table and a PNG plot."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow


def test_benchmark_writes_every_figure_for_every_mode(tmp_path, int8_bundle, demo_model_dir):
    output = tmp_path / "bench"
    result = subprocess.run(
        [
            sys.executable,
            "benchmark.py",
            "--output",
            str(output),
            "--engine_path",
            str(int8_bundle),
            "--device",
            "cpu",
            "--requests",
            "2",
            "--answer-tokens",
            "6",
            "--concurrency",
            "1,2",
            "--answers-per-user",
            "1",
            "--eager-max-users",
            "2",
            "--turns",
            "2",
            "--turn-tokens",
            "4",
            "--films",
            "2",
            "--report-tokens",
            "4",
            "--report-users",
            "2",
            "--task-phantoms",
            "2",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    record = json.loads((output / "benchmark.json").read_text())
    assert {"date", "command", "machine", "model", "modes"} <= record.keys()
    assert set(record["modes"]) == {"pytorch-eager", "pytorch-fast", "trt"}
    for name, mode in record["modes"].items():
        assert "error" not in mode, (name, mode.get("error"))
        assert mode["startup"]["total_s"] > 0 and "peak_gpu_gib" in mode
        single = mode["single_stream"]
        for figure in ("ttft_ms", "decode_ms_per_token", "end_to_end_s"):
            assert {"mean", "p50", "p99", "p999"} <= single[figure].keys(), (name, figure)
            assert single[figure]["n"] == 2
        # At least one decode step after the first token (decode was measured) and never past the limit; the demo
        # model ends its answer to this question after 3 tokens, before the 6 allowed.
        assert 2 <= single["tokens_per_answer"]["min"] <= single["tokens_per_answer"]["max"] <= 6
        assert [level["users"] for level in mode["concurrency"]] == [1, 2]
        for level in mode["concurrency"]:
            assert level["failures"] == 0 and level["answers"] == level["users"]
            assert level["tokens_per_s"] > 0 and level["requests_per_s"] > 0
            assert {"p50", "p99"} <= level["ttft_ms"].keys() and "p50" in level["per_stream_ms_per_token"]
        reuse = {run["kv_reuse"]: run for run in mode["conversation"]}
        assert reuse[True]["follow_up_reused_tokens"][0] > 256 and reuse[False]["follow_up_reused_tokens"] == [0]
        batch = mode["film_batch"]
        assert batch["films"] == 2 and {"features_s", "reports_s", "end_to_end_s"} <= batch.keys()
        task = mode["task_accuracy"]
        assert task["phantoms"] == 2 and task["seeds"] == [900_000, 900_001] and task["ece"] is not None
        assert task["macro_f1"] >= 0.75, (name, task["per_finding"])  # the trained demo reads the film
    verdicts = {name: mode["task_accuracy"]["per_finding"] for name, mode in record["modes"].items()}
    assert verdicts["trt"] == verdicts["pytorch-eager"]  # INT8 gives PyTorch's answers on these phantoms
    table = (output / "benchmark.md").read_text()
    assert "| pytorch-fast |" in table and "| trt |" in table and "KV kept between turns" in table
    assert "| finding | support | F1 pytorch-eager | F1 pytorch-fast | F1 trt |" in table and "**macro-F1**" in table
    assert table in result.stdout  # the table is printed last
    assert (output / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
