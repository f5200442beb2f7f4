"""The consoles' client (`tuneplane_node.client`) against a real daemon: on the fake engine
every verb, its typed answers and its refusals; on docker a job's life; the blocking
watch's cursor against a node serving the jobs list's contract; and that it loads none
of the daemon."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import IMAGE as FAKE_IMAGE
from tests.conftest import MakeFakeNode, MakeNode
from tests.helpers import IMAGE, TOKEN, Console, unique
from tuneplane_node import wire
from tuneplane_node.client import (
    FieldError,
    JobState,
    Launched,
    NodeClient,
    NodeRefused,
    SyncNodeClient,
    Unreachable,
)
from tuneplane_node.client.nodes import PROTOCOL


class Settled(httpx.AsyncBaseTransport):
    """Each request once the fake engine's events reached the node's cache."""

    def __init__(self, settle: Callable[[], Awaitable[None]] | None) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.settle = settle

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.settle is not None:
            await self.settle()
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def url(console: Console) -> str:
    return str(console.client.make_url("")).rstrip("/")


@asynccontextmanager
async def client_of(console: Console) -> AsyncIterator[NodeClient]:
    async with NodeClient(url(console), token=TOKEN, transport=Settled(console.settle)) as node:
        yield node


def spec(command: list[str] | None = None, image: str = FAKE_IMAGE) -> dict[str, Any]:
    return {"image": image, "command": command or ["/bin/sleep", "300"]}


def test_the_client_speaks_the_nodes_protocol() -> None:
    assert PROTOCOL == wire.PROTOCOL


async def test_every_verb_answers_a_typed_object(fake_node: MakeFakeNode) -> None:
    console = await fake_node()
    async with client_of(console) as node:
        launched = await node.launch("team/7 #1", spec(), requested_gpus=1)
        assert isinstance(launched, Launched) and launched.phase == "running"
        assert launched.ref.startswith("tuneplane-team-7--1-") and len(launched.gpus) == 1
        again = await node.launch("team/7 #1", spec(), requested_gpus=1)
        assert (again.ref, again.idempotent, again.gpus) == (launched.ref, True, launched.gpus)

        (state,) = (await node.observe(launched.ref)).values()
        assert isinstance(state, JobState)
        assert (state.status, state.run_id, state.pending) == ("running", "team/7 #1", None)
        assert (await node.stats([launched.ref]))[launched.ref].status == "running"
        await node.signal(launched.ref, "SIGUSR1")
        await node.stop(launched.ref, timeout=1)
        assert (await node.observe(launched.ref))[launched.ref].status == "exited"
        assert isinstance((await node.logs(launched.ref, tail=5)).text, str)
        await node.remove(launched.ref)
        assert (await node.observe(launched.ref))[launched.ref].exists is False
        assert await node.reap(3600) == 0

        health = await node.health()
        assert (health.ok, health.protocols, health.gpus_free) == (True, (1,), 4)
        assert {"stats", "signal", "follow", "cordon"} <= set(health.features)
        assert (await node.inventory()).features == health.features
        assert (await node.cordon("disk swap")).state == "cordoned"
        assert (await node.uncordon()).state == "ready"
        assert (await node.drain("retire", grace_s=1)).state == "draining"


async def test_a_refusal_is_an_exception_carrying_the_code_and_every_bad_field(
    fake_node: MakeFakeNode,
) -> None:
    console = await fake_node()
    async with client_of(console) as node:
        with pytest.raises(NodeRefused) as refused:
            await node.launch("r-1", {"image": "UPPER/Case", "cpu_limit": 0, "comand": []})
        error = refused.value
        assert (error.status, error.code) == (422, "unknown_field")
        assert error.detail.startswith("container.comand: unknown field")
        assert error.errors == (
            FieldError("container.comand", "unknown_field", error.detail),
            FieldError(
                "container.image",
                "invalid_field",
                "container.image: must be an image reference like registry/name:tag (lower case)",
            ),
            FieldError(
                "container.cpu_limit",
                "out_of_range",
                "container.cpu_limit: must be more than 0 and at most 10000",
            ),
        )
        with pytest.raises(NodeRefused) as refused:
            await node.launch("r-2", spec(), requested_gpus=9)
        assert (refused.value.status, refused.value.code) == (409, "no_capacity")
        with pytest.raises(NodeRefused) as refused:
            await node.signal("tuneplane-nothing", "SIGUSR1")
        assert (refused.value.code, refused.value.errors) == ("not_running", ())


async def test_a_wrong_token_is_refused_and_no_node_is_unreachable(
    fake_node: MakeFakeNode,
) -> None:
    console = await fake_node()
    async with NodeClient(url(console), token="wrong") as node:
        with pytest.raises(NodeRefused) as refused:
            await node.health()
        assert (refused.value.status, refused.value.code) == (401, "unauthorized")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]  # closed when the block ends: nobody listens
    async with NodeClient(f"http://127.0.0.1:{port}", token=TOKEN, timeout=5) as node:
        with pytest.raises(Unreachable, match="no answer from the node"):
            await node.health()


async def test_the_sync_client_speaks_the_same_verbs(fake_node: MakeFakeNode) -> None:
    console = await fake_node()

    def console_script() -> tuple[Launched, str]:
        with SyncNodeClient(url(console), token=TOKEN) as node:
            launched = node.launch(unique("sync"), spec())
            node.remove(launched.ref)
            try:
                node.launch("r-x", {"image": ""})
            except NodeRefused as exc:
                return launched, exc.code
        raise AssertionError("an empty image was accepted")

    launched, code = await asyncio.to_thread(console_script)
    assert (launched.phase, code) == ("running", "invalid_field")


# --- the watch, on the jobs list's contract (GET /node/v1/jobs) ------------------------------


def state(name: str, status: str) -> dict[str, Any]:
    return {
        "name": name,
        "exists": True,
        "status": status,
        "exit_code": 0 if status == "exited" else None,
        "labels": {"tuneplane.run-id": name},
        "created_at": None,
        "started_at": None,
        "finished_at": None,
        "oom_killed": False,
        "stop_signal": None,
    }


class JobsNode:
    """A node serving only the jobs list and its blocking query: a cursor per answer,
    then one change, then a daemon restart (a cursor of another process: full)."""

    def __init__(self) -> None:
        self.asked: list[dict[str, str]] = []
        self.answers = [
            {"index": "p1:1", "jobs": {"a": state("a", "running")}},
            {"index": "p1:2", "jobs": {"a": state("a", "exited")}, "removed": [], "full": False},
            {"index": "p1:3", "jobs": {}, "removed": ["a"], "full": False},
            {"index": "p2:0", "jobs": {"b": state("b", "running")}, "removed": [], "full": True},
        ]

    async def jobs(self, request: web.Request) -> web.Response:
        assert request.headers["Authorization"] == f"Bearer {TOKEN}"
        self.asked.append(dict(request.query))
        return web.json_response(self.answers[len(self.asked) - 1])


async def test_watch_keeps_the_cursor_and_a_full_page_replaces_the_copy() -> None:
    served = JobsNode()
    app = web.Application()
    app.router.add_get("/node/v1/jobs", served.jobs)
    async with TestServer(app) as server:
        address = str(server.make_url("")).rstrip("/")
        copy: dict[str, JobState] = {}
        async with NodeClient(address, token=TOKEN) as node:
            pages = node.watch(wait_s=30)
            async for page in pages:
                copy = dict(page.jobs) if page.full else {**copy, **page.jobs}
                for ref in page.removed:
                    copy.pop(ref, None)
                if page.index == "p2:0":
                    break
    assert served.asked == [
        {},
        {"index": "p1:1", "wait": "30"},
        {"index": "p1:2", "wait": "30"},
        {"index": "p1:3", "wait": "30"},
    ]
    assert {ref: job.status for ref, job in copy.items()} == {"b": "running"}


async def test_watch_on_the_daemon_hands_the_list_then_each_change(
    fake_node: MakeFakeNode,
) -> None:
    console = await fake_node()
    async with client_of(console) as node, client_of(console) as other:
        pages = node.watch(wait_s=10)
        first = await anext(pages)
        assert (first.full, dict(first.jobs)) == (True, {})
        launched = await other.launch(unique("watched"), spec())
        changed = await anext(pages)
        assert (changed.full, changed.index != first.index) == (False, True)
        assert changed.jobs[launched.ref].run_id == launched.ref.removeprefix("tuneplane-")
        await other.remove(launched.ref)
        removed = await anext(pages)
        while launched.ref not in removed.removed:  # a start may come as its own change
            removed = await anext(pages)
        await pages.aclose()


def test_the_client_loads_none_of_the_daemon() -> None:
    """A console installs it without the engines' SDKs, NVML or aiohttp. (rich may load:
    httpx's own command line takes it when it is installed.)"""
    heavy = "aiohttp docker podman pynvml pydantic prometheus_client orjson"
    code = (
        "import sys, tuneplane_node.client\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy.split()!r} "
        "or m.startswith('tuneplane_node.') and not m.startswith('tuneplane_node.client')))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.stdout.strip() == "[]", loaded.stderr


# --- on docker -----------------------------------------------------------------------------


@pytest.mark.engine
async def test_on_docker_a_job_launched_through_the_client_runs_and_exits(
    make_node: MakeNode,
) -> None:
    console = await make_node("docker")
    async with NodeClient(url(console), token=TOKEN) as node:
        run_id = unique("client")
        launched = await node.launch(
            run_id, spec(["/bin/sh", "-c", "echo from-the-job; exit 3"], IMAGE)
        )
        assert console.made is not None
        console.made.append(launched.ref)  # the fixture removes it, whatever happens
        for _ in range(200):
            job = (await node.observe(launched.ref))[launched.ref]
            if job.status == "exited":
                break
            await asyncio.sleep(0.05)
        assert (job.status, job.exit_code, job.run_id) == ("exited", 3, run_id)
        assert "from-the-job" in (await node.logs(launched.ref)).text
        followed = b"".join([chunk async for chunk in node.follow(launched.ref)])
        assert b"from-the-job" in followed
        await node.remove(launched.ref)
        assert (await node.observe(launched.ref))[launched.ref].exists is False
