"""The container's entry point, also runnable in a plain venv (that is how CI tests it where Docker cannot run):

    python -m medgemma_xray.cli.container serve [app.py's arguments]   # check, then run the server (the image's CMD)
    python -m medgemma_xray.cli.container check                         # settings and any engine bundle; exit 2 if unusable
    python -m medgemma_xray.cli.container healthcheck                   # the image's HEALTHCHECK: GET /readyz on this host

A bundle baked into the image (/opt/medgemma/engine, the ENGINE_BUNDLE build argument) is used when ENGINE_PATH
is unset. Its manifest, accuracy gate and file hashes are verified before the model loads, so a damaged or edited
bundle stops the container at once with exit status 2 ("configuration error: do not restart") and a message that
names the fix, instead of failing later on the first question.
"""

from __future__ import annotations

import logging
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path

logger = logging.getLogger("medgemma_xray.cli.container")

BAKED_ENGINE = Path(os.environ.get("BAKED_ENGINE_DIR", "/opt/medgemma/engine"))


def engine_path() -> Path | None:
    """ENGINE_PATH if set, else the baked bundle if the image has one."""
    configured = os.environ.get("ENGINE_PATH")
    if configured:
        return Path(configured)
    if (BAKED_ENGINE / "manifest.json").is_file():
        return BAKED_ENGINE
    return None


def check() -> int:
    """0 when the settings and the engine bundle (if any) can serve; 2 with the reason otherwise."""
    from medgemma_xray.engine_bundle.integrity import verify_bundle
    from medgemma_xray.engine_bundle.manifest import ManifestError, read_manifest
    from medgemma_xray.serving.exit_codes import BAD_CONFIGURATION
    from medgemma_xray.serving.settings import Settings, SettingsError

    bundle = engine_path()
    try:
        settings = Settings.from_env(engine_path=str(bundle) if bundle else None)
        if bundle is not None:
            report = verify_bundle(bundle, read_manifest(bundle))
            logger.info("engine bundle verified: %d files, %.1f MB", report.files, report.bytes / 1e6)
    except (SettingsError, ManifestError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return BAD_CONFIGURATION
    if bundle is not None:
        os.environ["ENGINE_PATH"] = str(bundle)
    logger.info("configuration usable (mode %s, model %s)", settings.inference_mode, settings.resolved_model_path)
    return 0


def healthcheck(timeout_s: float = 4.0) -> int:
    """0 when this host's server says ready; 1 otherwise (starting, draining, or not answering)."""
    port = os.environ.get("PORT", "7860")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=timeout_s) as reply:
            return 0 if reply.status == 200 else 1
    except (urllib.error.URLError, OSError):
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv else "serve"
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if command == "healthcheck":
        return healthcheck()
    if command == "check":
        return check()
    if command != "serve":
        print(f"error: unknown command {command!r}; use serve, check or healthcheck", file=sys.stderr)
        return 2
    status = check()
    if status != 0:
        return status
    from medgemma_xray.web.app import main as serve

    return serve(argv)


if __name__ == "__main__":
    raise SystemExit(main())
