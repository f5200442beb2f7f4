"""`tuneplane_node.client` against the real daemon over a real socket, in front of the
in-memory engine: every verb's answer as a typed object, every family of refusal as its
exception with the node's status, code, detail and errors, the sync client as the async
one, and `watch()` keeping a console's copy through exits, outages and a resync. Then
what a console installs: the client alone, with none of the daemon's SDKs."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import tuneplane_node.client as client_package
from tests.conftest import IMAGE, MakeFakeNode
from tests.fakes.clock import FakeClock
from tests.fakes.runtime import FakeRuntime
from tests.http.test_daemon_server import make_ca
from tests.support.console import TOKEN, Console
from tests.support.daemons import free_port, python_path
from tests.support.jobs import unique
from tests.support.waiting import wait_until
from tests.volumeserver import LOOPBACK, FileServer, sha256
from tuneplane_node import wire
from tuneplane_node.client import (
    PROTOCOL,
    PROTOCOL_HEADER,
    AsyncNodeClient,
    Backoff,
    Call,
    ConfigError,
    Conflict,
    Container,
    Cordoned,
    EngineConflict,
    EngineUnavailable,
    Image,
    ImageGc,
    ImagePull,
    ImageStore,
    InsufficientStorage,
    InvalidRequest,
    JobState,
    NameHeld,
    NoCapacity,
    NodeClient,
    NodeError,
    NotFound,
    NotRunning,
    PayloadTooLarge,
    RequestError,
    ServerError,
    SpecRefused,
    TooManyRequests,
    Unauthorized,
    Unreachable,
    VolumeGc,
    Volumes,
    VolumeStore,
    VolumeStoreFull,
)
from tuneplane_node.client.answers import Health, Jobs, build
from tuneplane_node.client.endpoint import Endpoint, Tls
from tuneplane_node.client.errors import refusal
from tuneplane_node.client.watch import Watch
from tuneplane_node.daemon.state import NODE
from tuneplane_node.wire.values import LABEL_DISK_LIMIT, LABEL_INODE_LIMIT

# Slow: every verb end to end over a real socket, watches through outages.
pytestmark = pytest.mark.slow


def url_of(node: Console) -> str:
    return str(node.client.make_url("")).rstrip("/")


@pytest.fixture
async def node(fake_node: MakeFakeNode) -> Console:
    return await fake_node()


@pytest.fixture
async def client(node: Console) -> AsyncIterator[AsyncNodeClient]:
    async with AsyncNodeClient(url_of(node), token=TOKEN) as client:
        yield client


async def settled(node: Console) -> None:
    """Until the node has taken every event of what the test did to the fake engine."""
    assert node.settle is not None
    await node.settle()


def job(name: str = "", **fields: Any) -> Container:
    return Container(image=IMAGE, name=name, command=("/bin/sleep", "300"), **fields)


# --- every verb ----------------------------------------------------------------------------


async def test_a_job_launched_observed_listed_logged_stopped_and_removed(
    client: AsyncNodeClient, node: Console, fake: FakeRuntime
) -> None:
    run_id = unique("client")
    name = f"tuneplane-{run_id}"
    container = job(name, env={"EPOCHS": "3"}, labels={"tuneplane.user": "alice"})
    launched = await client.launch(run_id, container, requested_gpus=2)
    assert (launched.phase, len(launched.gpus), launched.idempotent) == ("running", 2, False)
    assert launched.container_id and launched.raw["phase"] == "running"
    assert launched.ref == name
    again = await client.launch(run_id, container, requested_gpus=2)
    assert (again.phase, again.idempotent, again.gpus) == ("running", True, launched.gpus)

    state = (await client.observe([name, "tuneplane-nobody"]))[name]
    assert isinstance(state, JobState) and state.running and not state.pending
    assert state.labels["tuneplane.user"] == "alice" and state.exit_code is None
    listing = await client.jobs()
    assert listing.full and listing.index and listing.jobs[name] == state
    usage = (await client.stats([name]))[name]
    assert (usage.exists, usage.status) == (True, "running")

    fake.containers[name].output += ["epoch 1", "epoch 2"]
    logs = await client.logs(name, tail=1)
    assert logs.logs.endswith("epoch 2\n") and "epoch 1" not in logs.logs
    fake.containers[name].handlers["SIGUSR1"] = None  # it traps it and runs on
    await client.signal(name, "SIGUSR1")
    assert fake.signals[-1] == (name, "SIGUSR1")
    await client.stop(name, timeout=1)
    await settled(node)
    stopped = (await client.observe([name]))[name]
    assert (stopped.status, stopped.exit_code) == ("exited", 143)
    assert "".join([text async for text in client.follow(name)]).endswith("epoch 2\n")
    assert await client.reap(max_age_s=3600) == 0  # it ended just now
    await client.remove(name)
    await settled(node)
    assert not (await client.observe([name]))[name].exists


async def test_health_inventory_cordon_and_drain_answer_typed(client: AsyncNodeClient) -> None:
    health = await client.health()
    assert (health.ok, health.gpus_total, health.gpus_free) == (True, 4, 4)
    assert health.protocol == PROTOCOL and health.runtime is not None
    assert health.node_state is not None and health.node_state.state == "ready"
    assert {"watch", "follow", "cordon"} <= set(health.features) and PROTOCOL in health.protocols
    inventory = await client.inventory()
    assert inventory.agent_version and inventory.node_id == inventory.raw["node_id"]
    cordoned = await client.cordon("kernel upgrade")
    assert (cordoned.state, cordoned.reason) == ("cordoned", "kernel upgrade")
    assert (await client.uncordon()).state == "ready"
    drained = await client.drain("retiring", grace_s=0)
    assert drained.state in ("draining", "drained") and drained.reason == "retiring"


async def test_prefetch_images_and_gc_answer_typed(
    client: AsyncNodeClient, node: Console, fake: FakeRuntime
) -> None:
    image = f"registry.example.com/team/{unique('trainer')}:1"
    prefetch = await client.pull_image(image)
    assert (prefetch.image, prefetch.phase) == (image, "pulling")
    await fake.pulling.wait()
    fake.pull_of(image).report(4_000, 10_000, 1, 3)
    pull = await _polled(lambda: _pull(client, image), lambda p: p and p.bytes_done == 4_000)
    assert isinstance(pull, ImagePull) and (pull.phase, pull.layers_total) == ("pulling", 3)
    assert pull.waiting == () and pull.error is None and pull.raw["image"] == image

    fake.pull_of(image).finish()
    listed = await _polled(lambda: _image(client, image), lambda i: i is not None)
    assert isinstance(listed, Image) and listed.id and listed.pulled_at and not listed.private
    assert listed.in_use_by == () and listed.last_used_at is None
    assert (await client.pull_image(image)).phase == "present"

    gc = await client.image_gc()
    assert isinstance(gc, ImageGc) and gc.scope == "node" and gc.removed == ()
    assert isinstance(gc.image_store, ImageStore) and gc.freed_bytes == 0
    health = await client.health()
    assert health.image_store is not None and health.image_store.path == gc.image_store.path


async def _polled(read: Callable[[], Any], done: Callable[[Any], object]) -> Any:
    """``read()``'s answer once ``done`` holds of it (the node's pull runs in the background)."""
    for _ in range(500):
        answer = await read()
        if done(answer):
            return answer
        await asyncio.sleep(0.01)
    raise AssertionError(f"never got there: {answer}")


async def _pull(client: AsyncNodeClient, image: str) -> ImagePull | None:
    return next((p for p in (await client.images()).pulls if p.image == image), None)


async def _image(client: AsyncNodeClient, image: str) -> Image | None:
    return next((i for i in (await client.images()).images if i.image == image), None)


async def test_the_sync_client_is_the_async_one_without_a_loop(
    node: Console, fake: FakeRuntime
) -> None:
    """NodeClient in a thread (the node serves on this loop), verb for verb."""
    run_id = unique("sync")
    name = f"tuneplane-{run_id}"

    def console() -> tuple[str | None, bool, str, type[NodeError]]:
        with NodeClient(url_of(node), token=TOKEN) as client:
            launched = client.launch(run_id, job(name))
            running = client.observe([name])[name].running
            fake.containers[name].output.append("hello")
            logs = client.logs(name).logs
            try:
                client.launch(unique("sync"), job(name))
            except NodeError as error:
                refused = type(error)
            client.remove(name)
            return launched.phase, running, logs, refused

    phase, running, logs, refused = await asyncio.to_thread(console)
    assert (phase, running, refused) == ("running", True, NameHeld)
    assert logs.endswith("hello\n")


async def test_a_read_only_root_is_asked_for_and_reaches_the_engine(
    client: AsyncNodeClient, fake: FakeRuntime
) -> None:
    assert "read_only_root" not in job().to_json()  # not given: the node's rule
    name = f"tuneplane-{unique('ro')}"
    await client.launch(unique("ro"), job(name, read_only_root=True))
    assert fake.containers[name].spec.read_only_root is True
    await client.remove(name)


async def test_disk_and_inode_limits_are_asked_for_and_reach_the_engine(
    client: AsyncNodeClient, fake: FakeRuntime
) -> None:
    """Issue 50: ``inode_limit`` typed beside ``disk_limit``; "" (the default) not sent."""
    assert "inode_limit" not in job().to_json() and "disk_limit" not in job().to_json()
    name = f"tuneplane-{unique('limits')}"
    await client.launch(unique("limits"), job(name, disk_limit="1g", inode_limit=50_000))
    labels = fake.containers[name].labels
    assert (labels[LABEL_DISK_LIMIT], labels[LABEL_INODE_LIMIT]) == (str(2**30), "50000")
    await client.remove(name)


async def test_a_run_id_that_makes_no_name_is_launched_and_found_by_the_ref_answered(
    client: AsyncNodeClient,
) -> None:
    launched = await client.launch("team/42 #3", Container(image=IMAGE))
    assert launched.ref.startswith("tuneplane-") and launched.ref != "tuneplane-team/42 #3"
    state = (await client.observe([launched.ref]))[launched.ref]
    assert state.labels["tuneplane.run-id"] == "team/42 #3"
    await client.remove(launched.ref)


async def test_the_sync_watch_hands_the_list_then_the_exit(
    client: AsyncNodeClient, node: Console, fake: FakeRuntime
) -> None:
    name = f"tuneplane-{unique('sync')}"
    await client.launch(unique("sync"), job(name))
    loop = asyncio.get_running_loop()

    def console() -> list[Jobs]:
        seen: list[Jobs] = []
        with NodeClient(url_of(node), token=TOKEN) as sync:
            for answer in sync.watch(wait=30):
                seen.append(answer)
                if len(seen) == 1:
                    loop.call_soon_threadsafe(fake.exit, name, 5)
                elif answer.jobs.get(name, JobState()).status == "exited":
                    return seen
        raise AssertionError("the watch ended")

    seen = await asyncio.wait_for(asyncio.to_thread(console), 20)
    assert seen[0].full and seen[0].jobs[name].running
    assert not seen[-1].full and seen[-1].jobs[name].exit_code == 5


# --- errors --------------------------------------------------------------------------------


async def test_each_refusal_is_its_familys_exception_with_the_nodes_words(
    client: AsyncNodeClient, node: Console, fake: FakeRuntime
) -> None:
    with pytest.raises(NoCapacity) as capacity:
        await client.launch(unique("big"), job(), requested_gpus=5)
    error = capacity.value
    assert (error.status, error.code) == (409, "no_capacity")
    assert isinstance(error, Conflict) and isinstance(error, RequestError)
    assert error.detail.startswith("not enough GPUs") and str(error).endswith(error.detail)

    name = f"tuneplane-{unique('held')}"
    await client.launch(unique("first"), job(name))
    with pytest.raises(NameHeld):
        await client.launch(unique("second"), job(name))
    fake.exit(name, 0)
    await settled(node)
    with pytest.raises(NotRunning) as not_running:
        await client.signal(name, "SIGUSR1")
    assert not_running.value.code == "not_running"

    await client.cordon("maintenance")
    with pytest.raises(Cordoned) as cordoned:
        await client.launch(unique("late"), job())
    assert "maintenance" in cordoned.value.detail
    await client.uncordon()


async def test_a_request_error_lists_every_bad_field(client: AsyncNodeClient) -> None:
    bad = {"image": "", "shm_size": "lots", "cpu_limit": -1}
    with pytest.raises(InvalidRequest) as refused:
        await client.launch("r", bad)
    error = refused.value
    assert (error.status, error.code) == (422, "invalid_field")
    fields = {entry.field for entry in error.errors}
    assert {"container.image", "container.shm_size", "container.cpu_limit"} <= fields
    assert all(entry.code and entry.detail for entry in error.errors)
    typo = Call("POST", "/node/v1/stop", lambda answer: answer, {"ref": "x", "timout": 600})
    with pytest.raises(InvalidRequest) as unknown:
        await client.call(typo)
    assert unknown.value.code == "unknown_field"
    assert [entry.field for entry in unknown.value.errors] == ["timout"]


async def test_token_route_size_and_engine_failures_map_to_their_classes(
    node: Console, client: AsyncNodeClient, fake: FakeRuntime
) -> None:
    async with AsyncNodeClient(url_of(node), token="not-the-token") as stranger:
        with pytest.raises(Unauthorized) as unauthorized:
            await stranger.health()
    assert unauthorized.value.status == 401 and "not-the-token" not in str(unauthorized.value)
    with pytest.raises(NotFound):
        await client.call(Call("GET", "/node/v1/nothing-here", lambda answer: answer))
    with pytest.raises(PayloadTooLarge):
        await client.launch("r", job(env={"BIG": "x" * 2_000_000}))
    fake.up = False
    await settled(node)
    with pytest.raises(EngineUnavailable) as unavailable:
        await client.observe(["tuneplane-x"])
    assert (unavailable.value.status, unavailable.value.code) == (503, "engine_unavailable")
    assert isinstance(unavailable.value, ServerError)
    fake.up = True


async def test_no_answer_is_unreachable_and_a_bad_setup_fails_before_asking() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with AsyncNodeClient(url, token=TOKEN) as client:
        with pytest.raises(Unreachable) as unreachable:
            await client.health()
    assert str(unreachable.value) == f"cannot reach the node at {url}: Connection refused"
    assert unreachable.value.status == 0 and unreachable.value.code == "unreachable"
    for bad in ("ftp://node:1", "http://", "http://node:port"):
        with pytest.raises(ConfigError):
            NodeClient(bad, token=TOKEN)
    with pytest.raises(ConfigError):
        NodeClient("http://node:8470", token="two\nlines")


def test_clients_share_the_systems_tls_context_and_one_with_its_own_ca_has_its_own(
    tmp_path: Path,
) -> None:
    """A console talks to thousands of nodes: a context per client read a CA bundle
    again each time (40 ms and 830 KiB each, bench/clients.py), http:// ones included."""
    plain = [Endpoint(f"http://node-{n}:8470", token=TOKEN) for n in range(3)]
    secure = [Endpoint(f"https://node-{n}:8470", token=TOKEN) for n in range(3)]
    assert len({id(endpoint.verify) for endpoint in plain + secure}) == 1
    own = Endpoint("https://node:8470", token=TOKEN, tls=Tls(cacert=make_ca(tmp_path, "ca")))
    assert own.verify is not secure[0].verify
    subjects = [ca["subject"] for ca in own.verify.get_ca_certs()]
    assert subjects == [((("commonName", "ca"),),)]


