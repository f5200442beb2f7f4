"""systemd's notify protocol: one datagram to ``$NOTIFY_SOCKET``, without a library.

Under ``Type=notify`` systemd holds the unit in "activating" until ``READY=1`` arrives,
so units ordered after the node (and ``systemctl start``) wait until it really serves;
``STOPPING=1`` says a stop has begun. Outside systemd ``NOTIFY_SOCKET`` is unset and
nothing is sent.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(*fields: str) -> bool:
    """Send ``fields`` (``"READY=1"``, ``"STATUS=..."``) as one message; True if sent.

    A failure is logged, never raised: the daemon serves whether or not systemd hears.
    """
    address = socket_address(os.environ.get("NOTIFY_SOCKET", ""))
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            # Non-blocking: a full receive queue must not stall the event loop.
            sock.setblocking(False)
            sock.sendto("\n".join(fields).encode(), address)
    except OSError as exc:
        log.warning("could not tell systemd %s: %s", fields[0], exc)
        return False
    return True


def socket_address(value: str) -> str | None:
    """The address to send to: a path, or ``@name`` in the abstract namespace (a leading
    NUL). None when unset or of a kind not handled (``vsock:``, only for VMs)."""
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    if value:
        log.warning("NOTIFY_SOCKET=%s: not a socket path, systemd will not hear", value)
    return None
