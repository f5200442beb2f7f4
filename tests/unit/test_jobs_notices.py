"""What the node does with a notice (issue 54): one that ends the jobs cordons and drains
on its clock, each stop over by the deadline less the margin, observe saying
``preempted: <source>``; one that does not only cordons; a withdrawn one undoes what it
made and nothing else; a console's watch hears each as a node event. The job service
against the in-memory engine (tests/jobservice.py says how), the clock moved by hand."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest

from tests.fakes.clock import FakeClock
from tests.fakes.runtime import FakeRuntime
from tests.jobservice import request
from tests.support.waiting import settle
from tests.unit.test_jobs_drain import drained
from tuneplane_node.fetch.fetching import Fetcher
from tuneplane_node.jobs import Node, StoppedView
from tuneplane_node.jobs.notices.clouds import MetadataRefused
from tuneplane_node.jobs.notices.reactor import plan_for
from tuneplane_node.jobs.notices.watcher import NoticeWatcher
from tuneplane_node.jobs.words import PREEMPT, REBALANCE, Notice

MARGIN_S = 10.0  # TUNEPLANE_CLOUD_NOTICE_MARGIN_S's default


def spot(clock: FakeClock, seconds: float = 120) -> Notice:
    deadline = clock.now() + timedelta(seconds=seconds)
    return Notice("aws", PREEMPT, "aws spot terminate", True, deadline, "spot terminate")


def test_a_notices_plan_ends_every_stop_by_its_deadline_less_the_margin() -> None:
    clock = FakeClock()
    plan = plan_for(spot(clock).deadline, clock.now(), margin_s=MARGIN_S, stop_s=30)
    assert (plan.grace, plan.warn_s) == (30, 80)  # the warning at once, 110 s in all
    hurried = plan_for(spot(clock, 30).deadline, clock.now(), margin_s=MARGIN_S, stop_s=30)
    assert (hurried.grace, hurried.warn_s) == (10, 10)  # half the 20 s left for the signal
    late = plan_for(spot(clock, 5).deadline, clock.now(), margin_s=MARGIN_S, stop_s=30)
    assert (late.grace, late.warn_s) == (0, 0)  # past the margin already: at once
    assert plan_for(None, clock.now(), margin_s=MARGIN_S, stop_s=30).grace == 30


@pytest.mark.slow  # a drain's passes, run to the end
async def test_a_spot_notice_cordons_and_drains_and_observe_says_preempted(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1", 1))
    notice, heard = spot(fake.clock), fake.clock.now()

    await node.notices.react("aws", [notice])
    await asyncio.wait_for(drained(node, fake.clock), 5)

    assert node.jobs.node.reason == notice.reason and node.jobs.node.notice == notice.key
    view = (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"]
    assert isinstance(view, StoppedView) and view.stop_reason == "preempted: aws"
    [standing] = node.notices.current()
    assert standing.notice == notice and standing.since == heard


async def test_a_rebalance_only_cordons_and_its_withdrawal_uncordons(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1", 1))
    advice = Notice("aws", REBALANCE, "aws rebalance", False, None, "rebalance recommendation")

    await node.notices.react("aws", [advice])
    assert node.jobs.node.state == "cordoned" and node.jobs.node.notice == advice.key
    assert fake.containers["tuneplane-r1"].status == "running"  # nothing stopped

    await node.notices.react("aws", [])
    assert node.jobs.node.state == "ready" and node.notices.current() == ()


async def test_a_withdrawn_notice_leaves_what_the_operator_decided_since(node: Node) -> None:
    advice = Notice("gcp", REBALANCE, "gcp MIGRATE_ON_HOST_MAINTENANCE", False)
    await node.notices.react("gcp", [advice])
    await node.jobs.cordon("disk swap")  # the operator takes over

    await node.notices.react("gcp", [])

    assert (node.jobs.node.state, node.jobs.node.reason) == ("cordoned", "disk swap")


async def test_a_sources_notices_are_its_own(node: Node) -> None:
    """A source that answers nothing withdraws its own notices, never another's."""
    advice = Notice("aws", REBALANCE, "aws rebalance", False)
    await node.notices.react("aws", [advice])
    await node.notices.react("logind", [])
    assert [s.notice for s in node.notices.current()] == [advice]


async def test_a_consoles_watch_hears_a_notice_at_once_as_a_node_event(
    node: Node, fake: FakeRuntime
) -> None:
    listing = await node.changes.list()
    waiting = asyncio.ensure_future(node.changes.query(listing.index, wait=60))
    await asyncio.sleep(0)
    assert not waiting.done()

    await node.notices.react("aws", [spot(fake.clock)])
    answer = await asyncio.wait_for(waiting, 5)

    assert answer.node and not answer.full
    quiet = await node.changes.query(answer.index, wait=0)
    assert not quiet.node  # told once


class Scripted:
    """A cloud's reader that answers what the test scripts: notices, or a failure."""

    name, waits, base = "aws", False, "http://169.254.169.254"

    def __init__(self, *answers: list[Notice] | Exception) -> None:
        self.answers = list(answers)
        self.reads = 0

    async def read(self, http: object) -> list[Notice]:
        self.reads += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.mark.slow  # sessions of a real client, opened and closed at each backoff
async def test_a_service_that_stops_answering_withdraws_nothing_and_is_said_once(
    node: Node, fake: FakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 54: an endpoint that does not answer or answers garbage costs nothing
    visible (health unchanged, one log line, backoff), and no notice is invented."""
    caplog.set_level(logging.INFO)
    advice = Notice("aws", REBALANCE, "aws rebalance", False)
    broken = MetadataRefused("/latest/meta-data/... answered no JSON")
    reader = Scripted([advice], broken, broken, broken, [advice])
    watcher = NoticeWatcher(
        reader, fetcher=Fetcher(stall_s=5), reactor=node.notices, poll_s=5, clock=fake.clock
    )
    running = asyncio.create_task(watcher.run())
    try:
        for step in (5, 5, 10, 20, 5):  # a poll, then the backoff doubling, then a poll
            await fake.clock.sleeping(step)
            fake.clock.advance(step)
            await settle()
        assert [s.notice for s in node.notices.current()] == [advice]  # never withdrawn
        assert node.jobs.node.state == "cordoned"
        said = [r for r in caplog.records if "does not answer as documented" in r.message]
        assert len(said) == 1 and reader.reads == 6  # 3 failed, then a poll after the answer
        assert any("answers again" in r.message for r in caplog.records)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
