"""Exit statuses of app.py, in one place: the start script passes them on and the systemd unit's
RestartPreventExitStatus= lists the ones a restart cannot fix (`python -m serving.exit_codes no-restart`).
"""

from __future__ import annotations

import sys

OK = 0
STARTUP_FAILED = 1  # the model or the control channel could not start; a retry may work (Restart=on-failure)
BAD_CONFIGURATION = 2  # an invalid setting; restarting with the same settings fails the same way
PORT_IN_USE = 98  # Linux's EADDRINUSE: another listener holds HOST:PORT; checked before the model loads

NO_RESTART = (BAD_CONFIGURATION, PORT_IN_USE)


def main(argv: list[str]) -> int:
    if argv != ["no-restart"]:
        print("usage: python -m serving.exit_codes no-restart", file=sys.stderr)
        return 2
    print(" ".join(str(code) for code in NO_RESTART))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
