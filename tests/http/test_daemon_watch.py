"""GET /node/v1/jobs and its blocking query, over a real socket, in front of the
in-memory engine behind the event-fed state cache: the list, every kind of change
reaching every watcher in order and once, the cursors that answer the whole list, the
bounds, and a seeded walk whose console always holds what the list holds."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import IMAGE, MakeFakeNode
from tests.fakes.clock import FakeClock
from tests.fakes.runtime import FakeRuntime
from tests.support.console import HEADERS, TOKEN, Console
from tests.support.jobs import job
from tests.support.nodes import node_cache
from tests.support.waiting import wait_until
from tuneplane_node.daemon.state import NODE
from tuneplane_node.jobs.observe.watch import ChangeLog
from tuneplane_node.wire import PROTOCOL, PROTOCOL_HEADER

# Slow: the list and the watch end to end over a real socket.
pytestmark = pytest.mark.slow

MISSING = "registry.test/missing:1"
WALK_STEPS = int(os.environ.get("TUNEPLANE_WATCH_WALK_STEPS", "150"))
SEED = int(os.environ.get("TUNEPLANE_MODEL_SEED", "20261130"))
OBSERVER = "observer-0123456789abcdef"


def changes_of(node: Console) -> ChangeLog:
    return node.app[NODE].changes


async def waiting(node: Console, count: int) -> None:
    """Until ``count`` queries wait on the node's change log."""
    await wait_until(lambda: changes_of(node).waiting == count, timeout=10)


class Copy:
    """A console's copy of the node's jobs, kept by applying every answer."""

    def __init__(self, listing: dict[str, Any]) -> None:
        self.index: str = listing["index"]
        self.jobs: dict[str, Any] = dict(listing["jobs"])
        self.seen: list[tuple[str, str | None]] = []  # (ref, status; None: removed)
        self.fulls = 0

    def apply(self, answer: dict[str, Any]) -> None:
        if answer["full"]:
            self.fulls += 1
            self.jobs = dict(answer["jobs"])
        else:
            for ref, state in answer["jobs"].items():
                assert self.jobs.get(ref) != state, f"{ref} answered twice as {state}"
                self.jobs[ref] = state
                self.seen.append((ref, _status(state)))
            for ref in answer["removed"]:  # one made and gone between two queries may be
                self.jobs.pop(ref, None)
                self.seen.append((ref, None))
        self.index = answer["index"]


def _status(state: dict[str, Any]) -> str:
    phase = state.get("pending_phase")
    done = state.get("pending_bytes_done")
    if phase is not None:
        return f"{phase}:{done}" if phase == "pulling" else phase
    return f"{state['status']}:{state['exit_code']}:{state['oom_killed']}"


async def keep_watching(node: Console, copy: Copy) -> None:
    while True:
        copy.apply(await node.watch(copy.index, 300))


# --- the list --------------------------------------------------------------------------------


