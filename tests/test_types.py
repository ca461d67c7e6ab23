"""Type gate: mypy over the product packages, as pyproject.toml's [tool.mypy] configures it.

Strict on the packages that hold the contracts (inference_api, engine_bundle, xray_io), mypy's default checks on the
rest. mypy's incremental cache lives in .mypy_cache/ (git-ignored), so a second run only re-checks changed modules.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# Every product package and top-level script; devtools, benchmarks, deploy and tests are left out on purpose.
CHECKED_PATHS = (
    "app.py",
    "assistant",
    "batch_films.py",
    "benchmark.py",
    "demo_model",
    "engine_build",
    "engine_bundle",
    "film_check",
    "inference_api",
    "optimize_trt_engine.py",
    "phantoms",
    "pytorch_backend",
    "scaleout",
    "serving",
    "teaching",
    "teaching_ui.py",
    "trt_inference",
    "xray_io",
)


def test_every_checked_path_exists():
    missing = [path for path in CHECKED_PATHS if not (REPO_ROOT / path).exists()]
    assert not missing, f"tests/test_types.py names paths that are gone: {missing}; update CHECKED_PATHS"


def test_mypy_passes_on_the_product_packages():
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--hide-error-context", *CHECKED_PATHS],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert result.returncode == 0, (
        f"mypy found {len(errors)} error(s); fix the annotation or the code:\n"
        + "\n".join(errors[:200])
        + result.stderr[-2000:]
    )
