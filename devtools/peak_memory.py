"""Peak memory of loading one film, read from a child process (tests and benchmarks/loader_peak_memory.py).

Pillow's and the codecs' buffers live outside Python's allocator, where tracemalloc cannot see them, so the
child reads its own peak RSS (VmHWM), reset just before the load. It runs under an address-space limit: a loader
that does decode a bomb fails there with MemoryError instead of taking the host's memory.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys
from medgemma_xray.xray_io import ImageInputError, load_radiograph

def rss(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field))

try:  # pay for imports and codec plugins first, on a small film of the same kind
    load_radiograph(open(sys.argv[2], "rb").read())
except ImageInputError:
    pass
data = open(sys.argv[1], "rb").read()
with open("/proc/self/clear_refs", "w") as refs:
    refs.write("5")  # resets the peak (VmHWM) to the current RSS
before = rss("VmRSS:")
try:
    film = load_radiograph(data)
    outcome = {"loaded": list(film.shape)}
except ImageInputError as exc:
    outcome = {"refused": type(exc).__name__, "message": str(exc)}
except Exception as exc:  # what escaped the loader's own errors: a server would answer "Internal error"
    outcome = {"escaped": type(exc).__name__, "message": str(exc)[:300]}
outcome["peak_bytes"] = rss("VmHWM:") - before
print(json.dumps(outcome))
"""


def peak_load_memory(
    film: bytes, warm_up: bytes, *, source_root: Path = REPO_ROOT, address_space_limit: int = 3 << 30
) -> dict:
    """{"loaded": [rows, cols]}, {"refused": error class, "message": ...} (the package's own error) or
    {"escaped": exception class, ...} (anything else, MemoryError included), plus "peak_bytes": the peak RSS above
    what the child held with the file's bytes already in memory."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space_limit, address_space_limit))

    with tempfile.TemporaryDirectory() as folder:
        film_path, warm_path = Path(folder) / "film", Path(folder) / "warm"
        film_path.write_bytes(film)
        warm_path.write_bytes(warm_up)
        result = subprocess.run(
            [sys.executable, "-c", CHILD, str(film_path), str(warm_path)],
            cwd=source_root,
            capture_output=True,
            text=True,
            timeout=600,
            preexec_fn=limit,
            env={"PYTHONPATH": str(source_root), "OPENBLAS_NUM_THREADS": "1"},
        )
    if result.returncode != 0:
        raise RuntimeError(f"the loading child failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])