async def test_the_list_holds_every_container_and_pending_launch_in_observes_shape(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    running, _ = await node.launch(image=IMAGE)
    exited, _ = await node.launch(image=IMAGE)
    fake.exit(exited, 3)
    pulling, _ = await node.launch(image=MISSING, gpus=1)
    listing = await node.jobs()
    assert set(listing) == {"index", "jobs"}
    refs = [running, exited, pulling]
    observed = await node.observe(*refs)
    assert {ref: listing["jobs"][ref] for ref in refs} == observed
    assert listing["jobs"][pulling]["pending_phase"] == "pulling"
    assert listing["jobs"][exited]["exit_code"] == 3


async def test_the_list_leaves_out_containers_that_are_not_the_nodes(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    fake.create_outside(replace(job(["sleep", "1"], image=IMAGE), labels={}))
    assert (await node.jobs())["jobs"] == {}


# --- every change, every watcher ---------------------------------------------------------


async def test_every_kind_of_change_reaches_every_watcher_in_order_and_once(
    fake_node: MakeFakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    """Twenty watchers, each change made only once every watcher has taken the last:
    each one sees every change, in the order it happened, none twice."""
    node = await fake_node()
    log = changes_of(node)
    copies = [Copy(await node.jobs()) for _ in range(20)]
    watchers = [asyncio.ensure_future(keep_watching(node, copy)) for copy in copies]

    async def step(change: Callable[[], object]) -> None:
        before = log.position
        result = change()
        if asyncio.iscoroutine(result):
            await result
        await wait_until(lambda: log.position > before, timeout=10)
        await wait_until(lambda: all(c.index == str(log.cursor) for c in copies), timeout=10)

    try:
        await waiting(node, 20)
        first, second, third = "tuneplane-w-1", "tuneplane-w-2", "tuneplane-w-3"
        await step(lambda: node.launch(image=IMAGE, name=first))  # created and started: one
        await step(lambda: node.launch(image=MISSING, name=second, gpus=1))
        await fake.pulling.wait()
        await step(lambda: fake.pull_of(MISSING).report(10, 100))
        clock.advance(1.0)  # progress is a change at most once a second
        await step(lambda: fake.pull_of(MISSING).report(50, 100))
        fake.images.add(MISSING)
        await step(fake.pull_of(MISSING).finish)  # starting, then running: maybe in one
        await wait_until(lambda: all(c.jobs[second]["status"] == "running" for c in copies))
        await step(lambda: fake.exit(first, 3))
        await step(lambda: node.launch(image=IMAGE, name=third))
        await step(lambda: fake.exit(third, 137, oom=True))
        await step(lambda: node.remove(first))
        await step(lambda: fake.exit(second, 0))
    finally:
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
    listing = await node.jobs()

    # The pulled launch's "starting" may be read together with its start: in one
    # answer, or two; every other change is its own step, seen by every watcher.
    def steps(copy: Copy) -> list[tuple[str, str | None]]:
        return [seen for seen in copy.seen if seen != (second, "starting")]

    expected = steps(copies[0])
    assert expected[:4] == [
        (first, "running:None:False"),
        (second, "pulling:0"),
        (second, "pulling:10"),
        (second, "pulling:50"),
    ]
    assert expected[-6:] == [
        (second, "running:None:False"),
        (first, "exited:3:False"),
        (third, "running:None:False"),
        (third, "exited:137:True"),
        (first, None),
        (second, "exited:0:False"),
    ]
    assert len(expected) == 10
    for copy in copies:
        assert steps(copy) == expected  # none lost, none twice, in order
        assert copy.jobs == listing["jobs"]
        assert copy.fulls == 0


async def test_progress_is_a_change_at_most_once_a_second(
    fake_node: MakeFakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await fake_node()
    ref, _ = await node.launch(image=MISSING)
    await fake.pulling.wait()
    copy = Copy(await node.jobs())
    fake.pull_of(MISSING).report(1, 100)
    copy.apply(await node.watch(copy.index))
    assert copy.jobs[ref]["pending_bytes_done"] == 1
    for done in range(2, 40):
        fake.pull_of(MISSING).report(done, 100)
    assert (await node.watch(copy.index, 0))["jobs"] == {}  # held for the rest of the second
    query = asyncio.ensure_future(node.watch(copy.index))
    await waiting(node, 1)
    clock.advance(1.0)
    copy.apply(await asyncio.wait_for(query, 10))
    assert copy.jobs[ref]["pending_bytes_done"] == 39  # the latest, once


async def test_a_burst_of_changes_between_two_queries_is_one_set(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    old = [fake.create_outside(job(["sleep", "1"], image=IMAGE)) for _ in range(125)]
    copy = Copy(await node.jobs())
    for container in old:  # 125 removals, 250 creates and starts, 125 exits: 1,000 changes
        await fake.remove(container.id)
    made = [fake.create_outside(job(["sleep", "1"], image=IMAGE)) for _ in range(250)]
    for container in made[:125]:
        fake.exit(container.spec.name, 1)
    answer = await node.watch(copy.index)
    assert sorted(answer["removed"]) == sorted(c.spec.name for c in old)
    assert sorted(answer["jobs"]) == sorted(c.spec.name for c in made)  # each once, as now
    statuses = [answer["jobs"][c.spec.name]["status"] for c in made]
    assert statuses == ["exited"] * 125 + ["running"] * 125
    assert answer["full"] is False
    copy.apply(answer)
    assert copy.jobs == (await node.jobs())["jobs"]
    assert (await node.watch(copy.index, 0))["jobs"] == {}  # nothing left over


async def test_a_stop_shows_its_phase_then_the_exit(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    ref, _ = await node.launch(image=IMAGE)
    copy = Copy(await node.jobs())
    await node.stop(ref)
    answer = await node.watch(copy.index)
    copy.apply(answer)
    assert copy.jobs[ref]["status"] == "exited"
    assert "stopping" not in copy.jobs[ref]  # the mark is gone once the stop is over
    assert copy.jobs == (await node.jobs())["jobs"]


# --- the cursors that answer every job ------------------------------------------------------


async def test_a_cursor_of_another_process_answers_every_job(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    first = await fake_node()
    await first.launch(image=IMAGE)
    old = await first.jobs()
    assert len(old["jobs"]) == 1
    await first.client.close()
    restarted = await fake_node()
    answer = await restarted.watch(old["index"])
    assert answer["full"] is True
    assert answer["jobs"] == old["jobs"] == (await restarted.jobs())["jobs"]
    assert answer["index"].split("-")[0] != old["index"].split("-")[0]


async def test_a_cursor_older_than_the_history_answers_every_job(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node(watch_history=3)
    copy = Copy(await node.jobs())
    for _ in range(4):
        await node.launch(image=IMAGE)
    answer = await node.watch(copy.index)
    assert answer["full"] is True and len(answer["jobs"]) == 4
    kept = answer["index"]
    for _ in range(3):  # within the history: what changed only
        await node.launch(image=IMAGE)
    assert len((await node.watch(kept))["jobs"]) == 3


async def test_a_full_answer_is_counted_and_the_waiting_are_a_gauge(
    fake_node: MakeFakeNode,
) -> None:
    node = await fake_node()
    await node.watch("0123456789abcdef-0")
    query = asyncio.ensure_future(node.watch((await node.jobs())["index"]))
    await waiting(node, 1)
    async with node.client.get("/metrics", headers=HEADERS) as response:
        text = await response.text()
    query.cancel()
    assert "tuneplane_node_watch_full_resyncs_total 1.0" in text
    assert "tuneplane_node_watch_answers_total 1.0" in text
    assert "tuneplane_node_watch_waiting 1.0" in text


# --- refusals and bounds ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"index": "yesterday"}, "index"),
        ({"index": "0123456789abcdef"}, "index"),
        ({"index": "0123456789ABCDEF-1"}, "index"),
        ({"index": "0123456789abcdef-" + "9" * 20}, "index"),
        ({"index": "0123456789abcdef-1", "wait": "301"}, "wait"),
        ({"index": "0123456789abcdef-1", "wait": "-1"}, "wait"),
        ({"index": "0123456789abcdef-1", "wait": "soon"}, "wait"),
    ],
)
async def test_a_malformed_cursor_or_wait_is_a_422_naming_it(
    fake_node: MakeFakeNode, params: dict[str, str], field: str
) -> None:
    node = await fake_node()
    status, body = await node.call("GET", "/node/v1/jobs", params=params)
    assert status == 422 and body["detail"].startswith(f"{field}: "), body


async def test_a_quiet_query_answers_nothing_after_its_wait(
    fake_node: MakeFakeNode, clock: FakeClock
) -> None:
    node = await fake_node()
    index = (await node.jobs())["index"]
    query = asyncio.ensure_future(node.watch(index, 16))
    await waiting(node, 1)
    clock.advance(16.5)
    assert not query.done() or (await query)["jobs"] == {}  # the spread: up to a 16th more
    clock.advance(1.0)
    answer = await asyncio.wait_for(query, 10)
    assert answer == {"index": index, "jobs": {}, "removed": [], "full": False}


async def test_past_the_most_waiting_queries_the_next_is_a_429(fake_node: MakeFakeNode) -> None:
    node = await fake_node(watch_max=2)
    index = (await node.jobs())["index"]
    queries = [asyncio.ensure_future(node.watch(index)) for _ in range(2)]
    await waiting(node, 2)
    status, body = await node.call("GET", "/node/v1/jobs", params={"index": index})
    assert status == 429 and "TUNEPLANE_WATCH_MAX" in body["detail"]
    assert (await node.call("GET", "/node/v1/jobs", params={"index": index, "wait": "0"}))[0] == 200
    for query in queries:
        query.cancel()


async def vanishing_watch(node: Console, index: str, token: str = TOKEN) -> asyncio.StreamWriter:
    """A watch query sent over a socket of its own, for its client to vanish from."""
    server = node.client.server
    _, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        f"GET /node/v1/jobs?index={index}&wait=300 HTTP/1.1\r\nHost: node\r\n"
        f"Authorization: Bearer {token}\r\n{PROTOCOL_HEADER}: {PROTOCOL}\r\n\r\n".encode()
    )
    await writer.drain()
    return writer


async def freed_within_a_second(node: Console) -> None:
    started = time.monotonic()
    await wait_until(lambda: changes_of(node).waiting == 0, timeout=5)
    assert time.monotonic() - started < 1.0


async def test_clients_that_vanish_free_their_watch_slots_within_a_second(
    fake_node: MakeFakeNode,
) -> None:
    """Issue 36, finding 1: slots stayed taken for the queries' wait (300 s) after their
    clients went, and the console's watch was a 429 meanwhile."""
    node = await fake_node(watch_max=4, as_served=True)
    index = (await node.jobs())["index"]
    writers = [await vanishing_watch(node, index) for _ in range(4)]
    await waiting(node, 4)
    assert (await node.call("GET", "/node/v1/jobs", params={"index": index}))[0] == 429
    for number, writer in enumerate(writers):  # a clean close, or a reset
        writer.close() if number % 2 else writer.transport.abort()
    await freed_within_a_second(node)
    query = asyncio.ensure_future(node.watch(index))
    await waiting(node, 1)
    ref, _ = await node.launch(image=IMAGE)
    assert ref in (await asyncio.wait_for(query, 10))["jobs"]


async def test_a_console_timing_out_before_its_wait_leaves_no_slot_behind(
    fake_node: MakeFakeNode,
) -> None:
    """A console's HTTP timeout shorter than its ``wait``: each query it gave up on is
    let go, so the next one is never a 429."""
    node = await fake_node(watch_max=1, as_served=True)
    index = (await node.jobs())["index"]
    for _ in range(3):
        with pytest.raises(asyncio.TimeoutError):
            await node.client.get(
                "/node/v1/jobs",
                params={"index": index, "wait": "300"},
                headers=HEADERS,
                timeout=aiohttp.ClientTimeout(total=0.2),
            )
        await freed_within_a_second(node)


async def test_observers_never_take_the_slots_kept_for_consoles(
    fake_node: MakeFakeNode, tmp_path: Path
) -> None:
    """A quarter of the slots (at least one) waits for ``full`` tokens: dashboards
    filling the rest leave the console's watch working."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{TOKEN} name=console\n{OBSERVER} name=grafana scope=observe\n")
    node = await fake_node(node_token=None, node_token_file=tokens, watch_max=4, as_served=True)
    index = (await node.jobs())["index"]
    writers = [await vanishing_watch(node, index, OBSERVER) for _ in range(3)]
    await waiting(node, 3)
    observer = {**HEADERS, "Authorization": f"Bearer {OBSERVER}"}
    params = {"index": index}
    status, body = await node.call("GET", "/node/v1/jobs", params=params, headers=observer)
    assert status == 429 and "kept for consoles" in body["detail"], body
    query = asyncio.ensure_future(node.watch(index))
    await waiting(node, 4)
    ref, _ = await node.launch(image=IMAGE)
    assert ref in (await asyncio.wait_for(query, 10))["jobs"]
    for writer in writers:
        writer.close()


async def test_while_the_engine_is_down_a_waiting_query_is_a_503_never_removed(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    ref, _ = await node.launch(image=IMAGE)
    copy = Copy(await node.jobs())
    query = asyncio.ensure_future(node.call("GET", "/node/v1/jobs", params={"index": copy.index}))
    await waiting(node, 1)
    fake.up = False
    status, body = await asyncio.wait_for(query, 10)
    assert status == 503 and "engine unreachable" in body["detail"]
    assert (await node.call("GET", "/node/v1/jobs"))[0] == 503
    fake.up = True
    await node.settle()  # type: ignore[misc]
    answer = await node.watch(copy.index, 0)
    assert answer["removed"] == [] and ref not in answer["jobs"]  # nothing changed meanwhile


async def test_a_stopping_daemon_answers_every_waiting_query_at_once(
    fake_node: MakeFakeNode,
) -> None:
    node = await fake_node()
    index = (await node.jobs())["index"]
    queries = [asyncio.ensure_future(node.watch(index)) for _ in range(5)]
    await waiting(node, 5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    closing = asyncio.ensure_future(node.client.server.close())
    answers = await asyncio.wait_for(asyncio.gather(*queries), 10)
    assert loop.time() - started < 5  # not the queries' wait, nor the shutdown's grace
    assert all(answer["jobs"] == {} and answer["index"] == index for answer in answers)
    await closing


# --- the walk ---------------------------------------------------------------------------------


class Walk:
    """Launches, exits, removals, pulls, restarts of the daemon and of the engine, and
    queries, at random; after each query the console's copy is the node's list."""

    def __init__(self, make: MakeFakeNode, fake: FakeRuntime, clock: FakeClock, seed: int):
        self.make, self.fake, self.clock = make, fake, clock
        self.rng = random.Random(seed)
        self.names = [f"tuneplane-walk-{n}" for n in range(8)]

    async def run(self, steps: int) -> Copy:
        self.node = await self.make()
        copy = Copy(await self.node.jobs())
        actions = [self.launch, self.launch, self.exit, self.remove, self.pull, self.restart]
        for _ in range(steps):
            await self.rng.choice([*actions, self.engine_restart])()
            if self.rng.random() < 0.5:
                await self.check(copy)
        await self.check(copy)
        return copy

    async def check(self, copy: Copy) -> None:
        """At the same index, the console's copy is the list. A launch's background task
        may change a job between the two requests: then the console asks again."""
        for _ in range(20):
            copy.apply(await self.node.watch(copy.index, 0))
            listing = await self.node.jobs()
            if listing["index"] == copy.index:
                assert copy.jobs == listing["jobs"]
                return
        raise AssertionError("the node's index never held still")

    async def launch(self) -> None:
        image = self.rng.choice([IMAGE, IMAGE, MISSING])
        name = self.rng.choice(self.names)
        await self.node.call(
            "POST",
            "/node/v1/launch",
            json={
                "run_id": name.removeprefix("tuneplane-"),
                "requested_gpus": self.rng.randint(0, 1),
                "container": {"name": name, "image": image, "command": ["sleep", "1"]},
            },
        )

    async def exit(self) -> None:
        running = [c for c in self.fake.containers.values() if c.status == "running"]
        if running:
            container = self.rng.choice(running)
            self.fake.exit(
                container.spec.name, self.rng.choice([0, 1, 137]), oom=self.rng.random() < 0.2
            )

    async def remove(self) -> None:
        await self.node.remove(self.rng.choice(self.names))

    async def pull(self) -> None:
        pulls = [p for p in self.fake.pulls if not p.done.done()]
        if not pulls:
            return
        pull = self.rng.choice(pulls)
        choice = self.rng.random()
        if choice < 0.4:
            pull.report(self.rng.randint(1, 99), 100)
            self.clock.advance(self.rng.choice([0.0, 1.0]))
        elif choice < 0.8:
            self.fake.images.add(pull.image)
            pull.finish()
        else:
            pull.fail("manifest unknown")

    async def restart(self) -> None:
        if self.rng.random() < 0.3:
            await self.node.client.close()
            self.node = await self.make()

    async def engine_restart(self) -> None:
        cache = node_cache(self.node).cache
        syncs = cache.syncs
        self.fake.close_streams()  # the cache resyncs from a fresh list
        await wait_until(lambda: cache.synced and cache.syncs > syncs, timeout=10)


@pytest.mark.slow  # a model walk of a second and more
async def test_a_console_applying_every_answer_holds_what_the_list_holds(
    fake_node: MakeFakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    copy = await Walk(fake_node, fake, clock, SEED).run(WALK_STEPS)
    assert copy.seen, "the walk changed nothing"


async def test_a_failed_pull_reaches_a_waiting_query_with_its_reason(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    ref, _ = await node.launch(image=MISSING, gpus=1)
    await fake.pulling.wait()
    copy = Copy(await node.jobs())
    query = asyncio.ensure_future(node.watch(copy.index))
    await waiting(node, 1)
    fake.pull_of(MISSING).fail("manifest unknown")
    copy.apply(await asyncio.wait_for(query, 10))
    state = copy.jobs[ref]
    assert (state["status"], state["pending_phase"]) == ("dead", "failed")
    assert "manifest unknown" in state["pending_error"]
