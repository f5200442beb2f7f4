"""Whether the node takes new jobs: ready, cordoned, draining or drained.

The operator's decision outlives the daemon: it is kept in ``<state dir>/node-state.json``,
written atomically (a temporary file, fsync, rename), so a daemon coming back never
undoes it. A file that cannot be read is not "ready": the node starts cordoned, saying
why. The file also keeps why the node stopped a container (a drain), by container id,
for observe to report after a restart. `NodeStateStore` holds the state in force.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuneplane_node.clock import Clock, rfc3339
from tuneplane_node.durable import write_atomically
from tuneplane_node.errors import NodeError, StateDiskFull
from tuneplane_node.jobs.words.status import NodeState
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.signals import job_signal
from tuneplane_node.wire.values import CORDONED, STATES

log = logging.getLogger(__name__)

STATE_FILE = "node-state.json"
MAX_REASON_CHARS = 1024
MAX_FILE_BYTES = 4 * 2**20  # reasons for every container a node can hold, and then some
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class NodeStateFile:
    """The node state on disk. Reads and writes are small: callers run them in a thread."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / STATE_FILE
        # A cancelled caller's thread still writes: the newest state wins, whatever the
        # order the threads get here in.
        self._lock = threading.Lock()
        self._written = 0

    def load(self, now: str) -> NodeState:
        """The saved state; none saved is ready; an unreadable file is cordoned."""
        try:
            with self.path.open("rb") as file:
                raw = file.read(MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return NodeState()
        except OSError as exc:
            return self._unreadable(f"cannot be read ({exc.strerror})", now)
        try:
            return _parse(raw)
        except (ValueError, TypeError, UnicodeDecodeError) as exc:
            return self._unreadable(f"is not a valid node state ({exc})", now)

    def _unreadable(self, why: str, now: str) -> NodeState:
        reason = f"{self.path} {why}; uncordon to take jobs again"
        log.error("node state: %s: starting cordoned", reason)
        return NodeState(state=CORDONED, reason=reason[:MAX_REASON_CHARS], since=now)

    def save(self, state: NodeState, sequence: int = 0) -> None:
        """Atomically: a crash leaves the old file or the new one, never half of one.
        ``sequence``: the order the states were decided in; an older one is not written."""
        with self._lock:
            if sequence and sequence < self._written:
                return
            self._write(state)
            self._written = sequence

    def _write(self, state: NodeState) -> None:
        write_atomically(self.path, json.dumps(_unparse(state), indent=1).encode())


class NodeStateStore:
    """The node state in force, kept on disk to outlive the daemon. Every change goes
    through `save`, and takes effect at once even when the disk refuses it."""

    def __init__(self, state_dir: Path, *, clock: Clock) -> None:
        self.file = NodeStateFile(state_dir)
        self.clock = clock
        self.node = NodeState()  # until load() reads the file
        self._saves = itertools.count(1)

    async def load(self) -> NodeState:
        self.node = await asyncio.to_thread(self.file.load, self.stamp())
        return self.node

    async def save(self, node: NodeState) -> None:
        """`NodeError` when the file could not be written: in force, but not for good
        (`StateDiskFull`, a 507, when its disk is full)."""
        self.node = node
        try:
            await asyncio.to_thread(self.file.save, node, next(self._saves))
        except OSError as exc:
            why = exc.strerror or str(exc)
            if exc.errno in NO_SPACE:
                raise StateDiskFull(state=node.state, path=str(self.file.path), reason=why) from exc
            raise NodeError(
                f"the node is {node.state} now, but {self.file.path} could not be "
                f"written ({why}): a restart would not keep it"
            ) from exc

    def stamp(self) -> str:
        """Now, as the state's ``since`` says it."""
        return rfc3339(self.clock.now())

    def stop_reason(self, state: ContainerState) -> str | None:
        """Why the node stopped that container itself (a drain); None if it did not."""
        return self.node.stop_reasons.get(state.handle) if state.exists else None

    async def forget(self, state: ContainerState) -> None:
        """Drop a removed container's stop reason: a runtime without ids keys it by name,
        which the next job of the name must not inherit."""
        if state.handle not in self.node.stop_reasons:
            return
        try:
            await self.save(self.node.forgetting(state.handle))
        except NodeError as exc:  # the container is gone all the same
            log.warning("%s", exc.message)


def _parse(raw: bytes) -> NodeState:
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
    data: Any = json.loads(raw)
    if not isinstance(data, dict) or data.get("state") not in STATES:
        raise ValueError(f"'state' must be one of {', '.join(STATES)}")
    reasons = data.get("stop_reasons") or {}
    if not isinstance(reasons, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in reasons.items()
    ):
        raise ValueError("'stop_reasons' must map container ids to reasons")
    used, deleted = _bytes_by_id(data, "disk_used"), _bytes_by_id(data, "disk_deleted_open")
    inodes = _bytes_by_id(data, "disk_inodes")
    warn_signal = job_signal(data.get("warn_signal")) if data.get("warn_signal") else None
    return NodeState(
        state=data["state"],
        reason=_optional_str(data.get("reason")),
        since=_optional_str(data.get("since")),
        grace_s=_optional_seconds(data.get("grace_s")),
        warn_signal=warn_signal,
        warn_s=_optional_seconds(data.get("warn_s")) if warn_signal else None,
        notice=_optional_str(data.get("notice")),
        stopping_as=_optional_str(data.get("stopping_as")),
        stop_reasons=reasons,
        disk_used=used,
        disk_deleted_open=deleted,
        disk_inodes=inodes,
    )


def _bytes_by_id(data: Mapping[str, Any], key: str) -> dict[str, int]:
    used = data.get(key) or {}
    if not isinstance(used, dict) or not all(
        isinstance(k, str) and type(v) is int for k, v in used.items()
    ):
        raise ValueError(f"'{key}' must map container ids to bytes")
    return used


def _optional_seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _optional_str(value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ValueError(f"expected a string, got {type(value).__name__}")
    return value


def _unparse(state: NodeState) -> dict[str, Any]:
    return {
        "state": state.state,
        "reason": state.reason,
        "since": state.since,
        "grace_s": state.grace_s,
        "warn_signal": state.warn_signal,
        "warn_s": state.warn_s,
        "notice": state.notice,
        "stopping_as": state.stopping_as,
        "stop_reasons": dict(state.stop_reasons),
        "disk_used": dict(state.disk_used),
        "disk_deleted_open": dict(state.disk_deleted_open),
        "disk_inodes": dict(state.disk_inodes),
    }
