"""EngineRuntime: what the docker and podman runtimes share, whatever their SDK.

The async verbs, the pool, error translation at one seam and the pull's deadlines live
here; a subclass supplies the blocking SDK calls (``_create``, ``_inspect``, ...) and
its ``translate``. Nothing here imports an SDK.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from tuneplane_node.errors import NodeError, RuntimeConflict, RuntimeFailure, is_conflict
from tuneplane_node.runtime.base import (
    BlockingPool,
    ContainerSpec,
    ContainerState,
    ProgressCallback,
    RuntimeHealth,
    drive_pull,
    iso,
    parse_time,
)
from tuneplane_node.runtime.cache import Brief, EngineEvent
from tuneplane_node.settings import NodeSettings

log = logging.getLogger(__name__)
T = TypeVar("T")
Events = Iterator[EngineEvent]


def describe(exc: BaseException) -> str:
    """``Type: message``, even for SDK exceptions whose __str__ itself fails."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return type(exc).__name__


def refused(engine: str, *, action: str, status: int | None, reason: str) -> RuntimeFailure:
    """The error for an engine that answered no: a conflict (409) or a plain failure."""
    failure = RuntimeConflict if is_conflict(status, reason) else RuntimeFailure
    return failure(engine=engine, action=action, reason=reason)


def state_from_inspect(
    data: Mapping[str, Any], *, statuses: Mapping[str, str] | None = None
) -> ContainerState:
    """ContainerState from an inspect document (docker's and libpod's share the fields).

    ``statuses`` renames an engine's own words for docker's (libpod's "configured").
    """
    state = data.get("State") or {}
    raw = str(state.get("Status", "")).lower()
    status = (statuses or {}).get(raw, raw)
    config = data.get("Config") or {}
    return ContainerState(
        name=str(data.get("Name", "")).lstrip("/"),
        exists=True,
        status=status,
        # An exit code means something only once the process has exited.
        exit_code=int(state.get("ExitCode", 0)) if status in ("exited", "dead") else None,
        labels=dict(config.get("Labels") or {}),
        created_at=iso(parse_time(data.get("Created"))),
        started_at=iso(parse_time(state.get("StartedAt"))),
        finished_at=iso(parse_time(state.get("FinishedAt"))),
        oom_killed=bool(state.get("OOMKilled")),
        id=data.get("Id"),
    )


def pool_size(settings: NodeSettings) -> int:
    """HTTP connections the SDK keeps: one per pool thread, plus the state cache's event
    stream and the inspect its thread makes after each event."""
    return settings.runtime_threads + 2


class EngineRuntime(ABC):
    """A ContainerRuntime (and state-cache feed) over a synchronous engine SDK."""

    name: str

    def __init__(self, settings: NodeSettings, *, pool: BlockingPool | None = None) -> None:
        self.settings = settings
        self.pool = pool or BlockingPool(settings.runtime_threads, name=self.name)

    # --- what a subclass supplies: blocking SDK calls ----------------------------------

    @abstractmethod
    def translate(self, exc: BaseException, *, action: str) -> NodeError: ...
    @abstractmethod
    def _create(self, spec: ContainerSpec) -> Any:
        """Create (not start) the container; return the SDK's container object."""

    @abstractmethod
    def _inspect(self, ref: str) -> ContainerState: ...
    @abstractmethod
    def _logs(self, name: str, tail_lines: int) -> str: ...
    @abstractmethod
    def _stop(self, name: str, timeout: float) -> None: ...
    @abstractmethod
    def _remove(self, name: str) -> None: ...
    @abstractmethod
    def _list_brief(self) -> list[Brief]: ...
    @abstractmethod
    def _version(self) -> str: ...
    @abstractmethod
    def _image_exists(self, image: str) -> bool: ...
    @abstractmethod
    def _open_pull(self, image: str) -> tuple[Iterator[Mapping[str, Any]], Any]: ...
    @abstractmethod
    def _open_events(self) -> tuple[Events, Callable[[], None]]: ...
    @abstractmethod
    def _close_client(self) -> None: ...

    # --- the seam: every SDK call passes here ------------------------------------------

    async def _call(self, action: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self.pool.call(self._guarded, action, fn, *args, **kwargs)

    def _guarded(self, action: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise self.translate(exc, action=action) from exc

    def _translated(self, items: Iterator[T], *, action: str) -> Iterator[T]:
        """A stream whose SDK errors surface as the node's own."""
        try:
            yield from items
        except Exception as exc:
            raise self.translate(exc, action=action) from exc

    # --- the verbs ---------------------------------------------------------------------

    async def run(self, spec: ContainerSpec) -> str:
        return await self._call(f"run {spec.name}", self._run, spec)

    def _run(self, spec: ContainerSpec) -> str:
        container = self._create(spec)
        try:
            container.start()
        except Exception:
            # A created container carries GPU labels: left behind, it holds cards forever.
            self._remove(spec.name)
            raise
        return str(container.id)

    async def inspect(self, name: str) -> ContainerState:
        return await self._call(f"inspect {name}", self._inspect, name)

    async def logs(self, name: str, tail_lines: int) -> str:
        return await self._call(f"read the logs of {name}", self._logs, name, tail_lines)

    async def stop(self, name: str, timeout: float) -> None:
        await self._call(f"stop {name}", self._stop, name, timeout)

    async def remove(self, name: str) -> None:
        await self._call(f"remove {name}", self._remove, name)

    async def ps(self) -> list[ContainerState]:
        return await self._call("list containers", self._ps)

    def _ps(self) -> list[ContainerState]:
        states = (self._inspect(brief.id) for brief in self._list_brief())
        # A container removed between the list and its inspect is simply gone.
        return [state for state in states if state.exists]

    async def health(self) -> RuntimeHealth:
        try:
            version = await self._call("report its version", self._version)
        except NodeError as exc:
            return RuntimeHealth(ok=False, engine=self.name, error=exc.message)
        return RuntimeHealth(ok=True, engine=self.name, version=version)

    async def image_exists(self, image: str) -> bool:
        return await self._call(f"inspect image {image}", self._image_exists, image)

    async def pull(
        self,
        image: str,
        *,
        timeout: float,
        stall_timeout: float,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        """Stream the pull (deadlines and cancel in `drive_pull`); done = image present."""
        action = f"pull {image}"
        await drive_pull(
            self.pool,
            engine=self.name,
            image=image,
            open_stream=lambda: self._guarded(action, self._open_pull_translated, image),
            timeout=timeout,
            stall_timeout=stall_timeout,
            on_progress=on_progress,
        )
        if not await self.image_exists(image):
            raise RuntimeFailure(
                engine=self.name, action=action, reason="the stream ended without the image"
            )

    def _open_pull_translated(self, image: str) -> tuple[Iterator[Mapping[str, Any]], Any]:
        messages, response = self._open_pull(image)
        return self._translated(messages, action=f"pull {image}"), response

    async def close(self) -> None:
        self.pool.close()
        self._close_client()

    # --- the state cache's feed (blocking: called on the pool or the event thread) -----

    def list_brief(self) -> list[Brief]:
        return self._guarded("list containers", self._list_brief)

    def inspect_now(self, ref: str) -> ContainerState:
        return self._guarded(f"inspect {ref}", self._inspect, ref)

    def open_events(self) -> tuple[Events, Callable[[], None]]:
        events, close = self._guarded("stream events", self._open_events)
        return self._translated(events, action="stream events"), close
