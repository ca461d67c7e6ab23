"""Atomic bundle builds: everything is written into a staging folder beside the output and moved into place only
once verification passed. An existing bundle is swapped in one renameat2(RENAME_EXCHANGE) call, so a reader sees
the old bundle or the new one, never a mix, and a failed build leaves the old one byte for byte as it was.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

FILE_MODE = 0o644
FOLDER_MODE = 0o755
_AT_FDCWD = -100
_RENAME_EXCHANGE = 1 << 1  # linux/fs.h


class OutputExistsError(FileExistsError):
    """The output folder exists and --overwrite was not given."""


def refuse_existing_output(output: Path, overwrite: bool) -> None:
    """Before any work: an existing output is replaced only when asked to."""
    output = Path(output)
    if output.exists() and not overwrite:
        raise OutputExistsError(
            f"{output} already exists. Pass --overwrite to replace it (atomically, only once the new bundle passed "
            "verification), or choose another --output_path."
        )
    if output.exists() and not output.is_dir():
        raise OutputExistsError(f"{output} exists and is not a folder; choose another --output_path")


def make_staging_dir(output: Path) -> Path:
    """A fresh hidden folder beside output (same filesystem, so the final rename is atomic), named with this
    process's id so that a later build can tell an abandoned one (its builder killed) from one still being built."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(output)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.staging-{os.getpid()}-", dir=output.parent))
    staging.chmod(FOLDER_MODE)  # mkdtemp's 0700 would hide the bundle from a service running as another user
    return staging


_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?:staging|previous)-(?P<pid>\d+)(?:-.*)?$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_abandoned(output: Path) -> list[Path]:
    """Remove the staging (and half-swapped previous) folders of builds of `output` whose process no longer runs:
    a build killed by SIGKILL, a power cut, or an older version's SIGTERM. Returns what was removed."""
    output = Path(output)
    removed = []
    for candidate in sorted(output.parent.glob(f".{output.name}.*")):
        found = _LEFTOVER.match(candidate.name)
        if not candidate.is_dir() or found is None or found["name"] != output.name:
            continue
        pid = int(found["pid"])
        if pid == os.getpid() or _alive(pid):
            continue
        discard(candidate)
        removed.append(candidate)
        logger.warning("removed %s, left by a build (process %d) that no longer runs", candidate, pid)
    return removed


def publish_modes(folder: Path) -> None:
    """One mode for everything a bundle publishes (files FILE_MODE, folders FOLDER_MODE), whatever the builder's
    umask or the writer (TensorRT plans come from mkstemp, 0600): the service may run as another user."""
    folder = Path(folder)
    folder.chmod(FOLDER_MODE)
    for path in folder.rglob("*"):
        if path.is_symlink():
            continue
        path.chmod(FOLDER_MODE if path.is_dir() else FILE_MODE)


def discard(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically (Linux renameat2). False where the kernel or filesystem cannot."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    if result == 0:
        return True
    error = ctypes.get_errno()
    logger.warning("renameat2(RENAME_EXCHANGE) failed (%s); replacing %s with two renames", os.strerror(error), second)
    return False


def publish(staging: Path, output: Path, overwrite: bool) -> None:
    """Move a verified staging folder to output; an existing output (only with overwrite) is swapped out whole.
    Every file is published FILE_MODE and every folder FOLDER_MODE first."""
    staging, output = Path(staging), Path(output)
    publish_modes(staging)
    if not output.exists():
        os.rename(staging, output)
        return
    refuse_existing_output(output, overwrite)
    if _exchange(staging, output):
        discard(staging)  # now holds the previous bundle
        return
    previous = output.with_name(f".{output.name}.previous-{os.getpid()}")
    os.rename(output, previous)
    os.rename(staging, output)
    discard(previous)


def write_bytes_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file, then rename over path: never truncates a file that another name links to."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def clone_bundle(source: Path, staging: Path) -> None:
    """Fill staging with source's files as hard links (copies across filesystems). Writers replace, never edit."""
    source, staging = Path(source), Path(staging)
    for path in sorted(source.rglob("*")):
        target = staging / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except OSError:
            shutil.copy2(path, target)
