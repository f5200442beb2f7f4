"""`tuneplane_node.client` against the daemon on the shared Docker engine, over a real
socket: every verb of a job's life, the refusals a real engine gives, and `watch()`
told of an exit by the engine's own event (there on podman too). What a test launches
is removed at the end (`make_node` tracks every container its daemon made); nothing else
is touched: no reap of other people's jobs, no drain."""

from __future__ import annotations

import asyncio
import importlib.util
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeNode
from tests.support.console import TOKEN, Console
from tests.support.images import IMAGE
from tests.support.jobs import unique
from tuneplane_node.client import (
    AsyncNodeClient,
    Container,
    Cordoned,
    InvalidRequest,
    Jobs,
    JobState,
    JobStatus,
    NameHeld,
    NoCapacity,
    NotRunning,
)

pytestmark = pytest.mark.engine
Connect = Callable[..., Awaitable[AsyncNodeClient]]


@pytest.fixture
async def connect(make_node: MakeNode) -> AsyncIterator[Connect]:
    """A client of a fresh daemon on a shared engine (Docker unless told; 4 cards in
    labels), with these settings."""
    clients: list[AsyncNodeClient] = []

    async def open_one(engine: str = "docker", **settings: Any) -> AsyncNodeClient:
        node: Console = await make_node(engine, **settings)
        client = AsyncNodeClient(str(node.client.make_url("")).rstrip("/"), token=TOKEN)
        clients.append(client)
        return client

    yield open_one
    for client in clients:
        await client.aclose()


def job(name: str, script: str) -> Container:
    return Container(image=IMAGE, name=name, command=("/bin/sh", "-c", script))


async def output(client: AsyncNodeClient, name: str, wanted: str) -> str:
    deadline = time.monotonic() + 20
    while wanted not in (text := (await client.logs(name)).logs):
        assert time.monotonic() < deadline, f"{wanted!r} never came: {text!r}"
        await asyncio.sleep(0.1)
    return text


async def test_a_jobs_life_through_every_verb(connect: Connect) -> None:
    client = await connect()
    run_id = unique("client")
    name = f"tuneplane-{run_id}"
    script = "trap 'echo got usr1' USR1; echo first; while true; do sleep 0.1; done"
    container = Container(
        image=IMAGE, name=name, command=("/bin/sh", "-c", script), labels={"tuneplane.user": "ops"}
    )
    launched = await client.launch(run_id, container, requested_gpus=1)
    assert (launched.phase, launched.ref, len(launched.gpus)) == ("running", name, 1)
    state = (await client.observe([name]))[name]
    assert state.running and state.labels["tuneplane.user"] == "ops"
    assert (await client.jobs()).jobs[name].running
    assert (await client.stats([name]))[name].exists
    await output(client, name, "first")
    await client.signal(name, "SIGUSR1")
    await output(client, name, "got usr1")
    await client.stop(name, timeout=1)
    stopped = (await client.observe([name]))[name]
    assert stopped.status == "exited" and stopped.exit_code is not None
    followed = "".join([text async for text in client.follow(name)])  # it ended: so does this
    assert "first" in followed and "got usr1" in followed
    await client.remove(name)
    assert not (await client.observe([name]))[name].exists


async def test_health_inventory_and_cordon_on_docker(connect: Connect) -> None:
    client = await connect()
    health = await client.health()
    assert health.ok and health.runtime is not None and health.runtime.name == "docker"
    assert health.gpus_total == 4 and "watch" in health.features
    assert (await client.inventory()).agent_version
    assert (await client.cordon("maintenance")).state == "cordoned"
    with pytest.raises(Cordoned):
        await client.launch(unique("client"), job("", "sleep 300"))
    assert (await client.uncordon()).state == "ready"


async def test_a_real_engines_refusals_are_their_families(connect: Connect) -> None:
    client = await connect(job_init=False)  # the command is PID 1: runc execs it
    with pytest.raises(NoCapacity):
        await client.launch(unique("client"), job("", "sleep 300"), requested_gpus=5)
    name = f"tuneplane-{unique('client')}"
    await client.launch(unique("client"), job(name, "exit 3"))
    with pytest.raises(NameHeld):
        await client.launch(unique("client"), job(name, "sleep 300"))
    deadline = time.monotonic() + 20
    while (await client.observe([name]))[name].status != "exited":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)
    with pytest.raises(NotRunning):
        await client.signal(name, "SIGUSR1")
    missing = Container(image=IMAGE, command=("/no/such/program",))
    with pytest.raises(InvalidRequest) as refused:
        await client.launch(unique("client"), missing)
    assert refused.value.code == "spec_refused"
    assert [entry.field for entry in refused.value.errors] == ["container.command"]


@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_watch_is_told_of_an_exit_by_the_engines_event(connect: Connect, engine: str) -> None:
    client = await connect(engine)
    name = f"tuneplane-{unique('client')}"
    await client.launch(unique("client"), job(name, "sleep 2; exit 7"))
    copy: dict[str, JobState] = {}
    answers: list[Jobs] = []
    started = time.monotonic()
    async for answer in client.watch(wait=30):
        answer.apply(copy)
        answers.append(answer)
        if copy[name].status == "exited":
            break
        assert time.monotonic() - started < 30, "the exit never came"
    assert copy[name].exit_code == 7 and answers[0].full and not answers[-1].full
    assert time.monotonic() - started < 15  # told by the event, not at a wait's end
    listed = (await client.jobs()).jobs[name]  # the die event's exit; its inspect may since
    assert (listed.status, listed.exit_code) == ("exited", 7)  # have refined finished_at


EXAMPLE = Path(__file__).resolve().parents[2] / "clients/python/examples/console.py"


async def test_the_console_example_runs_a_job_to_its_end(
    connect: Connect, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's typed console (clients/python/examples, held to mypy --strict) does
    what it says against a daemon on a real engine; and the answers it reads are typed:
    a status is its enum's member, a time an aware datetime."""
    client = await connect()
    spec = importlib.util.spec_from_file_location("console_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    run_id = unique("example")
    url = str(client.endpoint.url)
    assert await asyncio.to_thread(example.run, url, TOKEN, IMAGE, run_id) == 0
    printed = capsys.readouterr().out
    assert f"tuneplane-{run_id}: running" in printed and "exit 0, started " in printed
    name = f"tuneplane-{run_id}"
    launched = await client.launch(run_id, job(name, "sleep 30"))
    try:
        state = (await client.observe([name]))[name]
        assert state.status is JobStatus.RUNNING and f"{state.status}" == "running"
        assert isinstance(state.created_at, datetime) and state.created_at.tzinfo is not None
        assert isinstance(state.started_at, datetime) and state.finished_at is None
    finally:
        await client.remove(launched.ref)
