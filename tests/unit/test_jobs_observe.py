"""Observe and logs: each ref answered once, unknown (not gone) with the engine down; a
job's last lines, a follow that ends with the job, and the refusals as sentences. The job
service against the in-memory engine (tests/jobservice.py says how)."""

from __future__ import annotations

import contextlib

import pytest

from tests.conftest import IMAGE
from tests.fakes.runtime import FakeRuntime
from tests.jobservice import (
    MISSING,
    request,
)
from tuneplane_node.errors import (
    EngineUnavailable,
    TooManyFollows,
)
from tuneplane_node.jobs import (
    Node,
)
from tuneplane_node.runtime.base import ContainerState, LogStream, LogText
from tuneplane_node.runtime.spec import ContainerSpec

# --- observe and logs ---------------------------------------------------------------------


async def test_observe_answers_each_ref_once_and_knows_nothing_of_foreign_ones(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.create_outside(ContainerSpec(name="tuneplane-foreign", image=IMAGE))

    views = await node.jobs.observe(
        ["tuneplane-r1", "tuneplane-nobody", "tuneplane-r1", "tuneplane-foreign"]
    )

    assert list(views) == ["tuneplane-r1", "tuneplane-nobody", "tuneplane-foreign"]
    assert views["tuneplane-r1"].exists and views["tuneplane-r1"].status == "running"  # type: ignore[union-attr]
    assert views["tuneplane-nobody"] == ContainerState.missing("tuneplane-nobody")
    assert views["tuneplane-foreign"] == ContainerState.missing("tuneplane-foreign")


async def test_observe_with_the_engine_down_is_unknown_not_gone(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.up = False
    with pytest.raises(EngineUnavailable):
        await node.jobs.observe(["tuneplane-r1"])


async def test_logs_of_a_job_are_its_last_lines(node: Node, fake: FakeRuntime) -> None:
    await node.jobs.launch(request("r1"))
    fake.containers["tuneplane-r1"].output = ["one", "two", "three"]

    text = (await node.jobs.logs("tuneplane-r1", 2)).text

    assert [line.split(" ", 1)[1] for line in text.splitlines()] == ["two", "three"]


async def test_logs_of_a_pending_missing_or_foreign_ref_are_a_sentence(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1", image=MISSING))
    fake.create_outside(ContainerSpec(name="tuneplane-foreign", image=IMAGE)).output = ["secret"]

    assert await node.jobs.logs("tuneplane-r1", 10) == LogText(
        f"no logs yet: tuneplane-r1 is pulling ({MISSING})"
    )
    assert (await node.jobs.logs("tuneplane-x", 10)).text == (
        "no logs: container tuneplane-x does not exist"
    )
    assert "secret" not in (await node.jobs.logs("tuneplane-foreign", 10)).text


async def test_logs_the_engine_refuses_to_read_are_a_sentence(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.refuse_logs = "configured logging driver does not support reading"
    text = await node.jobs.logs("tuneplane-r1", 10)
    assert text == LogText(
        "no logs for tuneplane-r1: configured logging driver does not support reading"
    )


async def read_all(stream: LogStream) -> str:
    return b"".join([chunk async for chunk in stream]).decode()


async def test_a_followed_log_gives_the_tail_then_new_lines_until_the_exit(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    job = fake.containers["tuneplane-r1"]
    job.output = ["one", "two", "three"]
    async with node.jobs.follow("tuneplane-r1", 2) as stream:
        first = (await anext(stream)).decode()
        job.output.append("four")
        second = (await anext(stream)).decode()
        fake.exit("tuneplane-r1", 0)
        rest = await read_all(stream)

    assert [line.split(" ", 1)[1] for line in first.splitlines()] == ["two", "three"]
    assert second.endswith(" four\n") and rest == ""
    assert fake.following == 0


@pytest.mark.slow
async def test_an_engine_ending_the_follow_of_a_running_job_is_an_error_not_an_end(
    node: Node, fake: FakeRuntime
) -> None:
    """A clean end means the job stopped: an engine that ends the stream while the job
    runs (podman 4 was seen to) is reported, and the daemon cuts the connection."""
    await node.jobs.launch(request("r1"))
    fake.containers["tuneplane-r1"].output = ["one"]
    fake.end_follows_early = True
    node.reader.end_grace_s = 0.2
    async with node.jobs.follow("tuneplane-r1", 10) as stream:
        assert (await anext(stream)).endswith(b" one\n")
        with pytest.raises(EngineUnavailable) as broke:
            await anext(stream)
    assert "ended the log stream of tuneplane-r1 while the job still runs" in str(broke.value)

    fake.exit("tuneplane-r1", 0)  # the same end once the job has stopped: a clean end
    async with node.jobs.follow("tuneplane-r1", 10) as stream:
        assert await read_all(stream) != "" and fake.following == 0


async def test_a_followed_log_of_a_pending_missing_or_foreign_ref_is_a_sentence(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1", image=MISSING))
    fake.create_outside(ContainerSpec(name="tuneplane-foreign", image=IMAGE)).output = ["secret"]
    said = {}
    for ref in ("tuneplane-r1", "tuneplane-x", "tuneplane-foreign"):
        async with node.jobs.follow(ref, 10) as stream:
            said[ref] = await read_all(stream)

    assert said["tuneplane-r1"] == f"no logs yet: tuneplane-r1 is pulling ({MISSING})"
    assert said["tuneplane-x"] == "no logs: container tuneplane-x does not exist"
    assert said["tuneplane-foreign"] == "no logs: container tuneplane-foreign does not exist"
    assert ("follow_logs", "tuneplane-foreign") not in fake.refs


async def test_follows_past_the_limit_are_refused_and_a_slot_frees_on_leaving(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    assert node.reader.follow_limit == 4  # a quarter of the 16 engine threads
    async with contextlib.AsyncExitStack() as held:
        for _ in range(4):
            await held.enter_async_context(node.jobs.follow("tuneplane-r1", 10))
        with pytest.raises(TooManyFollows) as refused:
            await held.enter_async_context(node.jobs.follow("tuneplane-r1", 10))
        assert refused.value.status == 429 and "already following 4 logs" in refused.value.message
    async with node.jobs.follow("tuneplane-r1", 10) as stream:
        assert stream is not None  # every slot came back


async def test_a_followed_log_the_engine_refuses_is_a_sentence(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.refuse_logs = "configured logging driver does not support reading"
    async with node.jobs.follow("tuneplane-r1", 10) as stream:
        text = await read_all(stream)
    assert text == "no logs for tuneplane-r1: configured logging driver does not support reading"
