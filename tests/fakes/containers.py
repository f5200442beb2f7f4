"""A container of the fake engine, what its list says of one, and one open event stream."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

from tuneplane_node.runtime.base import EXIT_SIGKILL, Brief, ContainerState, EngineEvent
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.signals import JOB_SIGNALS


@dataclass
class FakeContainer:
    id: str
    spec: ContainerSpec
    labels: dict[str, str]
    created_at: str
    status: str = "created"
    exit_code: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    oom_killed: bool = False
    ignores_sigterm: bool = False
    sigterm_exit_code: int = 143  # what its own handler exits with; 128 + 15 without one
    # Its handlers of the other signals: the exit code it ends with, or None (it traps
    # the signal and runs on). Unhandled, a signal ends it with 128 + its number, as the
    # kernel's default does (SIGWINCH's default is to ignore it).
    handlers: dict[str, int | None] = field(default_factory=dict)
    image_stop_signal: str | None = None  # its image's STOPSIGNAL
    image_id: str | None = None  # the id its image had when it was made
    output: list[str] = field(default_factory=list)

    def state(self) -> ContainerState:
        return ContainerState(
            name=self.spec.name,
            exists=True,
            status=self.status,
            exit_code=self.exit_code,
            labels=dict(self.labels),
            created_at=self.created_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            oom_killed=self.oom_killed,
            id=self.id,
            stop_signal=self.spec.stop_signal or self.image_stop_signal or "SIGTERM",
            image_id=self.image_id,
            read_only_root=bool(self.spec.read_only_root),
        )

    def exit_on(self, signal: str) -> int | None:
        """The exit code this signal ends it with; None: it runs on."""
        if signal == "SIGKILL":
            return EXIT_SIGKILL
        if signal in self.handlers:
            return self.handlers[signal]
        if signal == "SIGTERM":
            return None if self.ignores_sigterm else self.sigterm_exit_code
        return None if signal == "SIGWINCH" else 128 + JOB_SIGNALS[signal]


class EventStream:
    """One open event stream: what the engine sent on it, and how much its reader took."""

    def __init__(self) -> None:
        self._queue: queue.Queue[EngineEvent | None] = queue.Queue()
        self.sent = 0
        self.taken = 0  # written by the reader's thread
        self.closed = False

    def send(self, event: EngineEvent) -> None:
        self.sent += 1
        self._queue.put(event)

    def get(self) -> EngineEvent | None:
        return self._queue.get()

    def close(self) -> None:
        """From any thread: the reader's iterator ends after what was sent before."""
        self.closed = True
        self._queue.put(None)

    def behind(self) -> bool:
        return not self.closed and self.taken < self.sent


def brief(state: ContainerState) -> Brief:
    """What an engine's list says of a container."""
    signature = (state.status, state.exit_code)
    return Brief(
        state.id or "", state.name, signature, state.labels, state.created_at, state.image_id
    )
