"""The films of an input folder, and names for them that never come from their file names.

A film's id is an HMAC of its path relative to the input folder, keyed by a random secret kept in the output
folder (.film_key, 0600): stable across resumed runs, and not reversible by hashing guessed patient names.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

KEY_NAME = ".film_key"


class DamagedOutputError(ValueError):
    """The output folder's own files are damaged; the message says what to do."""


@dataclass(frozen=True)
class FilmFile:
    path: Path
    relative: str  # POSIX path under the input folder; goes to the user's own output only where asked
    film_id: str


def film_key(output_dir: Path) -> bytes:
    """The output folder's secret, created on first use (0600). Created whole or not at all: written to a temporary
    file, then hard-linked into place, which fails if another run made it first."""
    path = output_dir / KEY_NAME
    if not path.exists():
        temporary = output_dir / f"{KEY_NAME}.{secrets.token_hex(4)}.tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(secrets.token_bytes(32).hex() + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass
        finally:
            temporary.unlink()
    text = path.read_text().strip()
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != 32:
        raise DamagedOutputError(
            f"{path} is damaged; it names every film of this folder's results: restore it, or start a new --output"
        )
    return key


def film_id(key: bytes, relative: str) -> str:
    return hmac.new(key, relative.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()[:20]


def find_films(input_dir: Path, key: bytes, exclude: Path | None = None) -> list[FilmFile]:
    """Every regular file under input_dir (recursively, hidden files and folders skipped, and exclude: an output
    folder placed inside the input), in path order.

    Which of them are films is the loader's call (it reads content, not extensions): the rest get a recorded error.
    """
    films = []
    excluded = exclude.resolve() if exclude is not None else None
    for folder, subfolders, files in os.walk(input_dir):
        subfolders[:] = sorted(
            name
            for name in subfolders
            if not name.startswith(".") and (excluded is None or (Path(folder) / name).resolve() != excluded)
        )
        for name in sorted(files):
            path = Path(folder) / name
            if name.startswith(".") or not path.is_file():
                continue
            relative = path.relative_to(input_dir).as_posix()
            films.append(FilmFile(path, relative, film_id(key, relative)))
    films.sort(key=lambda film: film.relative)
    return films
