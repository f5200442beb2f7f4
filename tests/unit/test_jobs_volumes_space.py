"""The volume store's eviction (issue 39): least recently used first, between the high
and low thresholds, never an entry a job binds (its container's label), a launch holds
or a prefetch pinned; a fill that cannot fit is refused before anything is removed.
The store is real files; the filesystem's figures and the engine's containers are fakes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import fake_settings
from tests.fakes.clock import FakeClock
from tuneplane_node.errors import InvalidField, VolumeStoreFull
from tuneplane_node.jobs.volumes.keeper import VolumeKeeper
from tuneplane_node.jobs.volumes.space import Candidate, to_evict
from tuneplane_node.jobs.words import Entry, Space, VolumeFill
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.telemetry import Telemetry
from tuneplane_node.wire.values import LABEL_VOLUMES, Volume

TOTAL = 10_000
OTHERS = 6_000  # bytes of the filesystem that are not the store's
A, B, C, D = ("a" * 64, "b" * 64, "c" * 64, "d" * 64)


class Disk:
    """A filesystem of `TOTAL` bytes: `OTHERS` plus the store's files as they are."""

    def __init__(self) -> None:
        self.others = OTHERS

    def __call__(self, root: Path) -> Space:
        """The entries' and partial files' bytes (the salt and the access records are a
        few bytes the store's figures leave out, as a real filesystem's blocks would)."""
        files = [p for kind in ("sha256", "partial") for p in (root / kind).rglob("*")]
        held = sum(p.stat().st_size for p in files if p.is_file())
        return Space(TOTAL, TOTAL - self.others - held)


class Counted(Telemetry):
    def __init__(self) -> None:
        self.evicted: list[tuple[str, int]] = []

    def volume_evicted(self, digest: str, size_bytes: int) -> None:
        self.evicted.append((digest, size_bytes))


class Engine:
    def __init__(self) -> None:
        self.containers: list[ContainerState] = []

    async def ps(self) -> list[ContainerState]:
        return list(self.containers)

    def uses(self, name: str, *digests: str) -> None:
        labels = {LABEL_VOLUMES: ",".join(digests)}
        self.containers.append(ContainerState(name, True, "running", labels=labels))


@pytest.fixture
def engine() -> Engine:
    return Engine()


@pytest.fixture
def telemetry() -> Counted:
    return Counted()


@pytest.fixture
async def keeper(
    tmp_path: Path, engine: Engine, clock: FakeClock, telemetry: Counted
) -> AsyncIterator[VolumeKeeper]:
    settings = fake_settings(tmp_path, volume_root=tmp_path / "volumes")
    made = VolumeKeeper(
        settings.volumes, clock=clock, ps=engine.ps, space_of=Disk(), telemetry=telemetry
    )
    yield made
    await made.close()


def put(keeper: VolumeKeeper, digest: str, size: int, used_at: float) -> None:
    """An entry of ``size`` bytes, last used at ``used_at`` (epoch seconds), filled from
    ``https://h/<its first letter>`` (that access recorded)."""
    entries = keeper.store.root / "sha256"
    entries.mkdir(parents=True, exist_ok=True)
    path = entries / digest
    path.write_bytes(b"x" * size)
    os.utime(path, (used_at, used_at))
    keeper.accesses.record(digest, keeper.accesses.of(f"https://h/{digest[0]}"))


def three(keeper: VolumeKeeper) -> None:
    """A, B and C of 1000 bytes each, used in that order: the filesystem at 90%."""
    for i, digest in enumerate((A, B, C)):
        put(keeper, digest, 1000, 100.0 * (i + 1))


def left(keeper: VolumeKeeper) -> set[str]:
    return {entry.digest for entry in keeper.store.entries()}


def candidates(*sizes: int) -> list[Candidate]:
    from datetime import datetime, timezone

    return [
        Candidate(Entry(str(i), size, Path(str(i))), datetime.fromtimestamp(i, timezone.utc))
        for i, size in enumerate(sizes)
    ]


# --- the rule alone -----------------------------------------------------------------------


def test_below_high_nothing_is_chosen() -> None:
    assert to_evict(candidates(100, 100), Space(1000, 200), high=85, low=80) == []


def test_at_high_the_oldest_go_until_low() -> None:
    chosen = to_evict(candidates(30, 30, 30, 30), Space(1000, 140), high=85, low=80)
    assert [c.entry.digest for c in chosen] == ["0", "1"]  # 86% -> 80%


def test_a_need_takes_the_oldest_until_it_fits_below_high() -> None:
    chosen = to_evict(candidates(50, 50, 50), Space(1000, 300), high=85, low=80, need=220)
    assert [c.entry.digest for c in chosen] == ["0", "1"]  # room 150: +100 fits 220


# --- the keeper ---------------------------------------------------------------------------


