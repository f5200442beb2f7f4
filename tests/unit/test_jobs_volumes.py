"""The volume store's fills against a real HTTP server in the test's loop: one download
per digest, resumed with Range, checked before it is an entry, small fills not starved.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.volumeserver import FileServer, local_fetcher, sha256
from tuneplane_node.errors import VolumeFillFailed
from tuneplane_node.jobs.volumes.fills import VolumeFills
from tuneplane_node.jobs.volumes.store import VolumeStore
from tuneplane_node.jobs.words import partial_key

# A real server on a socket (tests' own loop): slow by the suite's rule.
pytestmark = pytest.mark.slow

DATA = os.urandom(3 * 2**20 + 12345)  # a few batches, and a tail


def fills_of(
    root: Path, server: FileServer, *, limit: int = 4, stall_s: float = 30.0
) -> VolumeFills:
    fetcher = local_fetcher(stall_s=stall_s, insecure=[server.host])
    return VolumeFills(VolumeStore(root), fetcher, limit=limit, backoff_s=0.01)


@pytest.fixture
async def fills(tmp_path: Path, file_server: FileServer) -> AsyncIterator[VolumeFills]:
    made = fills_of(tmp_path / "volumes", file_server)
    yield made
    await made.close()


def partial_of(fills: VolumeFills, digest: str, url: str) -> Path:
    """The partial file a fill of ``digest`` from ``url`` writes."""
    return fills.store.partial(partial_key(digest, fills.accesses.of(url)))


def body_bytes(server: FileServer, name: str) -> int:
    """Body bytes served, less the one byte each size probe (``Range: bytes=0-0``) took."""
    probes = sum(1 for each, asked in server.requests if each == name and asked == "bytes=0-0")
    return server.sent[name] - probes


async def test_five_launches_of_one_volume_download_it_once(
    file_server: FileServer, fills: VolumeFills
) -> None:
    url = file_server.add("weights", DATA)

    entries = await asyncio.gather(*(fills.ensure(sha256(DATA), url) for _ in range(5)))

    assert {entry.path for entry in entries} == {entries[0].path}
    assert entries[0].path.read_bytes() == DATA
    assert body_bytes(file_server, "weights") == len(DATA)
    assert entries[0].path.stat().st_mode & 0o777 == 0o444
    # Present now: a later launch downloads nothing.
    await fills.ensure(sha256(DATA), url)
    assert body_bytes(file_server, "weights") == len(DATA)


async def test_a_dropped_connection_resumes_from_where_it_stopped(
    file_server: FileServer, fills: VolumeFills
) -> None:
    url = file_server.add("weights", DATA)
    file_server.drop_after["weights"] = 1 + 2**20 + 777  # the probe's byte, then a MiB and some

    entry = await fills.ensure(sha256(DATA), url)

    assert entry.path.read_bytes() == DATA
    assert body_bytes(file_server, "weights") == len(DATA)  # no byte fetched twice
    resumed = [asked for _, asked in file_server.requests if asked not in ("", "bytes=0-0")]
    assert resumed == [f"bytes={2**20 + 777}-"]


async def test_a_restart_resumes_the_partial_file_a_killed_fill_left(
    file_server: FileServer, fills: VolumeFills
) -> None:
    url = file_server.add("weights", DATA)
    half = len(DATA) // 2
    partial_of(fills, sha256(DATA), url).write_bytes(DATA[:half])  # a SIGKILLed daemon's

    entry = await fills.ensure(sha256(DATA), url)

    assert entry.path.read_bytes() == DATA
    assert body_bytes(file_server, "weights") == len(DATA) - half


async def test_a_server_without_ranges_sends_it_all_again_and_the_fill_still_matches(
    file_server: FileServer, fills: VolumeFills
) -> None:
    file_server.ranges = False
    url = file_server.add("weights", DATA)
    partial_of(fills, sha256(DATA), url).write_bytes(b"x" * 1000)

    entry = await fills.ensure(sha256(DATA), url)

    assert entry.path.read_bytes() == DATA


async def test_wrong_bytes_are_no_entry_and_the_fill_says_why(
    file_server: FileServer, fills: VolumeFills
) -> None:
    url = file_server.add("weights", DATA)
    file_server.wrong.add("weights")

    with pytest.raises(VolumeFillFailed, match="bytes do not match the sha256:") as raised:
        await fills.ensure(sha256(DATA), url)

    assert raised.value.status == 502 and raised.value.code == "volume_fill_failed"
    served = bytes([DATA[0] ^ 0xFF]) + DATA[1:]
    assert sha256(served) not in raised.value.message  # what they hash to is not said
    assert await fills.entry(sha256(DATA)) is None
    assert not partial_of(fills, sha256(DATA), url).exists()  # the next fill starts afresh


async def test_a_missing_file_fails_the_fill_at_once(
    file_server: FileServer, fills: VolumeFills
) -> None:
    with pytest.raises(VolumeFillFailed, match="404"):
        await fills.ensure(sha256(b"none"), f"{file_server.url}/none")

    assert len(file_server.requests) == 0  # refused before any file was served
    assert fills.fills == {}


async def test_a_small_fill_does_not_wait_behind_big_ones(
    file_server: FileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two slots; the big fill stalls in its slot, the small one still gets the other."""
    monkeypatch.setattr("tuneplane_node.jobs.volumes.lanes.LARGE_BYTES", 2**20)
    big, small = DATA, os.urandom(1000)
    file_server.stall["big"] = asyncio.Event()
    fills = fills_of(tmp_path / "volumes", file_server, limit=2)
    try:
        big_fill = asyncio.create_task(fills.ensure(sha256(big), file_server.add("big", big)))
        while ("big", "") not in file_server.requests:  # it holds the one big slot
            await asyncio.sleep(0.01)
        second_big = asyncio.create_task(
            fills.ensure(sha256(big + b"2"), file_server.add("big2", big + b"2"))
        )
        entry = await asyncio.wait_for(
            fills.ensure(sha256(small), file_server.add("small", small)), 30
        )
        assert entry.path.read_bytes() == small, "the small fill finished first"
        assert not big_fill.done()
        # The second big one waits for the one big slot (two slots less one kept).
        assert body_bytes(file_server, "big2") == 0
        file_server.stall["big"].set()
        await asyncio.gather(big_fill, second_big)
    finally:
        await fills.close()


