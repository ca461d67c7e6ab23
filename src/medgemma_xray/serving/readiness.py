"""Ask /readyz whether *this start's* server is ready: the answer must carry the instance id the start script gave
it, so a different server answering on the same address never counts as ours.

    python -m medgemma_xray.serving.readiness --url http://127.0.0.1:7860 --instance ID
Exit status: 0 ready and ours; 1 not ready yet or nothing answers; 2 a different server answered (printed).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request

READY, NOT_YET, SOMEONE_ELSE = 0, 1, 2


def probe(url: str, instance: str, timeout_s: float = 2.0) -> tuple[int, str]:
    """(status, reason): one GET of url/readyz, checked against the expected instance id."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=timeout_s) as reply:
            body = reply.read(4096)
    except urllib.error.HTTPError as exc:  # 503 while warming up or draining: still check whose it is
        body = exc.read(4096)
    except (OSError, ValueError) as exc:
        return NOT_YET, f"no answer ({exc})"
    try:
        answer = json.loads(body)
        answered_by = str(answer.get("instance", ""))
        ready = answer.get("ready") is True
    except (ValueError, AttributeError):
        return SOMEONE_ELSE, "a server that is not this app answers /readyz"
    if answered_by != instance:
        return SOMEONE_ELSE, f"another server (instance {answered_by or 'unknown'}) answers on this address"
    return (READY, "ready") if ready else (NOT_YET, "warming up")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--instance", required=True)
    args = parser.parse_args(argv)
    status, reason = probe(args.url.rstrip("/"), args.instance)
    if status == SOMEONE_ELSE:
        print(reason)
    return status


if __name__ == "__main__":
    sys.exit(main())
