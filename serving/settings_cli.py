"""Print one effective setting, so that shell scripts and the systemd installer read the same value as the server.

    python -m serving.settings_cli get drain_timeout_s [--env-file /etc/default/medgemma-xray]

The value comes from Settings.from_env exactly as app.py reads it (defaults, then the environment, then the
optional environment file, which wins like systemd's EnvironmentFile= over Environment=). Exit status 2 names
the bad setting.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from dataclasses import fields
from pathlib import Path

from serving.settings import Settings


def read_environment_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them: blank lines and # or ; comments skipped,
    values optionally quoted."""
    values: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, separator, raw = line.partition("=")
        if not separator or not key.strip().isidentifier():
            raise ValueError(f"{path}:{number}: expected KEY=VALUE")
        parts = shlex.split(raw, comments=False, posix=True) if raw.strip() else [""]
        values[key.strip()] = " ".join(parts)
    return values


def main(argv: list[str] | None = None) -> int:
    names = sorted(spec.name for spec in fields(Settings))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    get = commands.add_parser("get", help="print one setting's effective value")
    get.add_argument("name", choices=names, metavar="NAME", help=f"one of: {', '.join(names)}")
    get.add_argument("--env-file", type=Path, help="also apply this EnvironmentFile (it wins over the environment)")
    args = parser.parse_args(argv)

    environ = dict(os.environ)
    try:
        if args.env_file is not None and args.env_file.exists():
            environ.update(read_environment_file(args.env_file))
        settings = Settings.from_env(environ)
    except (OSError, ValueError) as exc:
        print(f"error: bad configuration: {exc}", file=sys.stderr)
        return 2
    value = getattr(settings, args.name)
    print("" if value is None else value)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
