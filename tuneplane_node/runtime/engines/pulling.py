"""Pull machinery shared by every engine: read the progress stream on the pool, enforce
both deadlines, and stop at once when cancelled.

A thread blocked reading an HTTP stream cannot be interrupted; closing the socket under
it can. So a pull keeps its response where the watching coroutine can reach it, and a
cancel or a missed deadline shuts that socket down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import EngineRefused, RegistryRefused
from tuneplane_node.references import ImageName
from tuneplane_node.runtime.base import ProgressCallback, PullLimits
from tuneplane_node.runtime.engines import dockerformat as fmt
from tuneplane_node.runtime.engines.dockerformat import ProgressFold
from tuneplane_node.runtime.logstream import shut
from tuneplane_node.runtime.pool import BlockingPool
from tuneplane_node.wire.values import RegistryAuth

log = logging.getLogger(__name__)
WATCH_S = 0.25
"""How often the watching coroutine checks the deadlines."""
LATE_S = 0.5
"""A check this much later than due means the node did not run meanwhile."""

PullStream = tuple[Iterator[Mapping[str, Any]], Any]
"""A pull's decoded progress messages, and its HTTP response (which a cancel closes)."""
StreamOpener = Callable[[], PullStream]
"""Runs on a pool thread."""


def closed_after(response: Any, lines: Iterator[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
    """``lines``, then the response closed by the thread that read them, however the
    reading ends (`shut`)."""
    try:
        yield from lines
    finally:
        with contextlib.suppress(Exception):
            response.close()


class _PullRun:
    """State shared between the reading thread and the watching coroutine."""

    def __init__(self, clock: Clock) -> None:
        self.lock = threading.Lock()
        self.response: Any = None
        self.aborted = False
        self.fold = ProgressFold()
        self.clock = clock
        self.last_move = clock.monotonic()

    def attach(self, response: Any) -> bool:
        with self.lock:
            self.response = response
            aborted = self.aborted
        if aborted:
            shut(response)
        return not aborted

    def abort(self) -> None:
        with self.lock:
            self.aborted = True
            response = self.response
        if response is not None:
            shut(response)


async def drive_pull(
    pool: BlockingPool,
    *,
    engine: str,
    image: str,
    open_stream: StreamOpener,
    limits: PullLimits,
    on_progress: ProgressCallback | None,
    clock: Clock = SYSTEM_CLOCK,
    auth: RegistryAuth | None = None,
) -> None:
    """Read a pull's progress stream on the pool, enforcing both deadlines.

    Cancelling the awaiting task, or missing a deadline, closes the stream so the thread
    stops reading at once; the coroutine does not wait for the thread. ``auth``: the
    credentials the stream was opened with, which its refusal must never show.
    """
    run = _PullRun(clock)
    loop = asyncio.get_running_loop()

    def report() -> None:
        if on_progress is not None:
            on_progress(run.fold.progress())

    def read() -> None:
        messages, response = open_stream()
        try:
            if not run.attach(response):
                return
            for message in messages:
                if run.aborted:
                    return
                if message.get("error"):
                    raise EngineRefused(
                        engine=engine, action=f"pull {image}", reason=pull_error(message["error"])
                    )
                if run.fold.update(message):
                    run.last_move = clock.monotonic()
                    with contextlib.suppress(RuntimeError):  # the loop may be closing
                        loop.call_soon_threadsafe(report)
        finally:  # here, by the reading thread, once it has stopped (`shut`)
            with contextlib.suppress(Exception):
                response.close()

    future = asyncio.ensure_future(pool.call(read))
    try:
        await _watch(future, run, limits, engine=engine, image=image)
    except BaseException:
        run.abort()
        future.add_done_callback(_drain)
        raise
    try:
        future.result()
    except EngineRefused as exc:
        said = refusal_of_pull(exc, image=image, auth=auth)
        if said is exc:
            raise  # its cause chained, as every engine error
        raise said from None  # the engine's error may hold what was scrubbed
    report()


def pull_headers(image: str, auth: RegistryAuth | None) -> dict[str, str]:
    """The pull's own credentials, for this request only: nothing is written to the
    engine's or the host's credential stores."""
    if auth is None:
        return {}
    registry = ImageName.parse(image).registry
    return {"X-Registry-Auth": fmt.auth_header(auth, registry)}


def refusal_of_pull(exc: EngineRefused, *, image: str, auth: RegistryAuth | None) -> EngineRefused:
    """A pull's refusal as the node says it: `RegistryRefused` when the registry said
    no to the credentials, and never with a secret in it (the engines do not echo one;
    scrubbed all the same, as the cause is dropped)."""
    reason = exc.reason
    for secret in auth.secrets if auth is not None else ():
        reason = reason.replace(secret, "***")
    if fmt.PULL_DENIED.search(reason):
        return RegistryRefused(engine=exc.engine, image=image, reason=reason)
    if reason == exc.reason:
        return exc
    return EngineRefused(engine=exc.engine, action=exc.action, reason=reason)


def pull_error(error: object) -> str:
    """The engine's words, led by the cause an operator acts on when it is a full disk."""
    text = str(error)
    if "no space left on device" in text.lower():
        return f"the engine's disk is full: {text}"
    return text


async def _watch(
    future: asyncio.Future[None], run: _PullRun, limits: PullLimits, *, engine: str, image: str
) -> None:
    """Wait for the reading thread; raise when a deadline passes first.

    Time the node did not run (a SIGSTOP, a suspended machine: this coroutine woke
    late) is not a stall: the engine went on pulling, and what it said meanwhile waits
    unread in the socket. Until the reader has moved since, that time is excused."""
    wait = min(WATCH_S, limits.stall_s)
    started = tick = run.clock.monotonic()
    moved, excused = run.last_move, 0.0
    while True:
        done, _ = await asyncio.wait({future}, timeout=wait)
        if done:
            return
        now = run.clock.monotonic()
        if run.last_move != moved:
            moved, excused = run.last_move, 0.0
        if now - tick > wait + LATE_S:  # the whole of it: nobody watched
            excused += now - tick
        tick = now
        if now - started > limits.timeout_s:
            reason = f"not done after {limits.timeout_s:g} s"
        elif now - moved - excused > limits.stall_s:
            reason = f"no progress for {limits.stall_s:g} s"
        else:
            continue
        raise EngineRefused(engine=engine, action=f"pull {image}", reason=reason)


def _drain(future: asyncio.Future[Any]) -> None:
    """Swallow the error a deliberately aborted read ends with."""
    if not future.cancelled() and future.exception() is not None:
        log.debug("aborted pull stream ended with %r", future.exception())
