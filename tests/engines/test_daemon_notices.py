"""The cloud's notices on the real engines (issue 54): a fake metadata service of each
cloud on loopback, a daemon watching it, a job that catches its warning signal and
writes its checkpoint to a mount. The notice cordons the node, the job hears its warning
at once and saves, every job is stopped before the deadline less the margin, observe says
``preempted`` with the source, and a console's watch hears the node event."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeNode
from tests.engines.test_daemon_signals import ready, trapping
from tests.metadataserver import Metadata
from tests.support.console import Console
from tests.support.nodes import storage_root

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]
NOTICE_S = 120  # the notice: a deadline two minutes out
MARGIN_S = 10  # TUNEPLANE_CLOUD_NOTICE_MARGIN_S's default
# A notice is read on the next poll (1 s here) and acted on in the same turn; the
# issue's goal is 2 s, the bound adds a busy CI machine's margin to it.
HEARD_S = 6


def _aws(metadata: Metadata, deadline: datetime) -> None:
    metadata.spot = {"action": "terminate", "time": deadline.strftime("%Y-%m-%dT%H:%M:%SZ")}


def _gcp(metadata: Metadata, deadline: datetime) -> None:
    window = {"windowStartTime": deadline.strftime("%Y-%m-%dT%H:%M:%SZ")}
    metadata.gcp_set(maintenanceEvent="TERMINATE_ON_HOST_MAINTENANCE", upcomingMaintenance=window)


def _azure(metadata: Metadata, deadline: datetime) -> None:
    metadata.events = [{
        "EventId": "A123BC45-1234-5678-AB90-ABCDEF123456", "EventType": "Preempt",
        "ResourceType": "VirtualMachine", "Resources": [metadata.vm],
        "EventStatus": "Scheduled", "NotBefore": format_datetime(deadline, usegmt=True),
    }]  # fmt: skip


NOTICES: dict[str, tuple[Callable[[Metadata, datetime], None], str]] = {
    "aws": (_aws, "preempted: aws"),
    "gcp": (_gcp, "maintenance: gcp"),
    "azure": (_azure, "preempted: azure"),
}


async def _heard(node: Console, index: str) -> tuple[float, Any]:
    """The watch's first answer that carries the node's event, and when it came."""
    while True:
        answer = await node.watch(index, wait=30)
        if answer.get("node") is not None:
            return time.monotonic(), answer["node"]
        index = answer["index"]


@pytest.mark.slow
@pytest.mark.parametrize("cloud", sorted(NOTICES))
@pytest.mark.parametrize("engine", ENGINES)
async def test_a_notice_cordons_warns_the_job_which_saves_and_every_job_ends_in_time(
    make_node: MakeNode, engine: str, cloud: str, metadata: Metadata, tmp_path: Path
) -> None:
    node = await make_node(
        engine, cloud_notices=cloud, cloud_metadata_url=metadata.url, cloud_notice_poll_s=1
    )
    ckpt = storage_root(tmp_path)
    save = "'echo saving; echo step-4300 > /ckpt/last; exit 0' USR1"
    saver, _ = await node.launch(
        trapping(save), mounts=[[str(ckpt), "/ckpt"]], warn_signal="SIGUSR1", warn_s=60
    )
    plain, _ = await node.launch(trapping("'echo hup' HUP"))  # no warning: stopped by TERM
    await ready(node, saver)
    await ready(node, plain)
    index = (await node.jobs())["index"]
    watching = asyncio.create_task(_heard(node, index))

    deadline = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(seconds=NOTICE_S)
    notify, stop_reason = NOTICES[cloud]
    notify(metadata, deadline)
    noticed = time.monotonic()

    heard, event = await asyncio.wait_for(watching, HEARD_S + 30)
    assert heard - noticed < HEARD_S, f"the watch heard the notice {heard - noticed:.1f} s late"
    assert event["state"] in ("cordoned", "draining", "drained"), event
    [notice] = event["notices"]
    assert notice["source"] == cloud and notice["ends_jobs"] is True, notice

    states = await node.wait_for(saver, "status", "exited", timeout=NOTICE_S - MARGIN_S)
    assert (states["exit_code"], states["stop_reason"]) == (0, stop_reason)
    assert (ckpt / "last").read_text() == "step-4300\n"  # the warning came, and it saved
    plain_state = await node.wait_for(plain, "status", "exited", timeout=NOTICE_S - MARGIN_S)
    assert plain_state["stop_reason"] == stop_reason
    ended = datetime.now(timezone.utc)
    assert ended < deadline - timedelta(seconds=MARGIN_S), "a stop ran past the margin"
    health = await node.health()
    assert health["node_state"]["state"] in ("draining", "drained"), health["node_state"]
    assert [n["source"] for n in health["notices"]] == [cloud]
