"""Observe's answers kept whole (`daemon.render.ObserveAnswers`): a console asking for
the same refs again gets what is true now, whichever of the sources an answer is made
of changed, each alone: the engine, the node state, the disk monitor's measures, a
pending launch among the refs, and the engine lost. (What the change feed tells alone,
a card's job fault: `test_gpu_faults.py`.)"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.conftest import IMAGE, MakeFakeNode
from tests.fakes.runtime import FakeRuntime
from tests.support.console import Console
from tests.support.console import console_0315 as console_launch
from tuneplane_node.daemon.state import NODE
from tuneplane_node.jobs.disk.monitor import Measured
from tuneplane_node.jobs.words.views import DiskFigures

pytestmark = pytest.mark.slow  # each test runs a daemon over a socket

REFS = ("tuneplane-r-1", "tuneplane-r-2")
MISSING = "registry.test/missing:1"


async def polled(node: Console) -> dict[str, Any]:
    """Two running jobs, asked for twice: the second answer is the kept one."""
    for run_id in ("r-1", "r-2"):
        await node.ok("POST", "/node/v1/launch", json=console_launch(run_id, 0, image=IMAGE))
    first = await node.observe(*REFS)
    assert await node.observe(*REFS) == first
    assert [state["status"] for state in first.values()] == ["running", "running"]
    return first


async def test_a_job_that_ends_by_itself_reads_exited_at_the_next_poll(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    await polled(node)
    fake.exit("tuneplane-r-1", 3)  # the engine's event alone: no verb of the node's
    states = await node.observe(*REFS)
    assert (states[REFS[0]]["status"], states[REFS[0]]["exit_code"]) == ("exited", 3)
    assert states[REFS[1]]["status"] == "running"


async def test_a_stop_reason_written_in_the_node_state_reads_at_the_next_poll(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    """The node state replaced alone (as a drain or the disk monitor writes why it
    stopped a job), with nothing else telling of it."""
    node = await fake_node()
    await polled(node)
    store, handle = node.app[NODE].store, fake.containers[REFS[0]].id
    await store.save(dataclasses.replace(store.node, stop_reasons={handle: "drain: kernel"}))
    states = await node.observe(*REFS)
    assert states[REFS[0]]["stop_reason"] == "drain: kernel"
    assert "stop_reason" not in states[REFS[1]]


async def test_a_disk_measure_reads_at_the_next_poll(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    """The disk monitor's measures replaced alone (as each pass does)."""
    node = await fake_node()
    assert "disk_used_bytes" not in (await polled(node))[REFS[0]]
    monitor, job = node.app[NODE].monitor, fake.containers[REFS[0]]
    monitor.measured = {REFS[0]: Measured(job.id, DiskFigures(4096, 1 << 20))}
    states = await node.observe(*REFS)
    assert (states[REFS[0]]["disk_used_bytes"], states[REFS[0]]["disk_limit_bytes"]) == (
        4096,
        1 << 20,
    )
    assert "disk_used_bytes" not in states[REFS[1]]


async def test_a_pending_launch_among_the_refs_shows_its_pull_as_it_moves(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    """A pending launch's elapsed time moves with no change told: an answer holding one
    is made anew on every call."""
    node = await fake_node()
    await polled(node)
    launch = console_launch("r-3", 0, image=MISSING)
    await node.ok("POST", "/node/v1/launch", json=launch)
    await fake.pulling.wait()
    refs = (*REFS, "tuneplane-r-3")
    before = (await node.observe(*refs))[refs[2]]
    fake.clock.advance(2.5)
    after = (await node.observe(*refs))[refs[2]]
    assert after["pending_elapsed_s"] == pytest.approx(before["pending_elapsed_s"] + 2.5)


async def test_an_engine_lost_after_a_kept_answer_is_a_503_not_the_answer(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    await polled(node)
    fake.up = False  # its event stream breaks: the node's cache knows nothing now
    status, answer = await node.call("POST", "/node/v1/observe", json={"refs": list(REFS)})
    assert status == 503 and answer["code"] == "engine_unavailable", answer
    fake.up = True  # back: the node reads again once its cache is synced
    states = await node.observe(*REFS)
    assert [state["status"] for state in states.values()] == ["running", "running"]
