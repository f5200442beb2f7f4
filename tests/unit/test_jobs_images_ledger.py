"""The image ledger: what the node pulled and ran, by engine id, kept across restarts."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from tests.conftest import IMAGE
from tests.fakes.clock import FakeClock
from tests.fakes.runtime import FakeRuntime
from tests.jobservice import MISSING, request
from tests.support.waiting import wait_until
from tuneplane_node.jobs import Node
from tuneplane_node.jobs.images.ledger import LEDGER_FILE, ImageLedger, ImageRecord

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)
ID_A, ID_B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


async def test_pulls_and_uses_are_kept_across_a_restart(tmp_path: Path) -> None:
    ledger = ImageLedger(tmp_path)
    ledger.record_pull("reg.test/big:1", ID_A, T0, prefetch=True)
    ledger.record_use(ID_A, T0 + timedelta(minutes=5))
    ledger.record_pull("reg.test/small:1", ID_B, T0 + timedelta(hours=1), prefetch=False)
    await ledger.close()  # on disk

    again = ImageLedger(tmp_path)
    await again.load()

    assert again.entries() == [
        ImageRecord(ID_A, ("reg.test/big:1",), T0, T0, T0 + timedelta(minutes=5)),
        ImageRecord(ID_B, ("reg.test/small:1",), T0 + timedelta(hours=1), None, None),
    ]


async def test_a_moved_tag_leaves_the_old_image_and_names_the_new(tmp_path: Path) -> None:
    ledger = ImageLedger(tmp_path)
    ledger.record_pull("reg.test/t:latest", ID_A, T0, prefetch=False)
    ledger.record_pull("reg.test/t:latest", ID_B, T0 + timedelta(hours=1), prefetch=False)

    old, new = ledger.entries()
    assert (old.id, old.references) == (ID_A, ())  # still on the engine, unnamed now
    assert (new.id, new.references) == (ID_B, ("reg.test/t:latest",))
    await ledger.close()


async def test_a_launch_pull_keeps_the_prefetch_time_and_forget_drops_it(tmp_path: Path) -> None:
    ledger = ImageLedger(tmp_path)
    ledger.record_pull("reg.test/big:1", ID_A, T0, prefetch=True)
    ledger.record_pull("reg.test/big:1", ID_A, T0 + timedelta(hours=2), prefetch=False)
    [record] = ledger.entries()
    assert (record.pulled_at, record.prefetched_at) == (T0 + timedelta(hours=2), T0)

    ledger.forget(ID_A)
    await ledger.close()
    again = ImageLedger(tmp_path)
    await again.load()
    assert ledger.entries() == again.entries() == []


async def test_a_broken_ledger_starts_empty_and_is_written_over(tmp_path: Path) -> None:
    (tmp_path / LEDGER_FILE).write_text("{not json")
    ledger = ImageLedger(tmp_path)
    await ledger.load()
    assert ledger.entries() == []

    ledger.record_use(ID_A, T0)
    await ledger.close()
    document = json.loads((tmp_path / LEDGER_FILE).read_text())
    assert document["images"][0]["last_used_at"] == "2026-12-01T12:00:00Z"
    assert document["images"][0]["pulled_at"] is None  # the operator's image: never pulled


async def test_the_service_records_its_pull_and_its_container(
    node: Node, fake: FakeRuntime, clock: FakeClock
) -> None:
    await node.start()
    await node.jobs.launch(request("r1", image=MISSING))
    await fake.pulling.wait()
    fake.pull_of(MISSING).finish()
    await wait_until(lambda: node.pending.get("tuneplane-r1") is None)  # started
    await node.jobs.launch(request("r2"))  # a present image: a use, no pull

    by_id = {record.id: record for record in node.ledger.entries()}
    pulled, present = by_id[fake.image_id(MISSING)], by_id[fake.image_id(IMAGE)]
    assert pulled.references == (MISSING,)
    assert pulled.pulled_at == pulled.last_used_at == clock.now()
    assert pulled.prefetched_at is None
    assert (present.pulled_at, present.last_used_at) == (None, clock.now())
    assert "tuneplane-r1" in fake.containers
