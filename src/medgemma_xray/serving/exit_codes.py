"""Exit statuses of app.py, in one place: the start script passes them on and the systemd unit's
RestartPreventExitStatus= lists the ones a restart cannot fix (`python -m medgemma_xray.serving.exit_codes no-restart`).
"""

from __future__ import annotations

import sys

OK = 0
STARTUP_FAILED = 1  # the model or the control channel could not start; a retry may work (Restart=on-failure)
# An invalid setting, or what the settings point at cannot serve: a missing or foreign model, an engine bundle that
# is corrupt, unverified, of another checkpoint or for another GPU. Restarting with the same settings fails the
# same way, so systemd must stop (RestartPreventExitStatus).
BAD_CONFIGURATION = 2
PORT_IN_USE = 98  # Linux's EADDRINUSE: another listener holds HOST:PORT; checked before the model loads

NO_RESTART = (BAD_CONFIGURATION, PORT_IN_USE)


def startup_exit_code(exc: BaseException) -> int:
    """BAD_CONFIGURATION when start-up failed on something a restart cannot fix (the error or any error it was
    raised from); STARTUP_FAILED otherwise (out of memory, a driver hiccup: a retry may work)."""
    from medgemma_xray.engine_bundle.manifest import ManifestError
    from medgemma_xray.pytorch_backend.checkpoint import CheckpointError

    configuration = (ManifestError, CheckpointError, FileNotFoundError, NotADirectoryError)
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        if isinstance(error, configuration):
            return BAD_CONFIGURATION
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return STARTUP_FAILED


def main(argv: list[str]) -> int:
    if argv != ["no-restart"]:
        print("usage: python -m medgemma_xray.serving.exit_codes no-restart", file=sys.stderr)
        return 2
    print(" ".join(str(code) for code in NO_RESTART))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
