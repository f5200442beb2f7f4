"""The pull's deadlines and cancel, over a scripted progress stream (no engine).

A stream here is an iterator on the pool's thread and a "response" whose socket's
shutdown ends it, as it ends a real one; the reading thread closes the response after,
which gives its connection back (never the watcher: the connection would go back to the
pool while the reading thread still used it).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.waiting import wait_until
from tuneplane_node.errors import EngineRefused
from tuneplane_node.runtime.base import PullLimits, PullProgress
from tuneplane_node.runtime.engines.pulling import drive_pull
from tuneplane_node.runtime.pool import BlockingPool


class Stream:
    """Progress messages, then (unless ``end``) nothing until closed, as a stuck registry."""

    def __init__(
        self, messages: list[dict[str, Any]], *, end: bool = True, every: float = 0
    ) -> None:
        self.messages = messages
        self.end = end
        self.every = every
        self.aborted = threading.Event()  # its socket shut down: the watcher ended it
        self.closed = threading.Event()  # the response closed: its connection given back
        self.closed_by: threading.Thread | None = None
        self.closes: list[threading.Thread] = []
        self.reader: threading.Thread | None = None
        # requests' path to the socket under a streamed response (`shut`)
        self.raw = SimpleNamespace(_fp=SimpleNamespace(fp=SimpleNamespace(raw=SimpleNamespace(
            _sock=SimpleNamespace(shutdown=lambda how: self.aborted.set())
        ))))  # fmt: skip

    def open(self) -> tuple[Iterator[Mapping[str, Any]], Any]:
        self.reader = threading.current_thread()
        return self._read(), self

    def _read(self) -> Iterator[Mapping[str, Any]]:
        for message in self.messages:
            if self.aborted.wait(self.every):
                return
            yield message
        if not self.end:
            self.aborted.wait()

    def close(self) -> None:
        self.closed_by = threading.current_thread()
        self.closes.append(self.closed_by)
        self.closed.set()


def layer(layer_id: str, current: int, total: int = 1000) -> dict[str, Any]:
    detail = {"current": current, "total": total}
    return {"status": "Downloading", "id": layer_id, "progressDetail": detail}


@pytest.fixture
async def pool() -> Any:
    threads = BlockingPool(2, name="pull-test")
    yield threads
    threads.close()


async def pull(
    pool: BlockingPool, stream: Stream, limits: PullLimits, seen: list[PullProgress]
) -> None:
    await drive_pull(
        pool,
        engine="docker",
        image="reg/big:1",
        open_stream=stream.open,
        limits=limits,
        on_progress=seen.append,
    )


async def test_progress_is_reported_and_the_last_word_comes_at_the_end(pool: BlockingPool) -> None:
    seen: list[PullProgress] = []
    stream = Stream([layer("a", 10), layer("a", 600), {"status": "Download complete", "id": "a"}])

    await pull(pool, stream, PullLimits(10, 10), seen)

    assert seen[-1] == PullProgress(1000, 1000, 1, 1)
    assert not stream.aborted.is_set()  # ended on its own
    assert stream.closed.is_set() and stream.closed_by is stream.reader  # given back


async def test_an_error_in_the_stream_is_the_engines_refusal(pool: BlockingPool) -> None:
    stream = Stream([layer("a", 10), {"error": "manifest unknown"}])
    with pytest.raises(EngineRefused) as refused:
        await pull(pool, stream, PullLimits(10, 10), [])
    assert refused.value.message == "docker refused to pull reg/big:1: manifest unknown"


async def test_a_full_disk_is_named_before_the_engines_words(pool: BlockingPool) -> None:
    error = "write /var/lib/docker/tmp/GetImageBlob1: no space left on device"
    stream = Stream([layer("a", 10), {"error": error}])
    with pytest.raises(EngineRefused) as refused:
        await pull(pool, stream, PullLimits(10, 10), [])
    assert refused.value.reason == f"the engine's disk is full: {error}"


@pytest.mark.slow
async def test_a_pull_without_progress_is_abandoned_and_its_stream_closed(
    pool: BlockingPool,
) -> None:
    stream = Stream([layer("a", 10)], end=False)
    started = time.monotonic()

    with pytest.raises(EngineRefused, match=r"no progress for 0\.1 s"):
        await pull(pool, stream, PullLimits(60, 0.1), [])

    assert stream.aborted.is_set()
    assert time.monotonic() - started < 2


@pytest.mark.slow
async def test_a_pull_that_moves_but_never_ends_meets_the_overall_deadline(
    pool: BlockingPool,
) -> None:
    moving = Stream([layer("a", n) for n in range(1, 10_000)], end=False, every=0.01)

    with pytest.raises(EngineRefused, match=r"not done after 0\.15 s"):
        await pull(pool, moving, PullLimits(0.15, 0.05), [])

    assert moving.aborted.is_set()


@pytest.mark.slow
async def test_a_cancelled_pull_returns_at_once_and_closes_its_stream(pool: BlockingPool) -> None:
    stream, seen = Stream([layer("a", 10)], end=False), list[PullProgress]()
    task = asyncio.ensure_future(pull(pool, stream, PullLimits(60, 60), seen))
    await wait_until(lambda: seen)  # the pull is reading its stream

    started = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert time.monotonic() - started < 0.5
    assert stream.aborted.wait(1)
    # Closed by the thread that read it, once it stopped: not under it by the watcher.
    assert stream.closed.wait(1) and stream.closed_by is stream.reader


@pytest.mark.slow
async def test_a_pull_whose_stream_ended_as_it_was_cancelled_is_closed_by_its_reader_alone(
    pool: BlockingPool,
) -> None:
    """The CI flake (``ResponseNotReady`` on the call after a cancelled podman pull): the
    body had ended, so no socket was left to shut, and the watcher closed the response
    while its reader closed it too: one connection went back to the pool twice."""
    stream, seen = Stream([layer("a", 10), layer("a", 20)], every=0.2), list[PullProgress]()
    stream.raw._fp.fp = None  # read to its end: http.client has let go of the socket
    task = asyncio.ensure_future(pull(pool, stream, PullLimits(60, 60), seen))
    await wait_until(lambda: seen)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert stream.closed.wait(1)
    assert stream.closes == [stream.reader]


@pytest.mark.slow  # a second and more of the loop held, as SIGSTOP holds it
async def test_time_the_node_did_not_run_is_no_stall(pool: BlockingPool) -> None:
    """Finding 14 of issue 25: after a SIGSTOP of the daemon longer than the stall
    deadline, pulls failed "no progress" while the engine had gone on downloading: the
    deadline was checked before the progress waiting in the socket was read."""
    resumed = threading.Event()

    class Paused(Stream):
        def _read(self) -> Iterator[Mapping[str, Any]]:
            yield layer("a", 10)
            resumed.wait()  # the whole node stopped: the reader too
            yield from (layer("a", 600), {"status": "Download complete", "id": "a"})

    seen: list[PullProgress] = []
    pulling = asyncio.ensure_future(pull(pool, Paused([]), PullLimits(60, 0.6), seen))
    while not seen:
        await asyncio.sleep(0.01)
    time.sleep(1.5)  # the loop does not run, as under SIGSTOP
    # SIGCONT: the engine's messages are there to read, a moment after the watcher wakes.
    asyncio.get_running_loop().call_later(0.05, resumed.set)
    await pulling
    assert seen[-1] == PullProgress(1000, 1000, 1, 1)


@pytest.mark.slow  # a second and more of the loop held, as SIGSTOP holds it
async def test_a_pull_stalled_before_the_node_stopped_still_meets_its_deadline(
    pool: BlockingPool,
) -> None:
    stream = Stream([layer("a", 10)], end=False)
    started = time.monotonic()
    pulling = asyncio.ensure_future(pull(pool, stream, PullLimits(60, 0.6), []))
    await asyncio.sleep(0.3)
    time.sleep(1.0)  # not running: excused; the stall goes on after
    with pytest.raises(EngineRefused, match=r"no progress for 0\.6 s"):
        await pulling
    assert 1.3 + 0.3 < time.monotonic() - started < 3
