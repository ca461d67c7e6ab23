"""LOG_DIR's own path, checked before the server writes anything under it (the control socket and token, the
upload cache), as scripts/lib.sh checks it before a start.

A symbolic link in the path, or a folder above it that others may write to, lets another user point LOG_DIR at a
folder of their choosing or swap it after the checks: a link planted in /tmp took the control socket, token, logs
and uploads with it. So no part of the path may be a symbolic link, and a folder above it that others may write to
must be sticky (as /tmp is: nobody may rename or delete what is not theirs) and belong to root or to this user.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from medgemma_xray.serving.settings import SettingsError


def check_log_dir_path(log_dir: Path) -> None:
    """Raises SettingsError naming the part of the path at fault and the fix."""
    given = Path(os.path.normpath(os.path.abspath(log_dir)))
    path = Path(given.anchor)
    for part in given.parts[1:]:
        path = path / part
        try:
            info = path.lstat()
        except FileNotFoundError:
            return  # created below an existing, checked folder
        if stat.S_ISLNK(info.st_mode):
            raise SettingsError(
                f"LOG_DIR {given}: {path} is a symbolic link. The server never follows one there (another user could "
                f"point it anywhere); set LOG_DIR to the real folder, {given.resolve()}, after checking it is yours."
            )
        if path == given:
            return
        if info.st_mode & 0o022:
            if not info.st_mode & stat.S_ISVTX:
                raise SettingsError(
                    f"LOG_DIR {given}: the folder {path} above it is writable by others "
                    f"(mode {stat.S_IMODE(info.st_mode):o}) and not sticky, so anyone may replace LOG_DIR there. "
                    f"Choose a LOG_DIR under a folder only you and root may write to (chmod go-w {path})."
                )
            if info.st_uid not in (0, os.geteuid()):
                raise SettingsError(
                    f"LOG_DIR {given}: the folder {path} above it is writable by others and belongs to another user "
                    f"(uid {info.st_uid}), who may replace LOG_DIR there. Choose a LOG_DIR elsewhere."
                )
