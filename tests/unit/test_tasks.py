"""BackgroundTasks: every background task named, its failure logged once, ended at close;
TurnShared: one answer a turn of the loop."""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest

from tests.support.waiting import settle
from tuneplane_node import tasks as tasks_module
from tuneplane_node.clock import within
from tuneplane_node.tasks import BackgroundTasks, TurnShared, by_awaiters

log = logging.getLogger("tests.tasks")


async def fail() -> None:
    raise RuntimeError("boom")


async def test_a_failing_task_is_logged_once_at_error_with_its_name_and_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = BackgroundTasks(log)
    task = tasks.spawn(fail(), name="the sampler")
    await asyncio.wait({task})
    await settle(2)
    failures = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in failures] == ["the sampler failed"]
    assert failures[0].exc_info is not None and "boom" in str(failures[0].exc_info[1])
    assert len(tasks) == 0  # forgotten once ended


async def test_close_cancels_every_task_and_waits_until_each_has_ended(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = BackgroundTasks(log)
    ended: list[str] = []

    async def loop(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.sleep(0)  # a teardown of its own, awaited too
            ended.append(name)

    made = [tasks.spawn(loop(name), name=name) for name in ("relist", "drain")]
    await settle(2)
    assert tasks.names() == ["drain", "relist"]
    await tasks.close()
    assert sorted(ended) == ["drain", "relist"] and all(task.cancelled() for task in made)
    assert len(tasks) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # a cancel is no failure


async def test_close_cancels_again_a_task_that_lost_its_cancel(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that swallows the shutdown's cancel (as `asyncio.wait_for` did before
    Python 3.12) is cancelled again and named: the close ends, the daemon exits."""
    monkeypatch.setattr(tasks_module, "CANCEL_AGAIN_S", 0.05)
    tasks = BackgroundTasks(log)
    lost = 0

    async def sampler() -> None:
        nonlocal lost
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                if lost:
                    raise
                lost += 1  # the first cancel lost

    made = tasks.spawn(sampler(), name="stats sampler")
    await settle()
    await within(tasks.close(), 5)
    assert made.cancelled() and lost == 1 and len(tasks) == 0
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == ["stats sampler: still running after its cancel; cancelled again"]


async def test_cancel_waits_for_the_task_and_its_ended() -> None:
    tasks = BackgroundTasks(log)
    seen: list[str] = []
    task = tasks.spawn(asyncio.Event().wait(), name="launch r1", ended=lambda t: seen.append("x"))
    await tasks.cancel(task)
    assert task.cancelled() and seen == ["x"]


async def test_ended_runs_for_a_task_cancelled_before_it_ran_and_reports_instead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = BackgroundTasks(log)
    outcomes: list[str] = []

    def ended(task: asyncio.Task[object]) -> None:
        outcomes.append("cancelled" if task.cancelled() else repr(task.exception()))

    never_ran = tasks.spawn(fail(), name="launch r1", ended=ended)
    never_ran.cancel()  # before its first step: no finally of its own would run
    failed = tasks.spawn(fail(), name="launch r2", ended=ended)
    await asyncio.wait({never_ran, failed})
    await settle(2)
    assert outcomes == ["cancelled", "RuntimeError('boom')"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # ended reported it


async def test_an_ended_that_raises_is_logged_as_the_tasks_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(task: asyncio.Task[object]) -> None:
        raise KeyError("record")

    tasks = BackgroundTasks(log)
    await asyncio.wait({tasks.spawn(asyncio.sleep(0), name="launch r3", ended=broken)})
    await settle(2)
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.getMessage() == "launch r3: recording its end failed" and record.exc_info


@pytest.mark.slow
async def test_a_task_its_awaiters_report_is_not_logged_nor_left_unretrieved(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = BackgroundTasks(log)
    pull = tasks.spawn(fail(), name="pull x", ended=by_awaiters)
    with pytest.raises(RuntimeError, match="boom"):
        await asyncio.shield(pull)  # the waiter gets the error, and reports it
    lonely = tasks.spawn(fail(), name="pull y", ended=by_awaiters)
    await asyncio.wait({lonely})
    await settle(2)
    del pull, lonely
    gc.collect()
    assert not caplog.records  # not "Task exception was never retrieved" either


class Counted:
    """A compute that answers how many times it ran; its first run waits on ``gate``
    when one is given."""

    def __init__(self, gate: asyncio.Future[None] | None = None) -> None:
        self.runs, self.gate = 0, gate

    async def __call__(self) -> int:
        self.runs += 1
        if self.runs == 1 and self.gate is not None:
            await self.gate
        return self.runs


async def test_callers_of_one_turn_share_an_answer_and_the_next_turn_computes_again() -> None:
    shared = TurnShared(Counted())
    assert await asyncio.gather(*(shared.get() for _ in range(50))) == [1] * 50
    await asyncio.sleep(0)  # a turn later: a request read now may follow a change
    assert await shared.get() == 2
    assert await shared.get() == 2  # still this turn: no await in between suspended


async def test_an_answer_whose_compute_waited_is_not_shared() -> None:
    """Waited across turns, it may hold what was read before a later caller's request:
    the caller woken in the turn it ends in computes its own."""
    loop = asyncio.get_running_loop()
    compute = Counted(gate=loop.create_future())
    shared = TurnShared(compute)
    waited = asyncio.ensure_future(shared.get())
    await asyncio.sleep(0)
    await asyncio.sleep(0)  # it waits on its gate, turns later
    later: list[asyncio.Future[int]] = []

    def open_gate_then_ask() -> None:  # the waiter resumes first, then the later caller
        assert compute.gate is not None
        compute.gate.set_result(None)
        later.append(asyncio.ensure_future(shared.get()))

    loop.call_soon(open_gate_then_ask)
    assert await waited == 1
    await asyncio.sleep(0)
    assert await later[0] == 2 and compute.runs == 2
