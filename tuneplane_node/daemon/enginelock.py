"""One daemon per engine on this machine: a lock the kernel lets go of with its holder.

Two daemons on one engine each keep their own card claims in memory (both would hand
out the same card) and each sweeps the other's wreckage (one would remove the other's
container between its create and its start). So ``serve`` takes an exclusive
``flock(2)`` on a file named by the engine's address before it starts, and refuses to
start, naming the holder (its pid and node id, written in the file), while another live
daemon holds it. The kernel releases the lock when its holder's process ends however it
ends: a daemon killed with SIGKILL never holds the next start back.

The file is in `LOCK_DIR` (``/run/tuneplane-node``, the unit's ``RuntimeDirectory``),
or, where that cannot be written (not root), in ``$XDG_RUNTIME_DIR/tuneplane-node`` or
the temporary directory: every daemon of one user finds the same file. The address is
the engine's as the daemon reaches it, a unix socket by its real path (two spellings of
one socket are one engine). ``check``, ``inventory`` and ``ctl`` take no lock.
``TUNEPLANE_DEV_SHARED_ENGINE=true`` (development only: a test suite's daemons on one
engine) takes none either.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from tuneplane_node.settings import NodeSettings, unix_socket

log = logging.getLogger(__name__)
LOCK_DIR = Path("/run/tuneplane-node")


class EngineTaken(Exception):
    """Another live daemon of this machine manages the engine: this one does not start.
    Not a configuration error: the other may be on its way out (systemd restarts this)."""

    def __init__(self, *, address: str, holder: str, path: Path) -> None:
        super().__init__(
            f"another tuneplane-node daemon ({holder}) manages the engine at {address} "
            f"(lock {path}): stop it first; two daemons on one engine hand out the same cards"
        )
        self.address = address
        self.holder = holder


def engine_address(settings: NodeSettings, engine: str) -> str | None:
    """The engine's address as a lock key; None for the process runtime (no engine)."""
    address = settings.engine_address(engine)
    if not address:
        return None
    path = unix_socket(address)
    return address if path is None else "unix://" + os.path.realpath(path)


def lock_dir() -> Path:
    for directory in (LOCK_DIR, _user_dir()):
        try:
            directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(directory, os.W_OK):
            return directory
    raise OSError(f"no writable directory for the engine lock ({LOCK_DIR}, {_user_dir()})")


def _user_dir() -> Path:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "tuneplane-node"
    return Path(tempfile.gettempdir()) / f"tuneplane-node-{os.getuid()}"


class EngineLock:
    """Held from `take` until `release` or the process's end."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path

    @classmethod
    def take(
        cls, address: str, *, node_id: str | None, directory: Path | None = None
    ) -> EngineLock:
        """The lock of that engine, or EngineTaken naming its holder. OSError when no
        lock file can be made at all."""
        key = hashlib.sha256(address.encode()).hexdigest()[:16]
        path = (directory or lock_dir()) / f"engine-{key}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise EngineTaken(address=address, holder=holder, path=path) from None
        except OSError:
            os.close(fd)
            raise
        facts = {"pid": os.getpid(), "node_id": node_id, "engine": address}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(facts).encode() + b"\n", 0)
        log.info("engine lock %s taken for %s", path, address)
        return cls(fd, path)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # the kernel drops the lock with the last descriptor
            self.fd = -1


def _holder(fd: int) -> str:
    """``pid 1234, node id <uuid>`` from the holder's file; what is unreadable, unknown."""
    try:
        facts = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        facts = {}
    if not isinstance(facts, dict):
        facts = {}
    return f"pid {facts.get('pid', 'unknown')}, node id {facts.get('node_id') or 'unknown'}"
