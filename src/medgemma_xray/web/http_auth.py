"""Optional login for the UI: Gradio's own auth, checking names and passwords against a 0600 credentials file.

Off unless AUTH_FILE is set. The file holds one "name:scrypt$n$r$p$salt$hash" line per user, never a password:
  python -m medgemma_xray.web.http_auth add --file /etc/medgemma/credentials --user teacher     (asks for the password)
The probes (/healthz, /readyz) and /metrics stay open, for the service manager and Prometheus.
"""

from __future__ import annotations

import argparse
import base64
import getpass
import hashlib
import hmac
import os
import secrets
import stat
import sys
from collections.abc import Callable
from pathlib import Path

SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 14, 8, 1


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    encode = base64.b64encode
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${encode(salt).decode()}${encode(digest).decode()}"


def _verify(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        actual = hashlib.scrypt(
            password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p), dklen=len(expected)
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


def read_credentials(path: Path) -> dict[str, str]:
    """name -> stored hash. Refuses a file that others can read or write, or that holds no user."""
    path = Path(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ValueError(
            f"AUTH_FILE {path} does not exist; create it with python -m medgemma_xray.web.http_auth add"
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"AUTH_FILE {path} is not a regular file")
    if info.st_mode & 0o077:
        raise ValueError(
            f"AUTH_FILE {path} has mode {stat.S_IMODE(info.st_mode):04o}; others must not read it: chmod 600 {path}"
        )
    users: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, separator, stored = line.partition(":")
        if not separator or not name or not stored.startswith("scrypt$"):
            raise ValueError(f"AUTH_FILE {path} line {number} is not 'name:scrypt$...'")
        users[name] = stored
    if not users:
        raise ValueError(f"AUTH_FILE {path} names no user; add one with python -m medgemma_xray.web.http_auth add")
    return users


def authenticator(path: Path) -> Callable[[str, str], bool]:
    """Gradio's auth callable. The file is read once, at start; restart the server after changing it."""
    users = read_credentials(path)
    unknown = hash_password(secrets.token_hex(8))  # an unknown name costs the same time as a wrong password

    def check(name: str, password: str) -> bool:
        stored = users.get(name)
        return _verify(password, stored or unknown) and stored is not None

    return check


def add_user(path: Path, name: str, password: str) -> None:
    """Add or replace one user, keeping the file 0600 (created so, never widened)."""
    if not name or ":" in name or name != name.strip():
        raise ValueError("a user name must be non-empty, without ':' or surrounding spaces")
    if len(password) < 8:
        raise ValueError("choose a password of at least 8 characters")
    path = Path(path)
    lines = []
    if path.exists():
        read_credentials(path)  # refuses a file with loose permissions before writing to it
        lines = [line for line in path.read_text().splitlines() if line.partition(":")[0] != name]
    lines.append(f"{name}:{hash_password(password)}")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Manage the UI's login file (AUTH_FILE)")
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", help="add or replace a user; the password is read from the terminal or stdin")
    add.add_argument("--file", type=Path, required=True)
    add.add_argument("--user", required=True)
    args = parser.parse_args(argv)
    password = (
        getpass.getpass(f"password for {args.user}: ") if sys.stdin.isatty() else sys.stdin.readline().rstrip("\n")
    )
    try:
        add_user(args.file, args.user, password)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{args.user} can now log in (file {args.file}, mode 0600); restart the server to apply")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
