"""Run as its own process: join the Ray cluster at argv[1] and run one task there. Prints one line, "RAN <uid>" or
"REFUSED <exception> <first line>". What token it has (none, or the cluster's) is up to its environment."""

from __future__ import annotations

import os
import sys


def uid() -> int:
    return os.getuid()


def main() -> None:
    import ray

    try:
        ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
        print("RAN", ray.get(ray.remote(uid).remote(), timeout=120), flush=True)
    except Exception as exc:
        print("REFUSED", type(exc).__name__, str(exc).splitlines()[0][:300] if str(exc) else "", flush=True)


if __name__ == "__main__":
    main()
