"""sd_notify without a dependency: one datagram to $NOTIFY_SOCKET, as systemd's Type=notify expects.

The protocol (sd_notify(3)): newline-separated KEY=VALUE assignments in one datagram to the Unix socket named by
NOTIFY_SOCKET; a name starting with "@" is in the abstract namespace. Outside systemd the variable is unset and
notify() does nothing.
"""

from __future__ import annotations

import logging
import os
import socket

logger = logging.getLogger(__name__)


def notify(*assignments: str) -> bool:
    """Send e.g. notify("READY=1", "STATUS=serving"). True if a datagram was sent; never raises."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as channel:
            channel.connect(address)
            channel.sendall("\n".join(assignments).encode())
    except OSError as exc:
        logger.warning("could not notify systemd at %s: %s", os.environ.get("NOTIFY_SOCKET"), exc)
        return False
    return True