async def test_a_run_evicts_the_least_recently_used_down_to_low(
    keeper: VolumeKeeper, telemetry: Counted
) -> None:
    put(keeper, A, 1000, 100.0)  # the oldest
    put(keeper, B, 1000, 300.0)
    put(keeper, C, 1000, 200.0)  # 9000 of 10000: 90%

    run = await keeper.collect()

    assert [each.entry.digest for each in run.removed] == [A]  # 80% now: enough
    assert run.freed_bytes == 1000 and left(keeper) == {B, C}
    assert telemetry.evicted == [(A, 1000)]
    assert run.store.space is not None and run.store.space.used_bytes == 2000


async def test_below_high_a_run_removes_nothing(keeper: VolumeKeeper) -> None:
    put(keeper, A, 1000, 100.0)  # 70%
    taken = keeper.store.root / "evicted" / B  # a daemon killed between rename and unlink
    taken.parent.mkdir()
    taken.write_bytes(b"x")
    run = await keeper.collect()
    assert run.removed == [] and left(keeper) == {A}
    assert not taken.exists()  # its bytes freed by the next run


async def test_an_entry_a_container_binds_is_never_evicted(
    keeper: VolumeKeeper, engine: Engine
) -> None:
    three(keeper)
    engine.uses("job-a", A, D)  # its label: the oldest is in use

    run = await keeper.collect()

    assert [each.entry.digest for each in run.removed] == [B]
    view = await keeper.view()
    [a] = [each for each in view.entries if each.entry.digest == A]
    assert a.in_use_by == ("job-a",)


async def test_an_entry_a_launch_holds_and_one_a_prefetch_pinned_are_kept(
    keeper: VolumeKeeper, clock: FakeClock
) -> None:
    three(keeper)
    release = keeper.hold([Volume("https://h/a", "/m/a", A)])
    pinned = await keeper.prefetch(Volume("https://h/b", "", B))
    assert pinned.phase == "present" and pinned.entry is not None

    run = await keeper.collect()
    assert [each.entry.digest for each in run.removed] == [C]  # the one left unkept

    release()
    clock.advance(keeper.room.pin_s + 1)  # the pin is over
    os.utime(keeper.store.root / "sha256" / B, (50.0, 50.0))  # the oldest now
    put(keeper, C, 1000, 300.0)  # 90% again
    run = await keeper.collect()
    assert [each.entry.digest for each in run.removed] == [B]


async def test_a_prefetch_refreshes_the_last_use(keeper: VolumeKeeper) -> None:
    three(keeper)
    await keeper.prefetch(Volume("https://h/a", "", A))  # A: used now
    keeper.room.pins.clear()  # its pin aside: only the order counts here

    run = await keeper.collect()

    assert [each.entry.digest for each in run.removed] == [B]


async def test_a_fill_has_the_oldest_evicted_as_its_bytes_need_the_room(
    keeper: VolumeKeeper,
) -> None:
    put(keeper, A, 1000, 100.0)
    put(keeper, B, 1000, 200.0)  # 8000: room below 85% is 500
    fill = VolumeFill(D, "https://h/d", bytes_total=1200)

    await keeper.room.admit(fill)
    assert left(keeper) == {A, B}  # admitted: it fits with A gone, but nothing goes for a size

    await keeper.room.grant(fill, 400)  # its first bytes: room for them, and some ahead
    assert left(keeper) == {B} and fill.granted == 1200


async def test_a_size_claim_that_just_fits_evicts_only_for_the_bytes_that_come(
    keeper: VolumeKeeper,
) -> None:
    """Finding 7 of issue 49: a lie that fits with every cached entry gone was a lever
    on the other tenants' entries. Room is found a window ahead of the bytes instead."""
    put(keeper, A, 1000, 100.0)
    put(keeper, B, 1000, 200.0)  # room below 85%: 500
    keeper.room.grant_bytes = 300
    access = keeper.accesses.of("https://h/d")
    liar = VolumeFill(D, "https://h/d", access, bytes_total=2400)  # fits with A and B gone
    keeper.fills.fills[(D, access)] = liar  # under way: its partial file is not a leftover

    await keeper.room.admit(liar)
    await keeper.room.grant(liar, 100)  # its first bytes: room up to 400, here already

    assert left(keeper) == {A, B} and liar.granted == 400
    keeper.store.partial(liar.key).write_bytes(b"x" * 400)  # they came: 100 left below high
    liar.bytes_done = 400
    await keeper.room.grant(liar, 450)  # room up to 750: 250 more than there is, A goes
    assert left(keeper) == {B} and liar.granted == 750
    del keeper.fills.fills[(D, access)]