@pytest.mark.parametrize(
    ("status", "body", "expected", "code"),
    [
        (409, {"detail": "d", "code": "no_capacity"}, NoCapacity, "no_capacity"),
        # A class per code, under its status's: `except Conflict` still catches it.
        (409, {"detail": "d", "code": "engine_conflict"}, EngineConflict, "engine_conflict"),
        (409, {"detail": "d"}, Conflict, "conflict"),  # a node before codes
        (422, {"detail": "d", "code": "spec_refused"}, SpecRefused, "spec_refused"),
        (429, {"detail": "d", "code": "too_many_requests"}, TooManyRequests, "too_many_requests"),
        (418, {"detail": "d", "code": "teapot"}, RequestError, "teapot"),  # a newer node's
        (503, {"detail": "d"}, EngineUnavailable, "engine_unavailable"),
        (500, {"detail": "d", "code": "internal"}, ServerError, "internal"),
    ],
)
def test_a_code_picks_the_class_and_a_status_stands_in_for_a_missing_one(
    status: int, body: dict[str, str], expected: type[NodeError], code: str
) -> None:
    error = refusal(status, json.dumps(body).encode(), url="http://n")
    assert isinstance(error, RequestError if status < 500 else ServerError)
    assert type(error) is expected and (error.status, error.code, error.detail) == (
        status,
        code,
        "d",
    )


