"""JSON log lines about a job carry its ``run_id`` and ``ref`` (issue 25, finding 5): a
failed pull, a failed launch, a stop that needed SIGKILL, and the lines on the way."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from tests.fakes.runtime import FakeRuntime
from tuneplane_node.jobs import Node, StopPlan
from tuneplane_node.logformat import JsonFormatter
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import LABEL_RUN_ID, Launch

MISSING = "registry.test/missing:1"
IMAGE = "registry.test/trainer:1"


def request(run_id: str, gpus: int = 0, image: str = IMAGE) -> Launch:
    spec = ContainerSpec(
        name=f"tuneplane-{run_id}", image=image, command=("/bin/train",),
        labels={LABEL_RUN_ID: run_id},
    )  # fmt: skip
    return Launch(run_id, gpus, spec)


def lines_about(caplog: pytest.LogCaptureFixture, ref: str) -> list[dict[str, object]]:
    formatter = JsonFormatter()
    lines = [json.loads(formatter.format(record)) for record in caplog.records]
    return [line for line in lines if ref in str(line["message"])]


async def test_every_line_about_a_job_carries_its_run_id_and_ref(
    node: Node, fake: FakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tuneplane_node")
    await node.jobs.launch(request("pulled", 1, image=MISSING))
    await fake.pulling.wait()
    fake.pulls[-1].fail("manifest unknown")
    for _ in range(100):
        if node.pending.get("tuneplane-pulled").phase == "failed":  # type: ignore[union-attr]
            break
        await asyncio.sleep(0.01)
    await node.jobs.launch(request("stubborn", 2))
    fake.containers["tuneplane-stubborn"].ignores_sigterm = True
    await node.jobs.stop("tuneplane-stubborn", StopPlan(grace=None))  # SIGKILL after 0.05 s

    pulled = lines_about(caplog, "tuneplane-pulled")
    stubborn = lines_about(caplog, "tuneplane-stubborn")
    said = [str(line["message"]) for line in pulled + stubborn]
    assert any("pull of registry.test/missing:1 for tuneplane-pulled: failed" in m for m in said)
    assert any(m.startswith("launch tuneplane-pulled failed: ") for m in said), said
    assert any(m.startswith("stopping tuneplane-stubborn: still running after") for m in said)
    for run_id, lines in (("pulled", pulled), ("stubborn", stubborn)):
        for line in lines:
            assert (line.get("run_id"), line.get("ref")) == (run_id, f"tuneplane-{run_id}"), line
