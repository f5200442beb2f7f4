"""The node's own stops warn a job as it asked at launch (``container.warn_signal``,
``container.warn_s``, written on the container), else as the operator said
(``TUNEPLANE_JOB_WARN_SIGNAL``, ``TUNEPLANE_JOB_WARN_S``). Over the in-memory engine."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE, MakeFakeNode, fake_settings
from tests.fakes.runtime import FakeRuntime
from tests.jobservice import request
from tests.support.nodes import fake_node_of
from tests.unit.test_jobs_drain import drained
from tuneplane_node.jobs import Node, StoppedView, StopPlan
from tuneplane_node.jobs.stopper import Stopper
from tuneplane_node.jobs.words import PREEMPT, Notice
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.wire.values import LABEL_WARN_S, LABEL_WARN_SIGNAL

pytestmark = pytest.mark.slow  # each test runs a daemon over a socket


async def test_the_launchs_warning_is_written_on_the_container_and_warns_a_drain(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    ref, _ = await node.launch(image=IMAGE, run_id="r1", warn_signal="SIGUSR1", warn_s=45)
    labels = fake.containers[ref].labels
    assert (labels[LABEL_WARN_SIGNAL], labels[LABEL_WARN_S]) == ("SIGUSR1", "45")
    fake.containers[ref].handlers["SIGUSR1"] = 0  # checkpoints, exits 0

    await node.ok("POST", "/node/v1/drain", json={"reason": "kernel"})  # no warning of its own
    state = await node.wait_for(ref, "status", "exited", timeout=10)

    assert fake.signals == [(ref, "SIGUSR1")]  # the job's warning, no stop signal needed
    assert (state["exit_code"], state["stop_reason"]) == (0, "drain: kernel")


async def test_the_operators_warning_is_every_jobs_that_gave_none(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node(job_warn_signal="usr2", job_warn_s=7)
    plain, _ = await node.launch(image=IMAGE, run_id="r1", warn_signal="", warn_s="")
    own, _ = await node.launch(image=IMAGE, run_id="r2", warn_signal="SIGHUP")
    for ref in (plain, own):
        fake.containers[ref].handlers["SIGUSR2"] = fake.containers[ref].handlers["SIGHUP"] = 0
    assert LABEL_WARN_SIGNAL not in fake.containers[plain].labels  # the operator's, not written

    await node.ok("POST", "/node/v1/drain", json={})
    await node.wait_for(plain, "status", "exited", timeout=10)
    await node.wait_for(own, "status", "exited", timeout=10)

    assert sorted(fake.signals) == [(plain, "SIGUSR2"), (own, "SIGHUP")]


async def test_a_drain_with_a_warning_of_its_own_keeps_it(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node(job_warn_signal="SIGUSR2")
    ref, _ = await node.launch(image=IMAGE, run_id="r1", warn_signal="SIGHUP")
    fake.containers[ref].handlers["SIGUSR1"] = 0
    await node.ok("POST", "/node/v1/drain", json={"warn_signal": "SIGUSR1", "warn_s": 5})
    await node.wait_for(ref, "status", "exited", timeout=10)
    assert fake.signals == [(ref, "SIGUSR1")]


@pytest.mark.parametrize(
    ("field", "value"),
    [("warn_signal", "SIGKILL"), ("warn_signal", True), ("warn_s", -1), ("warn_s", 10**9),
     ("warn_s", "ten"), ("warn_s", True)],
)  # fmt: skip
async def test_a_bad_warning_is_refused_naming_its_field(
    fake_node: MakeFakeNode, fake: FakeRuntime, field: str, value: object
) -> None:
    node = await fake_node()
    container: dict[str, Any] = {field: value}
    _, answer = await node.launch(image=IMAGE, expect=422, **container)
    assert answer["detail"].startswith(f"container.{field}:")
    assert fake.containers == {}


def warned(stopper: Stopper, labels: dict[str, str], plan: StopPlan) -> StopPlan:
    state = ContainerState(name="j", exists=True, status="running", labels=labels)
    return stopper.warned(state, plan)


async def test_a_notices_clock_bounds_the_warning_the_job_asked_for(
    fake: FakeRuntime, tmp_path: Path
) -> None:
    settings = fake_settings(tmp_path, job_warn_signal="SIGUSR2", job_warn_s=30)
    node = fake_node_of(fake, settings)
    try:
        asked = {LABEL_WARN_SIGNAL: "SIGUSR1", LABEL_WARN_S: "600"}
        notice = StopPlan(grace=10, warn_s=90)
        expected = StopPlan(grace=10, warn_signal="SIGUSR1", warn_s=90)
        assert warned(node.stopper, asked, notice) == expected
        assert warned(node.stopper, {}, StopPlan()) == StopPlan(warn_signal="SIGUSR2", warn_s=30)
        assert warned(node.stopper, {LABEL_WARN_S: "nan"}, StopPlan()).warn_s == 30
    finally:
        await node.close()


async def test_a_notices_drain_warns_a_job_with_its_own_signal(
    node: Node, fake: FakeRuntime
) -> None:
    """Issue 54's drains stop through `Stopper.stop_by_node`: the job's warning first."""
    spec = replace(request("r1").container, warn_signal="SIGUSR1", warn_s=600)
    await node.jobs.launch(replace(request("r1"), container=spec))
    fake.containers["tuneplane-r1"].handlers["SIGUSR1"] = 0
    notice = Notice("aws", PREEMPT, "aws spot", True, fake.clock.now() + timedelta(seconds=120))

    await node.notices.react("aws", [notice])
    await asyncio.wait_for(drained(node, fake.clock), 5)

    assert fake.signals == [("tuneplane-r1", "SIGUSR1")]
    view = (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"]
    assert isinstance(view, StoppedView) and view.stop_reason == "preempted: aws"
