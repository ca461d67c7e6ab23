"""The demo model's INT8 engine bundle for the soak's switches, built as the test suite's int8_bundle fixture
builds it (tests/conftest.py), when the soak is not given one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def build_bundle(workdir: Path) -> Path:
    from medgemma_xray.phantoms.films import write_phantom_set

    films = workdir / "calib"
    write_phantom_set(films, 12)
    bundle = workdir / "engines" / "demo-int8"
    args = ["--model_path", str(REPO_ROOT / "models" / "medgemma-demo"), "--calib_images", str(films)]
    args += ["--precision", "int8", "--output_path", str(bundle), "--target", "tensorrt-rtx", "--max_seq_len", "2048"]
    # The fixture's gate for the demo checkpoint's INT8 drift on long conversations (tests/conftest.py says why),
    # and no task-F1 gate: the soak measures serving, not accuracy.
    args += ["--min_long_token_agreement", "0.5", "--task_phantoms", "0"]
    args += ["--max_batch", "2", "--keep_fp32_onnx", "--allow_few_films"]
    done = subprocess.run(
        [sys.executable, "optimize_trt_engine.py", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800
    )
    (workdir / "build.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"building the demo bundle failed; see {workdir / 'build.log'}")
    return bundle