def test_a_507_carries_the_nodes_figures_and_none_where_it_gave_none() -> None:
    body = {"detail": "d", "code": "insufficient_storage", "needed_bytes": 9, "free_bytes": 4,
            "freeable_bytes": 2, "high_percent": 85}  # fmt: skip
    error = refusal(507, json.dumps(body).encode(), url="http://n")
    assert isinstance(error, InsufficientStorage)
    figures = (error.needed_bytes, error.free_bytes, error.freeable_bytes, error.high_percent)
    assert figures == (9, 4, 2, 85)
    older = refusal(507, b'{"detail": "d", "needed_bytes": "x"}', url="http://n")
    assert isinstance(older, InsufficientStorage) and older.needed_bytes is None


def test_an_error_page_that_is_no_json_is_its_text() -> None:
    error = refusal(502, b"<html>Bad Gateway</html>", url="http://n")
    assert error.detail == "<html>Bad Gateway</html>" and error.errors == ()


async def test_every_call_carries_the_token_and_the_protocol_and_follows_no_redirect() -> None:
    seen: list[httpx.Request] = []

    def node(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/node/v1/remove":
            return httpx.Response(307, headers={"Location": "http://elsewhere/"})
        return httpx.Response(200, json={"ok": True, "protocol": 1})

    async with AsyncNodeClient("http://n:1", token="tok", transport=httpx.MockTransport(node)) as a:
        await a.health()
        with pytest.raises(RequestError) as moved:
            await a.remove("x")
    with NodeClient("http://n:1", token="tok", transport=httpx.MockTransport(node)) as sync:
        sync.signal("x", "SIGUSR1")
    assert moved.value.status == 307 and len(seen) == 3  # never to elsewhere
    for request in seen:
        assert request.headers["Authorization"] == "Bearer tok"
        assert request.headers[PROTOCOL_HEADER] == str(PROTOCOL)
    assert json.loads(seen[2].content) == {"ref": "x", "signal": "SIGUSR1"}
    assert "tok" not in repr(a.endpoint)


# --- answers a newer or older node gives ---------------------------------------------------


def test_an_answer_with_keys_unknown_or_missing_still_reads() -> None:
    state = build(JobState, {"name": "j", "status": "running", "lease": {"ttl": 5}})
    assert (state.name, state.running, state.exit_code) == ("j", True, None)
    assert state.raw["lease"] == {"ttl": 5}  # the newer key, one raw[] away
    old = build(Health, {"ok": True, "protocol": 1})
    assert (old.features, old.protocols, old.gpus_total) == ((), (), None)
    new = build(Health, {"ok": True, "features": ["watch", "stats"], "protocols": [1, 2]})
    assert new.features == ("watch", "stats") and new.protocols == (1, 2)


def test_the_client_speaks_the_nodes_protocol() -> None:
    assert (PROTOCOL, PROTOCOL_HEADER) == (wire.PROTOCOL, wire.PROTOCOL_HEADER)


def test_a_delta_and_a_full_set_apply_to_a_copy() -> None:
    copy = {"a": JobState(name="a"), "b": JobState(name="b")}
    delta = build(Jobs, {"index": "i", "jobs": {"c": {"name": "c"}}, "removed": ["a"]})
    delta = build(Jobs, {**delta.raw, "full": False})
    delta.apply(copy)
    assert set(copy) == {"b", "c"}
    build(Jobs, {"index": "j", "jobs": {"d": {"name": "d"}}, "full": True}).apply(copy)
    assert set(copy) == {"d"}


# --- watch ---------------------------------------------------------------------------------


class Counting(httpx.AsyncBaseTransport):
    """httpx's own transport, counting the requests that went through it."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.requests = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def collect(
    client: AsyncNodeClient, into: list[Jobs], copy: dict[str, JobState], **options: Any
) -> None:
    async for answer in client.watch(**options):
        answer.apply(copy)
        into.append(answer)


async def until(predicate: Callable[[], object], timeout: float = 10) -> None:
    await wait_until(predicate, timeout=timeout)


async def test_watch_lists_then_hands_each_change_and_its_copy_is_the_list(
    client: AsyncNodeClient, node: Console, fake: FakeRuntime
) -> None:
    first = f"tuneplane-{unique('w')}"
    await client.launch(unique("w"), job(first))
    answers: list[Jobs] = []
    copy: dict[str, JobState] = {}
    watcher = asyncio.ensure_future(collect(client, answers, copy, wait=30))
    try:
        await until(lambda: answers)
        assert answers[0].full and copy[first].running
        fake.exit(first, 3)  # the fake clock never ends a wait: the exit answers
        await until(lambda: copy[first].status == "exited")
        assert copy[first].exit_code == 3 and not answers[-1].full
        second = f"tuneplane-{unique('w')}"
        await client.launch(unique("w"), job(second))
        await client.remove(first)
        await until(lambda: first not in copy and second in copy)
        await settled(node)
        assert copy == dict((await client.jobs()).jobs)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)


async def test_watch_rides_out_an_engine_outage_without_a_busy_loop(
    node: Console, fake: FakeRuntime
) -> None:
    counting = Counting()
    client = AsyncNodeClient(url_of(node), token=TOKEN, transport=counting)
    answers: list[Jobs] = []
    copy: dict[str, JobState] = {}
    backoff = Backoff(first=0.01, most=0.05)
    watcher = asyncio.ensure_future(collect(client, answers, copy, wait=30, backoff=backoff))
    try:
        await until(lambda: answers)
        fake.up = False
        await settled(node)
        before, started = counting.requests, time.monotonic()
        await until(lambda: counting.requests - before >= 5)  # asked again and again...
        asked = counting.requests - before
        assert time.monotonic() - started >= 0.01 * (asked - 1), asked  # ...each after a pause
        assert not watcher.done()  # a 503 is waited out, not raised
        fake.up = True
        await settled(node)
        name = f"tuneplane-{unique('w')}"
        await client.launch(unique("w"), job(name))
        await until(lambda: name in copy)
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await client.aclose()


async def test_a_quiet_node_is_asked_once_a_wait_and_empty_answers_are_not_handed(
    node: Console, clock: FakeClock
) -> None:
    counting = Counting()
    changes = node.app[NODE].changes
    async with AsyncNodeClient(url_of(node), token=TOKEN, transport=counting) as quiet:
        answers: list[Jobs] = []
        backoff = Backoff(first=0.01, most=0.01)
        watcher = asyncio.ensure_future(collect(quiet, answers, {}, wait=0.3, backoff=backoff))
        try:
            for asked in range(2, 7):  # the list, then a query held until its wait ends
                await until(lambda: counting.requests == asked and changes.waiting == 1)  # noqa: B023
                await clock.sleeping(0.4)  # its timer armed
                clock.advance(0.4)  # the wait (and the node's sixteenth more) runs out
            await until(lambda: counting.requests == 7 and changes.waiting == 1)
            await asyncio.sleep(0.3)
            assert counting.requests == 7  # while the node holds the query, nothing more
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
    assert [answer.full for answer in answers] == [True]  # the list; no empty answer


async def test_a_cursor_of_another_daemon_hands_the_whole_list(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    """A console that watched one daemon process and asks the next (a restart) gets
    ``full``: every job, its copy replaced."""
    before, after = await fake_node(), await fake_node()
    name = f"tuneplane-{unique('w')}"
    async with AsyncNodeClient(url_of(before), token=TOKEN) as old:
        index = (await old.jobs()).index
    async with AsyncNodeClient(url_of(after), token=TOKEN) as new:
        await new.launch(unique("w"), job(name))
        copy = {"tuneplane-gone": JobState(name="tuneplane-gone")}
        answer = await new.changes(index, wait=1)
        assert answer.full
        answer.apply(copy)
        assert set(copy) == {name}
        with pytest.raises(InvalidRequest) as malformed:
            await new.changes("not-a-cursor", wait=1)
        assert malformed.value.errors[0].field == "index"


async def test_past_the_watch_limit_a_query_is_refused_429(fake_node: MakeFakeNode) -> None:
    node = await fake_node(watch_max=1)
    async with AsyncNodeClient(url_of(node), token=TOKEN) as client:
        index = (await client.jobs()).index
        holding = asyncio.ensure_future(client.changes(index, wait=30))
        try:
            await wait_until(lambda: node.app[NODE].changes.waiting == 1, timeout=10)
            with pytest.raises(TooManyRequests):
                await client.changes(index, wait=30)
        finally:
            holding.cancel()
            await asyncio.gather(holding, return_exceptions=True)


def test_an_empty_answer_that_came_at_once_is_a_pause_never_a_busy_loop() -> None:
    watch = Watch(wait=60, index="a-1", backoff=Backoff(first=1, most=8))
    empty = Jobs(index="a-2", full=False)
    pauses = [watch.answered(empty, elapsed=0.001) for _ in range(5)]
    assert all(isinstance(pause, float) and pause > 0 for pause in pauses)
    assert pauses[-1] > pauses[0]  # type: ignore[operator]  # growing
    assert watch.answered(empty, elapsed=60) == 0.0  # the wait ran out: ask again now
    assert watch.index == "a-2"
    with pytest.raises(Unauthorized):
        watch.failed(Unauthorized("no"))


# --- what a console installs ---------------------------------------------------------------

DAEMON_ONLY = {"docker", "podman", "pynvml", "aiohttp", "pydantic", "pydantic_settings"}
DAEMON_ONLY |= {"orjson", "prometheus_client", "requests", "urllib3"}


@pytest.mark.slow  # an interpreter of its own
def test_the_client_imports_none_of_the_daemons_sdks() -> None:
    """In a fresh interpreter: only httpx and the client's own modules come in."""
    code = "import sys, json, tuneplane_node.client; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    modules = json.loads(result.stdout)
    assert "httpx" in modules
    assert not [m for m in modules if m.split(".")[0] in DAEMON_ONLY]
    ours = {m for m in modules if m.startswith("tuneplane_node")}
    assert {m for m in ours if not m.startswith("tuneplane_node.client")} == {"tuneplane_node"}


@pytest.mark.parametrize("doc", ["README.md", "docs/api.md", "clients/python/README.md"])
def test_the_examples_for_console_authors_parse_and_name_what_the_client_has(doc: str) -> None:
    text = (Path(__file__).resolve().parents[2] / doc).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks
    for block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "tuneplane_node.client":
                missing = [a.name for a in node.names if not hasattr(client_package, a.name)]
                assert not missing, f"{doc}: {missing}"


def test_a_call_carrying_registry_credentials_never_shows_them() -> None:
    """A console logs what it sends (``repr`` of a call, a container): the password and
    the identity token stay out of it; they travel in the body alone."""
    from tuneplane_node.client import calls

    secret = {"username": "u", "password": "pw-7f3a9c"}
    container = calls.Container(image="r/x:1", registry_auth=secret)
    sent: list[calls.Call[Any]] = [
        calls.launch("r-1", container, None),
        calls.pull_image("r/x:1", secret, ""),
        calls.pull_image("r/x:1", {"identity_token": "pw-7f3a9c"}, "always"),
    ]
    for call in sent:
        assert "pw-7f3a9c" not in repr(call), call
        assert "pw-7f3a9c" in json.dumps(call.body)  # ...and they are sent
    assert "pw-7f3a9c" not in repr(container)


async def test_volume_verbs_answer_typed_and_a_full_store_is_volume_store_full(
    fake_node: MakeFakeNode, file_server: FileServer, tmp_path: Path
) -> None:
    data = b"w" * 4096
    source = file_server.add("w", data)
    node = await fake_node(
        volume_root=tmp_path / "volumes",
        volume_gc_high_percent=1,
        volume_gc_low_percent=0,
        volume_insecure_hosts=[file_server.host],
        volume_allowed_networks=LOOPBACK,
    )  # any disk is above 1%: no fill fits
    async with AsyncNodeClient(url_of(node), token=TOKEN) as client:
        with pytest.raises(VolumeStoreFull) as full:
            await client.pull_volume(source, sha256(data), wait=True)
        assert isinstance(full.value, InsufficientStorage), full.value  # its family's too
        assert full.value.needed_bytes == len(data) and full.value.high_percent == 1
        listed = await client.volumes()
        assert isinstance(listed, Volumes) and listed.entries == (), listed
        [failed] = listed.fills  # the failed prefetch, with its reason
        assert failed.phase == "failed" and "no room to fill volume" in (failed.error or "")
        assert isinstance(listed.volume_store, VolumeStore) and listed.volume_store.low_percent == 0
        gc = await client.volume_gc()
        assert isinstance(gc, VolumeGc) and gc.removed == () and gc.freed_bytes == 0
        health = await client.health()
        assert health.volume_store is not None and health.volume_store.high_percent == 1
