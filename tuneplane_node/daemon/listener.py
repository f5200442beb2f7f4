"""The node's own listening sockets, had before anything else starts.

A job is a customer's code, often on the host network. Whatever the node leaves free a
job may take: a family the node does not listen on (a job on ``[::]:8470`` answers every
IPv6 request, tokens included), or the whole port while the node starts. So a wildcard
host (``0.0.0.0``, ``::``) is both families, on two sockets (``::`` with ``IPV6_V6ONLY``),
and the sockets are bound and listening before the app's start-up; connections made
meanwhile wait in the backlog. Under systemd socket activation (``LISTEN_FDS``) the
sockets systemd holds across restarts are served instead, and nothing is bound.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
WILDCARDS = frozenset({"0.0.0.0", "::", ""})
"""Hosts that mean every address: served on IPv4 and IPv6 both."""
NO_IPV6 = frozenset({errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL})
"""Errors of the IPv6 wildcard that mean the machine has no IPv6, not a taken port."""
LISTEN_FDS_START = 3  # sd_listen_fds(3): systemd's sockets are fds 3, 4, ...
Address = tuple[socket.AddressFamily, tuple[Any, ...]]  # a family, its sockaddr


class CannotListen(Exception):
    """The node cannot have an address: taken, not this machine's, not allowed.

    Not a configuration error: a taken port may free up, so systemd restarts the node.
    """

    def __init__(self, address: str, error: OSError) -> None:
        self.address = address
        self.reason = error.strerror or str(error)
        super().__init__(f"cannot listen on {address}: {error}")


PROC = Path("/proc")
LISTEN = "0A"  # a socket's state in /proc/net/tcp: listening


def listen(host: str, port: int, *, backlog: int) -> tuple[list[socket.socket], bool]:
    """The sockets to serve, and whether systemd holds them across the node's restarts:
    systemd's when it passed some to this process, else bound here (see `bind`). Raises
    CannotListen."""
    sockets = inherited()
    if not sockets:
        return bind(host, port, backlog=backlog), False
    named = ", ".join(describe(sock) for sock in sockets)
    log.info("serving the sockets systemd passed (LISTEN_FDS): %s; host and port unused", named)
    return sockets, True


def bind(host: str, port: int, *, backlog: int) -> list[socket.socket]:
    """Bound and listening: both families for a wildcard host (IPv4 only on a machine
    without IPv6), else each address ``host`` resolves to. All or none: on a failure
    those already bound are closed and CannotListen raised."""
    sockets: list[socket.socket] = []
    try:
        for family, address in addresses(host, port):
            optional = host in WILDCARDS and family == socket.AF_INET6
            sock = _bound(family, address, backlog=backlog, optional=optional)
            if sock is not None:
                sockets.append(sock)
    except CannotListen:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def addresses(host: str, port: int) -> list[Address]:
    if host in WILDCARDS:
        wildcards: list[Address] = [(socket.AF_INET, ("0.0.0.0", port))]
        if socket.has_ipv6:
            return [*wildcards, (socket.AF_INET6, ("::", port, 0, 0))]
        log.warning("no IPv6 in this Python: listening on IPv4 only")
        return wildcards
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CannotListen(f"{host}:{port}", exc) from None
    unique: dict[tuple[Any, ...], Address] = {}
    for family, _, _, _, address in found:
        if family in (socket.AF_INET, socket.AF_INET6):
            unique.setdefault(address, (family, address))
    return list(unique.values())


def _bound(
    family: socket.AddressFamily, address: tuple[Any, ...], *, backlog: int, optional: bool
) -> socket.socket | None:
    """One listening socket; None when ``optional`` (the IPv6 wildcard) and the machine
    has no IPv6."""
    named = display(family, address)
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        _unless_no_ipv6(named, exc, optional=optional)
        return None
    try:
        # As asyncio binds: a restart need not wait out its old connections' TIME_WAIT.
        # Never SO_REUSEPORT: that would let a job of the same user share the port.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # IPv4 has a socket of its own (asyncio's rule too)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        # At once: a bound socket not yet listening lets a job's SO_REUSEADDR bind share it.
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        _unless_no_ipv6(named, exc, optional=optional)
        return None
    return sock


def _unless_no_ipv6(named: str, exc: OSError, *, optional: bool) -> None:
    """Raises CannotListen, unless ``optional`` and the error says there is no IPv6."""
    if not (optional and exc.errno in NO_IPV6):
        raise CannotListen(named, exc) from None
    log.warning("no IPv6 on this machine (%s: %s): listening on IPv4 only", named, exc.strerror)


# --- systemd socket activation --------------------------------------------------------


def inherited() -> list[socket.socket]:
    """The listening sockets systemd passed to this process, as sd_listen_fds(3) finds
    them: ``LISTEN_PID`` is ours, fds 3 to 3 + ``LISTEN_FDS`` - 1. The variables are
    unset, so that no child takes them for its own. Raises CannotListen on an fd that
    is not a listening stream socket."""
    count = os.environ.pop("LISTEN_FDS", "")
    pid = os.environ.pop("LISTEN_PID", "")
    os.environ.pop("LISTEN_FDNAMES", None)
    if not count or pid != str(os.getpid()):
        return []
    if not count.isdigit():
        raise CannotListen("LISTEN_FDS", OSError(errno.EINVAL, f"not a count: {count!r}"))
    return [_taken(fd) for fd in range(LISTEN_FDS_START, LISTEN_FDS_START + int(count))]


def _taken(fd: int) -> socket.socket:
    named = f"fd {fd} from systemd"
    try:
        sock = socket.socket(fileno=fd)  # the family and type are read from the fd
    except OSError as exc:
        raise CannotListen(named, exc) from None
    listening = sock.type == socket.SOCK_STREAM and sock.getsockopt(
        socket.SOL_SOCKET, socket.SO_ACCEPTCONN
    )
    if not listening:
        sock.close()
        error = OSError(errno.ENOTSOCK, "not a listening stream socket")
        raise CannotListen(named, error)
    sock.set_inheritable(False)  # systemd passes it inheritable: no job process gets it
    return sock


# --- names ------------------------------------------------------------------------------


def describe(sock: socket.socket) -> str:
    """``0.0.0.0:8470``, ``[::]:8470``, ``[::]:8470 (IPv4 too)`` for a dual-stack socket
    (systemd's ``BindIPv6Only=both``), or a Unix socket's path."""
    named = display(sock.family, sock.getsockname())
    dual = sock.family == socket.AF_INET6 and not sock.getsockopt(
        socket.IPPROTO_IPV6, socket.IPV6_V6ONLY
    )
    return named + " (IPv4 too)" if dual else named


def display(family: int, address: object) -> str:
    if family == socket.AF_INET6 and isinstance(address, tuple):
        return f"[{address[0]}]:{address[1]}"
    if family == socket.AF_INET and isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return str(address)


def port_holders(port: int, *, proc: Path = PROC) -> list[int]:
    """The processes holding a listening TCP socket on ``port`` (IPv4 or IPv6), from
    ``/proc/net/tcp*`` and each process's descriptors; those this user may not read are
    left out (root reads all)."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if (
                len(fields) > 9
                and fields[3] == LISTEN
                and int(fields[1].rsplit(":", 1)[1], 16) == port
            ):
                inodes.add(f"socket:[{fields[9]}]")
    return sorted(pid for pid in _pids(proc) if inodes & _descriptors(proc / str(pid)))


def _pids(proc: Path) -> list[int]:
    return [int(entry.name) for entry in proc.iterdir() if entry.name.isdigit()]


def _descriptors(process: Path) -> set[str]:
    try:
        return {os.readlink(fd) for fd in (process / "fd").iterdir()}
    except OSError:  # gone, or not ours to read
        return set()
