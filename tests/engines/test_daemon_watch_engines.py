"""The watch on the real engines: a job's exit reaches a waiting query from the engine's
own events, and a restarted daemon answers the old cursor with every job."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.conftest import MakeNode

pytestmark = pytest.mark.engine


@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_a_jobs_exit_reaches_a_waiting_query(make_node: MakeNode, engine: str) -> None:
    node = await make_node(engine)
    ref, _ = await node.launch(["/bin/sh", "-c", "sleep 2; exit 7"])
    listing = await node.jobs()
    assert listing["jobs"][ref]["status"] == "running"
    index, started = listing["index"], time.monotonic()
    while True:
        answer = await asyncio.wait_for(node.watch(index, 30), 40)
        assert answer["full"] is False and answer["removed"] == []
        index = answer["index"]
        state = answer["jobs"].get(ref)
        if state is not None and state["status"] == "exited":
            break
        assert time.monotonic() - started < 30, "the exit never came"
    assert state["exit_code"] == 7 and state["finished_at"]
    assert time.monotonic() - started < 15  # told by the event, not a wait's end
    listed = (await node.jobs())["jobs"][ref]
    assert (listed["status"], listed["exit_code"]) == ("exited", 7)


@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_a_restarted_daemon_answers_the_old_cursor_with_every_job(
    make_node: MakeNode, engine: str
) -> None:
    first = await make_node(engine)
    refs = [(await first.launch())[0] for _ in range(2)]
    before = await first.jobs()
    await first.client.close()
    restarted = await make_node(engine)  # a new cache too, as a new process would have
    answer = await restarted.watch(before["index"])
    assert answer["full"] is True
    ours = {ref: answer["jobs"][ref] for ref in refs}
    assert ours == {ref: before["jobs"][ref] for ref in refs}
    # The shared engine holds other people's jobs too: only the test's are compared.
    listing = (await restarted.jobs())["jobs"]
    assert {ref: listing[ref] for ref in refs} == ours
