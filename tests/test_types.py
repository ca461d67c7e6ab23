"""Type gate: mypy over the product packages, as pyproject.toml's [tool.mypy] configures it.

Strict on the packages that hold the contracts (inference_api, engine_bundle, xray_io), mypy's default checks on the
rest. mypy's incremental cache lives in .mypy_cache/ (git-ignored), so a second run only re-checks changed modules.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

# The product namespace and the launcher files; devtools, benchmarks (but for benchmark.py) and tests are left out.
CHECKED_PATHS = (
    "src/medgemma_xray",
    "app.py",
    "batch_films.py",
    "benchmark.py",
    "optimize_trt_engine.py",
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