async def test_the_last_waiter_leaving_stops_the_download_and_keeps_its_bytes(
    file_server: FileServer, fills: VolumeFills
) -> None:
    url = file_server.add("weights", DATA)
    file_server.stall["weights"] = asyncio.Event()
    fill = fills.join(sha256(DATA), url)
    waiting = asyncio.create_task(fills.wait(fill))
    partial = partial_of(fills, sha256(DATA), url)
    # The download has begun once its file is open (the server's answer has come; its
    # body stalls): the request reaching the server is a moment earlier, and a cancel
    # then leaves nothing to keep (it failed so once on a loaded machine).
    while not partial.exists():
        await asyncio.sleep(0.01)

    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert fill.task is not None
    await asyncio.wait({fill.task})
    assert fill.task.cancelled()
    assert fills.fills == {}
    assert partial.exists()  # the next fill resumes it


def test_the_clients_own_words_never_carry_a_signed_urls_token() -> None:
    """aiohttp names the URL in its errors (a redirect's too), query and all."""
    from multidict import CIMultiDict, CIMultiDictProxy
    from yarl import URL

    from tuneplane_node.fetch.fetching import _said

    signed = URL("https://bucket.example:8443/weights?X-Amz-Signature=s3cr3t")
    info = aiohttp.RequestInfo(signed, "GET", CIMultiDictProxy(CIMultiDict()), signed)
    error = aiohttp.TooManyRedirects(info, (), status=302, message="Found")

    said = _said(error)

    assert "s3cr3t" in str(error)  # the client's words as they are
    assert "s3cr3t" not in said and "https://bucket.example:8443/weights" in said
