"""deputy (issue 49): what acting with a tenant's authority costs a fill, in one run.

One aiohttp file server on 127.0.0.1 (a process of its own: ``web.FileResponse``,
sendfile, Range) serves a file of ``--mib`` MiB. Alternating within each round:

- **the address check**: a fill's first request (a GET of the file's first byte, what a
  fill's size probe is) in a session of its own through the node's `Fetcher` (the
  resolver's answers and the socket's address checked by `Reach`, this machine's routes
  read, its own connector and cookie jar), against the same request through a plain
  aiohttp session made for it (no check): the difference is the check's cost per fill;
  and `Reach.refusal` alone, timed over many calls;
- **the possession proof**: a mirror's 4 ranges of 64 KiB compared with the stored
  bytes (`Possession.ranged`), against a full fill of the same file (`VolumeFills`).

Goals (the issue): the address check under 5 ms a fill, the proof under 2 % of a full
fetch of 1 GiB.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from volumes import serve

from tuneplane_node.clock import SYSTEM_CLOCK
from tuneplane_node.fetch.fetching import Fetcher
from tuneplane_node.jobs.volumes.fills import VolumeFills
from tuneplane_node.jobs.volumes.possession import Possession
from tuneplane_node.jobs.volumes.store import VolumeStore
from tuneplane_node.runtime.reach import Reach

LOOPBACK = ["127.0.0.0/8"]  # the bench's own server: the operator's listed network


FETCHERS: dict[str, Fetcher] = {}


def fetcher_for(url: str) -> Fetcher:
    """The node's one fetcher (its TLS context made once, as the daemon's is)."""
    host = url.split("/")[2]
    if host not in FETCHERS:
        FETCHERS[host] = Fetcher(stall_s=60, reach=Reach(LOOPBACK), insecure=frozenset({host}))
        FETCHERS[host].tls()
    return FETCHERS[host]


async def guarded_probe(url: str) -> float:
    fetcher = fetcher_for(url)
    started = time.perf_counter()
    async with fetcher.session() as http:
        await http.size(url)
    return time.perf_counter() - started


async def plain_probe(url: str) -> float:
    started = time.perf_counter()
    async with aiohttp.ClientSession() as http, http.get(url, headers={"Range": "bytes=0-0"}):
        pass
    return time.perf_counter() - started


def refusal_cost(calls: int) -> float:
    """Seconds a `Reach.refusal` of a public address takes (this machine's routes read
    each time, as a connection does)."""
    reach = Reach(LOOPBACK)
    started = time.perf_counter()
    for _ in range(calls):
        reach.refusal("93.184.216.34")
    return (time.perf_counter() - started) / calls


async def proof(url: str, store: VolumeStore, digest: str) -> float:
    entry = store.entry(digest)
    assert entry is not None
    possession = Possession(fetcher_for(url), io=_io, clock=SYSTEM_CLOCK)
    started = time.perf_counter()
    proved = await possession.ranged(url, entry)
    elapsed = time.perf_counter() - started
    assert proved is True, proved
    return elapsed


async def _io(call: Callable[..., bytes], *args: object) -> bytes:
    return await asyncio.to_thread(call, *args)


async def full_fill(url: str, root: Path, digest: str) -> float:
    fills = VolumeFills(VolumeStore(root), fetcher_for(url), limit=4)
    started = time.perf_counter()
    try:
        await fills.ensure(digest, url)
        return time.perf_counter() - started
    finally:
        await fills.close()
        shutil.rmtree(root, ignore_errors=True)


def timed(make: Callable[[], Awaitable[float]]) -> float:
    return asyncio.run(make())  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--probes", type=int, default=50, help="first-byte requests a round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR", "/var/tmp")) as temp:
        work = Path(temp)
        (work / "served").mkdir()
        data, hasher = work / "served" / "weights", hashlib.sha256()
        with data.open("wb") as out:
            for _ in range(args.mib):
                block = os.urandom(2**20)
                hasher.update(block)
                out.write(block)
        digest = hasher.hexdigest()
        stored = VolumeStore(work / "held")
        (stored.root / "sha256").mkdir(parents=True)
        shutil.copyfile(data, stored.root / "sha256" / digest)
        os.sync()
        base, server = serve(work / "served")
        url = f"{base}/weights"
        times: dict[str, list[float]] = {k: [] for k in ("guarded", "plain", "proof", "fill")}
        try:
            timed(lambda: guarded_probe(url))  # warm: the first of each is not counted
            timed(lambda: plain_probe(url))
            for number in range(args.rounds):
                probes = [("guarded", guarded_probe), ("plain", plain_probe)]
                for _ in range(args.probes):
                    for name, probe in probes if number % 2 == 0 else reversed(probes):
                        times[name].append(asyncio.run(probe(url)))
                times["proof"].append(timed(lambda: proof(url, stored, digest)))
                times["fill"].append(timed(lambda: full_fill(url, work / "store", digest)))
        finally:
            server.terminate()
            server.wait()
        report(times, refusal_cost(10_000), args.mib)


def report(times: dict[str, list[float]], refusal_s: float, mib: int) -> None:
    ms = {name: [1000 * t for t in each] for name, each in times.items()}
    for name, each in ms.items():
        print(f"{name:8} median {statistics.median(each):9.3f} ms  p90 "
              f"{statistics.quantiles(each, n=10)[-1] if len(each) > 1 else each[0]:9.3f} ms  "
              f"({len(each)})")  # fmt: skip
    added = statistics.median(ms["guarded"]) - statistics.median(ms["plain"])
    print(f"the address check and a session of its own add {added:.3f} ms to a fill's "
          f"first request; Reach.refusal alone {refusal_s * 1e6:.1f} us")  # fmt: skip
    share = statistics.median(ms["proof"]) / statistics.median(ms["fill"])
    print(f"a proof is {100 * share:.3f} % of a full fill of {mib} MiB")


if __name__ == "__main__":
    main()
