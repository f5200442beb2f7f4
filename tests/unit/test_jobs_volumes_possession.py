"""A stored volume goes only to a request that shows the same right (issue 49): fills are
shared by one source's launches alone, a partial file is resumed only by the source that
wrote it, and an entry another source filled is handed on only once the new source
proves it holds the bytes: a few ranges, or the whole file where it answers no range.
Against servers of the tests' own on loopback (an operator's listed network here)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.deputy import Tenant
from tests.volumeserver import LOOPBACK, sha256
from tuneplane_node.errors import VolumeAccessDenied
from tuneplane_node.fetch.fetching import Fetcher
from tuneplane_node.fetch.ociregistry import OciRegistry
from tuneplane_node.jobs.volumes.fills import VolumeFills
from tuneplane_node.jobs.volumes.possession import PROOF_BYTES, PROOF_RANGES
from tuneplane_node.jobs.volumes.sources import VolumeSources
from tuneplane_node.jobs.volumes.store import VolumeStore
from tuneplane_node.jobs.words import partial_key
from tuneplane_node.runtime.reach import Reach
from tuneplane_node.wire.values import Volume

# Real servers on sockets (tests' own loop): slow by the suite's rule.
pytestmark = pytest.mark.slow

WEIGHTS = os.urandom(3 * 2**20 + 777)  # a model hub lists its sha256 for anyone
DIGEST = sha256(WEIGHTS)


async def served(**files: bytes) -> Tenant:
    tenant = Tenant(files=dict(files))
    await tenant.start()
    return tenant


@pytest.fixture
async def tenants() -> AsyncIterator[list[Tenant]]:
    """Servers a test starts (`served`) and leaves here to be closed."""
    made: list[Tenant] = []
    yield made
    for tenant in made:
        await tenant.close()


@pytest.fixture
async def fills(tmp_path: Path) -> AsyncIterator[VolumeFills]:
    """Fills over loopback, plain http to any of its ports (the tests' servers)."""
    fetcher = Fetcher(stall_s=0.5, reach=Reach(LOOPBACK))
    fetcher.insecure_host = lambda host, port: True  # type: ignore[method-assign]
    made = VolumeFills(VolumeStore(tmp_path / "volumes"), fetcher, limit=4, backoff_s=0.01)
    yield made
    await made.close()


def sources(fills: VolumeFills) -> VolumeSources:
    return VolumeSources(OciRegistry(fills.fetcher), fills)


async def test_a_squatters_trickle_holds_only_its_own_launch(
    fills: VolumeFills, tenants: list[Tenant]
) -> None:
    """Finding 5: tenant A names the public hash of B's weights with a source that
    trickles; B's launch fills from its own source at once, never waiting on A's."""
    squatter = Tenant(trickle_s=0.05)
    await squatter.start()
    tenants.append(squatter)
    tenants.append(legit := await served(w=WEIGHTS))
    squat = fills.join(DIGEST, f"{squatter.url}/trickle")
    waiting_a = asyncio.ensure_future(fills.wait(squat))
    while not squatter.requests:
        await asyncio.sleep(0.01)

    entry = await asyncio.wait_for(fills.ensure(DIGEST, f"{legit.url}/files/w"), 30)

    assert entry.path.read_bytes() == WEIGHTS
    assert not waiting_a.done()  # A's own launch still waits on its own source
    assert len(fills.fills) == 1  # B's fill ended; A's is another fill of the same digest
    waiting_a.cancel()
    await asyncio.gather(waiting_a, return_exceptions=True)


async def test_another_sources_partial_file_is_never_resumed(
    fills: VolumeFills, tenants: list[Tenant]
) -> None:
    """Finding 5's variant: 4 KiB of junk a squatter's fill left is not the start of B's."""
    tenants.append(legit := await served(w=WEIGHTS))
    squat = fills.store.partial(partial_key(DIGEST, fills.accesses.of("https://squat/w")))
    squat.write_bytes(b"junk" * 1024)

    entry = await fills.ensure(DIGEST, f"{legit.url}/files/w")

    assert entry.path.read_bytes() == WEIGHTS
    assert legit.sent["/files/w"] == len(WEIGHTS) + 1  # all of it (and the size probe's byte)
    assert not squat.exists()  # nobody resumes it: it went when the fill of its digest began


async def test_a_mirror_proves_it_holds_the_bytes_with_a_few_ranges(
    fills: VolumeFills, tenants: list[Tenant]
) -> None:
    tenants.append(first := await served(w=WEIGHTS))
    tenants.append(mirror := await served(w=WEIGHTS))
    await fills.ensure(DIGEST, f"{first.url}/files/w")
    named = Volume(f"{mirror.url}/files/w?sig=fresh", "/m", DIGEST)

    await sources(fills).resolved([named])

    assert len(mirror.requests) == PROOF_RANGES
    assert all(r.headers["Range"].startswith("bytes=") for r in mirror.requests)
    assert mirror.sent["/files/w"] == PROOF_RANGES * PROOF_BYTES  # no full fetch
    assert await fills.handed(DIGEST, named.source)
    await sources(fills).resolved([named])  # recorded: bound at once from now on
    assert len(mirror.requests) == PROOF_RANGES


@pytest.mark.parametrize(
    "source", ["other", "https://no-such-host.invalid/x"], ids=["other-bytes", "no-server"]
)
async def test_a_source_that_cannot_show_the_bytes_is_refused_the_entry(
    fills: VolumeFills, tenants: list[Tenant], source: str
) -> None:
    """Finding 6: naming tenant B's hash with any source read B's file at once."""
    tenants.append(first := await served(w=WEIGHTS))
    tenants.append(liar := await served(w=os.urandom(len(WEIGHTS))))
    await fills.ensure(DIGEST, f"{first.url}/files/w")
    url = f"{liar.url}/files/w" if source == "other" else source

    with pytest.raises(VolumeAccessDenied) as denied:
        await sources(fills).resolved([Volume(url, "/m", DIGEST)])

    assert (denied.value.status, denied.value.code) == (403, "forbidden_volume")
    assert DIGEST in denied.value.message
    assert not await fills.handed(DIGEST, url)


async def test_a_source_without_ranges_proves_it_by_sending_the_whole_file_in_a_fill(
    fills: VolumeFills, tenants: list[Tenant]
) -> None:
    tenants.append(first := await served(w=WEIGHTS))
    tenants.append(plain := await served(w=WEIGHTS))
    plain.ranges = False
    await fills.ensure(DIGEST, f"{first.url}/files/w")
    url = f"{plain.url}/files/w"

    await sources(fills).resolved([Volume(url, "/m", DIGEST)])  # left to a fill
    assert not await fills.handed(DIGEST, url)
    entry = await fills.ensure(DIGEST, url)  # hashed, nothing kept

    assert entry.path.read_bytes() == WEIGHTS and await fills.handed(DIGEST, url)
    assert list((fills.store.root / "partial").iterdir()) == []


async def test_a_fill_of_a_present_entry_from_another_source_of_other_bytes_is_refused(
    fills: VolumeFills, tenants: list[Tenant]
) -> None:
    tenants.append(first := await served(w=WEIGHTS))
    tenants.append(liar := await served(w=os.urandom(len(WEIGHTS))))
    liar.ranges = False
    await fills.ensure(DIGEST, f"{first.url}/files/w")

    with pytest.raises(VolumeAccessDenied):
        await fills.ensure(DIGEST, f"{liar.url}/files/w")
