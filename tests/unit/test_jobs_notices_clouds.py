"""The clouds' metadata services read for notices (issue 54), each by its documented
paths, headers, tokens and formats, against a fake service on loopback; and one that
does not answer, or answers garbage, invents nothing."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta, timezone

import pytest

from tests.fakes.clock import FakeClock
from tests.metadataserver import TOKEN, Metadata
from tuneplane_node.errors import VolumeFillFailed
from tuneplane_node.fetch.fetching import Fetcher
from tuneplane_node.jobs.notices.clouds import (
    AwsReader,
    AzureReader,
    GcpReader,
    MetadataRefused,
    Reader,
    detected,
    reader_of,
)
from tuneplane_node.jobs.notices.watcher import metadata_fetcher
from tuneplane_node.jobs.words import MAINTENANCE, PREEMPT, REBALANCE, Notice

pytestmark = pytest.mark.slow  # a real server on a socket


def fetcher(metadata: Metadata) -> Fetcher:
    return metadata_fetcher(metadata.url, stall_s=70, clock=FakeClock())


async def read(reader: Reader, metadata: Metadata) -> list[Notice]:
    async with fetcher(metadata).session() as http:
        return await reader.read(http)


async def test_aws_asks_with_an_imdsv2_token_and_reads_a_spot_action(metadata: Metadata) -> None:
    reader = AwsReader(metadata.url, clock=FakeClock())
    assert await read(reader, metadata) == []  # every endpoint 404: no notice
    metadata.spot = {"action": "terminate", "time": "2026-12-06T10:02:00Z"}

    [notice] = await read(reader, metadata)

    assert (notice.source, notice.kind, notice.ends_jobs) == ("aws", PREEMPT, True)
    assert notice.deadline == datetime(2026, 12, 6, 10, 2, tzinfo=timezone.utc)
    assert notice.reason == "preempt: aws spot terminate 2026-12-06T10:02:00Z"
    tokens = [r for r in metadata.requests if r[0] == "PUT"]
    assert len(tokens) == 1  # kept: one token for both reads
    gets = [r for r in metadata.requests if r[0] == "GET"]
    assert all(r[2].get("X-aws-ec2-metadata-token") == TOKEN for r in gets)


async def test_aws_rebalance_only_cordons_and_a_reboot_by_notbefore_ends_the_jobs(
    metadata: Metadata,
) -> None:
    metadata.rebalance = {"noticeTime": "2026-12-06T09:50:00Z"}
    metadata.scheduled = [
        {"Code": "system-reboot", "NotBefore": "07 Dec 2026 02:00:00 GMT",
         "EventId": "instance-event-1", "State": "active"},
        {"Code": "system-reboot", "NotBefore": "01 Dec 2026 02:00:00 GMT",
         "EventId": "instance-event-0", "State": "completed"},
    ]  # fmt: skip

    rebalance, reboot = await read(AwsReader(metadata.url, clock=FakeClock()), metadata)

    assert (rebalance.kind, rebalance.ends_jobs, rebalance.deadline) == (REBALANCE, False, None)
    assert (reboot.kind, reboot.ends_jobs) == (MAINTENANCE, True)
    assert reboot.deadline == datetime(2026, 12, 7, 2, tzinfo=timezone.utc)


async def test_gcp_waits_for_a_change_and_gives_a_gpu_vm_its_hour(metadata: Metadata) -> None:
    clock = FakeClock()
    reader = GcpReader(metadata.url, clock=clock)
    assert await read(reader, metadata) == []  # the first read answers at once
    waiting = asyncio.ensure_future(read(reader, metadata))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # a long poll: nothing changed

    metadata.gcp_set(maintenanceEvent="TERMINATE_ON_HOST_MAINTENANCE")
    [notice] = await asyncio.wait_for(waiting, 10)

    assert (notice.kind, notice.ends_jobs) == (MAINTENANCE, True)
    assert notice.deadline == clock.now() + timedelta(seconds=3600)
    assert all(r[2].get("Metadata-Flavor") == "Google" for r in metadata.requests)
    metadata.gcp_set(maintenanceEvent="NONE")
    assert await asyncio.wait_for(read(reader, metadata), 10) == []  # withdrawn


async def test_gcp_preemption_gets_30_seconds(metadata: Metadata) -> None:
    clock = FakeClock()
    metadata.gcp_set(preempted="TRUE")
    [notice] = await read(GcpReader(metadata.url, clock=clock), metadata)
    assert (notice.kind, notice.deadline) == (PREEMPT, clock.now() + timedelta(seconds=30))


async def test_azure_reads_this_vms_events_only(metadata: Metadata) -> None:
    metadata.events = [
        {"EventId": "A1", "EventType": "Preempt", "ResourceType": "VirtualMachine",
         "Resources": ["gpu-vm-7"], "EventStatus": "Scheduled",
         "NotBefore": "Sun, 06 Dec 2026 10:00:30 GMT"},
        {"EventId": "B2", "EventType": "Terminate", "ResourceType": "VirtualMachine",
         "Resources": ["another-vm"], "EventStatus": "Scheduled", "NotBefore": ""},
        {"EventId": "C3", "EventType": "Freeze", "ResourceType": "VirtualMachine",
         "Resources": ["gpu-vm-7"], "EventStatus": "Scheduled", "NotBefore": ""},
    ]  # fmt: skip

    preempt, freeze = await read(AzureReader(metadata.url, clock=FakeClock()), metadata)

    assert (preempt.kind, preempt.ends_jobs, preempt.key) == (PREEMPT, True, "azure A1")
    assert preempt.deadline == datetime(2026, 12, 6, 10, 0, 30, tzinfo=timezone.utc)
    assert (freeze.kind, freeze.ends_jobs) == (MAINTENANCE, False)
    assert all(r[2].get("Metadata") == "true" for r in metadata.requests)


@pytest.mark.parametrize("broken", ["down", "garbage"])
@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
async def test_a_service_that_does_not_answer_as_documented_gives_no_notice(
    metadata: Metadata, cloud: str, broken: str, caplog: pytest.LogCaptureFixture
) -> None:
    setattr(metadata, broken, True)
    reader = reader_of(cloud, metadata.url, clock=FakeClock())
    caplog.set_level(logging.DEBUG)
    with pytest.raises((MetadataRefused, VolumeFillFailed)):
        await read(reader, metadata)


def test_the_cloud_is_told_by_the_machines_dmi_identity(tmp_path: object) -> None:
    from pathlib import Path

    root = Path(str(tmp_path))
    assert detected(str(root)) is None  # nothing to read: no cloud
    (root / "sys_vendor").write_text("Amazon EC2\n")
    assert detected(str(root)) == "aws"
    (root / "sys_vendor").write_text("Google\n")
    assert detected(str(root)) == "gcp"
    (root / "sys_vendor").write_text("Microsoft Corporation\n")
    (root / "chassis_asset_tag").write_text("7783-7084-3265-9085-8269-3286-77\n")
    assert detected(str(root)) == "azure"