async def test_a_partial_file_no_fill_writes_goes_before_any_entry(keeper: VolumeKeeper) -> None:
    """Another source's bytes, a cancelled fill's: nobody resumes them but their own
    access, so they are what room is made of first."""
    put(keeper, A, 1000, 100.0)
    keeper.store.partial(f"{D}~{'0' * 16}").write_bytes(b"x" * 1000)  # 8000: room 500
    fill = VolumeFill(C, "https://h/c", keeper.accesses.of("https://h/c"), bytes_total=1000)

    await keeper.room.grant(fill, 1)

    assert left(keeper) == {A} and not keeper.store.partial(f"{D}~{'0' * 16}").exists()


async def test_a_fill_that_cannot_fit_even_after_eviction_is_refused_and_nothing_goes(
    keeper: VolumeKeeper, engine: Engine
) -> None:
    put(keeper, A, 1000, 100.0)
    put(keeper, B, 1000, 200.0)
    engine.uses("job-b", B)  # not evictable: 500 room + A's 1000 < 2000
    fill = VolumeFill(D, "https://h/d?sig=s3cr3t", bytes_total=2000)

    with pytest.raises(VolumeStoreFull) as refused:
        await keeper.room.admit(fill)

    assert refused.value.status == 507 and refused.value.code == "volume_store_full"
    assert refused.value.needed_bytes == 2000 and refused.value.freeable_bytes is None
    assert "s3cr3t" not in refused.value.message
    assert "1000" not in refused.value.message  # what eviction could free: not the tenant's
    assert left(keeper) == {A, B}


async def test_a_fill_counts_its_partial_file_and_the_other_fills_room(
    keeper: VolumeKeeper,
) -> None:
    fill = VolumeFill(D, "https://h/d", keeper.accesses.of("https://h/d"), bytes_total=2400)
    keeper.store.partial(fill.key).write_bytes(b"x" * 400)  # 6400 used: room 2100
    await keeper.room.admit(fill)  # 2000 more: fits
    other = VolumeFill(C, "https://h/c", keeper.accesses.of("https://h/c"), bytes_total=2400)
    other.admitted.set()
    other.granted = 2000  # room found for its bytes, none of them written yet
    keeper.fills.fills[(C, other.access)] = other
    try:
        with pytest.raises(VolumeStoreFull):
            await keeper.room.admit(fill)
    finally:
        del keeper.fills.fills[(C, other.access)]


async def test_an_engine_that_does_not_answer_evicts_nothing(keeper: VolumeKeeper) -> None:
    from tuneplane_node.errors import EngineUnavailable

    async def down() -> list[ContainerState]:
        raise EngineUnavailable(engine="docker", reason="down")

    keeper.room.ps = down
    put(keeper, A, 3500, 100.0)
    with pytest.raises(EngineUnavailable):
        await keeper.collect()
    assert left(keeper) == {A}
    view = await keeper.view()
    assert view.entries[0].in_use_by is None  # unknown, not none


async def test_a_prefetch_of_a_plain_http_host_not_listed_names_source(
    keeper: VolumeKeeper,
) -> None:
    with pytest.raises(InvalidField) as refused:
        await keeper.prefetch(Volume("http://h/a", "", A))
    assert refused.value.field == "source"


async def test_an_entry_held_and_let_go_while_the_run_read_the_engine_is_kept(
    keeper: VolumeKeeper, engine: Engine
) -> None:
    """A launch that held it while ps was answered may have made its container after the
    answer: its label is not in what the run read, so the hold itself keeps it."""
    three(keeper)
    read = engine.ps

    async def ps_while_a_launch_comes() -> list[ContainerState]:
        states = await read()
        keeper.hold([Volume("https://h/a", "/m/a", A)])()  # held, its container made, let go
        return states

    keeper.room.ps = ps_while_a_launch_comes
    run = await keeper.collect()
    assert [each.entry.digest for each in run.removed] == [B]


async def test_a_burst_of_health_readings_reads_the_store_once_until_it_changes(
    keeper: VolumeKeeper, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = 0
    real = keeper.room.space

    async def counted() -> Space | None:
        nonlocal reads
        reads += 1
        return await real()

    monkeypatch.setattr(keeper.room, "space", counted)
    first = await asyncio.gather(*(keeper.reading() for _ in range(50)))
    assert reads == 1 and all(view is first[0] for view in first)
    assert await keeper.reading() is first[0]  # within the second: kept
    partial = keeper.store.partial("a" * 64)
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_bytes(b"x" * 1000)
    keeper.store.commit("a" * 64, "a" * 64)  # an entry made: the store's generation moves
    changed = await keeper.reading()
    assert reads == 2 and changed.space is not None and changed.space.used_bytes == 1000
    clock.advance(1.5)
    # A second later: answered as it is, at once, while one read runs behind it; the
    # requests meanwhile get the same and start no other read.
    assert await keeper.reading() is changed
    polls = 0
    while (await keeper.reading()) is changed:
        polls += 1
        assert polls < 500, "the read behind never landed"
        await asyncio.sleep(0.01)
    assert reads == 3
