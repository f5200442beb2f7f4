"""The engine's own hard locked-memory limit (``RLIMIT_MEMLOCK``), read at the node's start.

A job given RDMA devices gets ``TUNEPLANE_RDMA_MEMLOCK`` as its memlock; the OCI runtime
sets it from the engine's process, which may not raise a hard limit above its own: a
stock engine under systemd has 8 MiB unless its unit says ``LimitMEMLOCK=infinity``, and
every such launch then fails in runc's words (``error setting rlimit type 8``). The
engine's process is found by its socket's peer credentials (``SO_PEERCRED``: the process
that listens on it) and its limit read from ``/proc/<pid>/limits``. Unknown (an engine on
another machine, a socket systemd holds, a process the node may not read) is said, never
taken for a limit.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from tuneplane_node.settings import NodeSettings, unix_socket

PROC = Path("/proc")
LIMIT_LINE = "Max locked memory"
SOCKET_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class EngineMemlock:
    """The engine's hard memlock: ``known`` with ``hard`` in bytes (None: unlimited), or
    not known, ``source`` saying why; when known, ``source`` names the process read."""

    known: bool
    hard: int | None = None
    source: str = ""

    def refusal(self, wanted: int | None) -> str | None:
        """Why a job cannot get ``wanted`` bytes of memlock (None: unlimited) from this
        engine, naming the limit; None when it can, or the limit is unknown."""
        if not self.known or self.hard is None:
            return None
        if wanted is not None and wanted <= self.hard:
            return None
        asked = "unlimited" if wanted is None else f"{wanted} bytes"
        return f"its hard limit is {self.hard} bytes ({self.source}), below {asked}"


def read(settings: NodeSettings, engine: str) -> EngineMemlock:
    """The hard memlock of the engine the settings name. Blocking."""
    address = settings.engine_address(engine)
    if not address:
        return EngineMemlock(False, source=f"the {engine} runtime is no engine")
    return engine_memlock(address)


def engine_memlock(address: str) -> EngineMemlock:
    """The hard memlock of the process listening on the engine's socket. Blocking."""
    path = unix_socket(address)
    if path is None:
        return EngineMemlock(False, source=f"{address} is not a local socket")
    try:
        pid = listener_pid(path)
    except OSError as exc:
        return EngineMemlock(False, source=f"{path}: {exc.strerror or exc}")
    if pid <= 1:  # systemd holds a socket-activated engine's socket: not the engine's limit
        return EngineMemlock(False, source=f"{path} is held by systemd, not the engine")
    return process_memlock(pid)


def listener_pid(path: str) -> int:
    """The pid of the process that listens on the unix socket at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(SOCKET_TIMEOUT_S)
        sock.connect(path)
        credentials = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    pid, _, _ = struct.unpack("3i", credentials)
    return int(pid)


def process_memlock(pid: int, *, proc: Path = PROC) -> EngineMemlock:
    where = f"pid {pid}"
    try:
        text = (proc / str(pid) / "limits").read_text()
    except OSError as exc:
        return EngineMemlock(False, source=f"{where}: {exc.strerror or exc}")
    for line in text.splitlines():
        if line.startswith(LIMIT_LINE):
            fields = line[len(LIMIT_LINE) :].split()
            if len(fields) >= 2:
                hard = fields[1]
                if hard == "unlimited":
                    return EngineMemlock(True, None, where)
                if hard.isdigit():
                    return EngineMemlock(True, int(hard), where)
    return EngineMemlock(False, source=f"{where}: no {LIMIT_LINE!r} in its limits")
