"""The pending-pull table: launches whose image is not here yet.

A launch whose image is missing returns at once: its record reserves the cards, a
background task pulls (one pull per image, shared) and then starts the container. Only
these records live in memory; a daemon restarted mid-pull has none, and the console
resubmits. Every background task is held here (asyncio keeps only a weak reference)
and findable by ref, so a stop can cancel it at any moment and leave nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tuneplane_node.errors import Conflict, NodeError
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.runtime.base import ContainerRuntime, ContainerSpec, ContainerState
from tuneplane_node.settings import NodeSettings
from tuneplane_node.wire import LaunchRequest

log = logging.getLogger(__name__)
FAILED_RECORD_TTL_S = 1800.0


class RefLocks:
    """Per-ref control locks that vanish when nobody holds or waits for them.

    A daemon that handled a million launches must not keep a million locks.
    """

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, ref: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(ref, (asyncio.Lock(), 0))
        self._locks[ref] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[ref]
            if users == 1:
                del self._locks[ref]
            else:
                self._locks[ref] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)


@dataclass
class SharedPull:
    """One pull of one image, awaited by every launch that needs it."""

    image: str
    task: asyncio.Task[None] | None = None
    waiters: int = 0
    progress: tuple[int, int, int, int] = (0, 0, 0, 0)

    def update(self, *progress: int) -> None:
        self.progress = (progress[0], progress[1], progress[2], progress[3])


@dataclass
class PendingLaunch:
    request: LaunchRequest
    phase: str = "pulling"
    started: float = field(default_factory=time.monotonic)
    error: str | None = None
    failed_at: float | None = None
    pull: SharedPull | None = None
    task: asyncio.Task[None] | None = None

    @property
    def ref(self) -> str:
        return self.request.ref

    @property
    def image(self) -> str:
        return self.request.spec.image

    def fail(self, reason: str, *, at: float) -> None:
        self.phase, self.error, self.failed_at = "failed", reason, at

    def state_json(self, now: float) -> dict[str, Any]:
        """How observe shows it: created while pending, dead once failed."""
        done, total, layers_done, layers_total = self.pull.progress if self.pull else (0, 0, 0, 0)
        return {
            "name": self.ref,
            "exists": True,
            "status": "dead" if self.phase == "failed" else "created",
            "exit_code": None,
            "labels": dict(self.request.spec.labels),
            "created_at": None,
            "started_at": None,
            "finished_at": None,
            "oom_killed": False,
            "pending_phase": self.phase,
            "pending_image": self.image,
            "pending_elapsed_s": round((self.failed_at or now) - self.started, 3),
            "pending_gpus": self.request.requested_gpus,
            "pending_bytes_done": done,
            "pending_bytes_total": total,
            "pending_layers_done": layers_done,
            "pending_layers_total": layers_total,
            "pending_error": self.error,
        }


class Launches:
    """Launch, stop and remove under per-ref locks, with the pending-pull table."""

    def __init__(
        self,
        runtime: ContainerRuntime,
        allocator: GpuAllocator,
        settings: NodeSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.runtime = runtime
        self.allocator = allocator
        self.settings = settings
        self.clock = clock
        self.locks = RefLocks()
        self.records: dict[str, PendingLaunch] = {}
        self.pulls: dict[str, SharedPull] = {}

    # --- reading ------------------------------------------------------------------

    def pending(self, ref: str) -> PendingLaunch | None:
        """The record of one ref; an expired failed one is dropped on the way.

        Only this ref is checked: observe asks for hundreds of refs per call.
        """
        record = self.records.get(ref)
        if record is not None and self._expired(record, self.clock()):
            del self.records[ref]
            return None
        return record

    def summary(self) -> dict[str, dict[str, Any]]:
        self._prune()
        return {
            ref: {"image": record.image, "phase": record.phase, "error": record.error}
            for ref, record in self.records.items()
        }

    def _prune(self) -> None:
        """Drop failed records once the console has had FAILED_RECORD_TTL_S to read them."""
        now = self.clock()
        expired = [ref for ref, record in self.records.items() if self._expired(record, now)]
        for ref in expired:
            del self.records[ref]

    @staticmethod
    def _expired(record: PendingLaunch, now: float) -> bool:
        return record.failed_at is not None and now - record.failed_at > FAILED_RECORD_TTL_S

    # --- launch -------------------------------------------------------------------

    async def launch(self, request: LaunchRequest) -> dict[str, Any]:
        async with self.locks.hold(request.ref):
            self._prune()
            record = self.records.get(request.ref)
            if record is not None and record.phase != "failed":
                return {"phase": record.phase, "idempotent": True, "image": record.image}
            self.records.pop(request.ref, None)  # a failed record is replaced by the retry
            state = await self.runtime.inspect(request.ref)
            if state.exists:
                answer = await self._existing(request, state)
                if answer is not None:
                    return answer
            if await self.runtime.image_exists(request.spec.image):
                return await self._start_now(request)
            return await self._start_pending(request)

    async def _existing(
        self, request: LaunchRequest, state: ContainerState
    ) -> dict[str, Any] | None:
        if not state.run_id:
            raise Conflict(f"a container named {request.ref} exists and is not this node's")
        if state.live:
            return {"phase": "running", "idempotent": True, "gpus": list(state.gpus)}
        log.info("relaunch of %s: removing its exited container", request.ref)
        await self.runtime.remove(request.ref)
        return None

    async def _start_now(self, request: LaunchRequest) -> dict[str, Any]:
        cards, container_id = await self.allocator.allocate_and_run(
            request.run_id, request.requested_gpus, self._runner(request.spec)
        )
        return {"phase": "running", "container_id": container_id[:12], "gpus": cards}

    def _runner(self, spec: ContainerSpec) -> Callable[[list[int]], Any]:
        async def run(cards: list[int]) -> str:
            return await self.runtime.run(replace(spec, gpus=tuple(cards)))

        return run

    async def _start_pending(self, request: LaunchRequest) -> dict[str, Any]:
        await self.allocator.reserve(request.ref, request.requested_gpus)
        record = PendingLaunch(request, started=self.clock())
        self.records[request.ref] = record
        record.task = asyncio.create_task(self._complete(record), name=f"launch {request.ref}")
        log.info("launch %s: pulling %s in the background", request.ref, request.spec.image)
        return {
            "phase": "pulling",
            "image": request.spec.image,
            "requested_gpus": request.requested_gpus,
        }

    async def _complete(self, record: PendingLaunch) -> None:
        """Pull, then allocate and start; a failure leaves a failed record with the reason."""
        try:
            await self._pull(record)
            record.phase = "starting"
            await self._start_pulled(record)
            if self.records.get(record.ref) is record:
                del self.records[record.ref]
            log.info("launch %s: started after its pull", record.ref)
        except asyncio.CancelledError:
            raise
        except NodeError as exc:
            log.warning("launch %s failed: %s", record.ref, exc.message)
            record.fail(exc.message, at=self.clock())
        except Exception as exc:
            log.exception("launch %s failed on a bug", record.ref)
            record.fail(f"internal error: {type(exc).__name__}: {exc}", at=self.clock())
        finally:
            self.allocator.release(record.ref)

    async def _pull(self, record: PendingLaunch) -> None:
        pull = self.pulls.get(record.image)
        if pull is None:
            pull = SharedPull(record.image)
            pull.task = asyncio.create_task(self._pull_image(pull), name=f"pull {record.image}")
            self.pulls[record.image] = pull
        record.pull = pull
        pull.waiters += 1
        try:
            assert pull.task is not None
            await asyncio.shield(pull.task)
        finally:
            pull.waiters -= 1
            if pull.waiters == 0 and pull.task is not None and not pull.task.done():
                # Nobody wants the image any more: stop downloading it.
                self.pulls.pop(record.image, None)
                pull.task.cancel()

    async def _pull_image(self, pull: SharedPull) -> None:
        try:
            await self.runtime.pull(
                pull.image,
                timeout=self.settings.local_image_pull_timeout_s,
                stall_timeout=self.settings.local_image_pull_stall_s,
                on_progress=pull.update,
            )
        finally:
            if self.pulls.get(pull.image) is pull:
                del self.pulls[pull.image]

    async def _start_pulled(self, record: PendingLaunch) -> None:
        request = record.request
        start = asyncio.ensure_future(
            self.allocator.allocate_and_run(
                request.run_id,
                request.requested_gpus,
                self._runner(request.spec),
                reservation=request.ref,
            )
        )
        try:
            await asyncio.shield(start)
        except asyncio.CancelledError:
            # A stop landed while the engine was creating the container: let the engine
            # call finish, then tear down whatever it made.
            with contextlib.suppress(Exception):
                await start
            await self._teardown(record.ref)
            raise

    async def _teardown(self, ref: str) -> None:
        try:
            await self.runtime.remove(ref)
        except NodeError as exc:
            log.error("could not remove %s after its launch was cancelled: %s", ref, exc.message)

    # --- stop and remove ----------------------------------------------------------

    async def stop(self, ref: str, timeout: float | None) -> None:
        async with self.locks.hold(ref):
            await self._cancel(ref)
            if await self._ours(ref):
                await self.runtime.stop(ref, self._timeout(timeout))

    async def remove(self, ref: str) -> None:
        async with self.locks.hold(ref):
            await self._cancel(ref)
            if await self._ours(ref):
                await self.runtime.remove(ref)

    def _timeout(self, timeout: float | None) -> float:
        return self.settings.local_stop_timeout if timeout is None else timeout

    async def _cancel(self, ref: str) -> None:
        """End a pending launch at whatever stage, and release its reservation."""
        record = self.records.pop(ref, None)
        self.allocator.release(ref)
        if record is None or record.task is None or record.task.done():
            return
        record.task.cancel()
        await asyncio.wait({record.task})
        log.info("launch %s cancelled in phase %s", ref, record.phase)

    async def _ours(self, ref: str) -> bool:
        """Only containers carrying the node's run-id label may be touched."""
        state = await self.runtime.inspect(ref)
        if state.exists and not state.run_id:
            log.warning("refusing to touch %s: not a container of this node", ref)
            return False
        return state.exists

    async def close(self) -> None:
        """Cancel every background launch and pull (shutdown)."""
        tasks = [r.task for r in self.records.values() if r.task and not r.task.done()]
        tasks += [p.task for p in self.pulls.values() if p.task and not p.task.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self.records.clear()
        self.pulls.clear()
