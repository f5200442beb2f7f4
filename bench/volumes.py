"""volumes (issue 39): a volume's fill against curl of the same bytes, in one run.

One aiohttp file server on 127.0.0.1 (``web.FileResponse``: sendfile, Range) serves a
file of ``--mib`` MiB of random bytes. Alternating within each round (the order turned
each round, one round first not counted): the node's fill (`VolumeFills.ensure`: size
probe, download on the loop, writes started to disk as they go and sha256 on its threads,
fsync, rename) into a fresh store, against ``curl -o`` of the same URL onto the same
disk (its file fsynced, as the fill's is); with ``--without-write-behind`` the fill
with its write-behind and drop-behind off, with ``--keeping-cache`` without its
drop-behind; then, apart, ``curl | sha256sum`` (what checking the bytes costs a plain
download).
Goal (the issue): the fill within 1.1x of curl. The server is a process of its own, so
the fill shares neither its loop nor its interpreter's lock with it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuneplane_node import durable
from tuneplane_node.fetch.fetching import Fetcher
from tuneplane_node.jobs.volumes.fills import VolumeFills
from tuneplane_node.jobs.volumes.store import VolumeStore
from tuneplane_node.runtime.reach import Reach

SERVER = """
import sys
from aiohttp import web
app = web.Application()
app.router.add_static("/", sys.argv[1])
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=None)
"""


def serve(directory: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """The file server, a process of its own: neither client shares its interpreter (a
    thread of the bench's, as before, took the fill's GIL and not curl's); its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(directory), str(port)])
    deadline = time.monotonic() + 30
    while True:
        with socket.socket() as attempt:
            if attempt.connect_ex(("127.0.0.1", port)) == 0:
                return f"http://127.0.0.1:{port}", server
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the file server did not start")
        time.sleep(0.05)


def fill(url: str, digest: str, work: Path, *, behind: bool = True, drop: bool = True) -> float:
    """The node's fill into a fresh store, gone after (as curl's file is: neither side
    leaves its bytes in the page cache for the other). ``behind`` False: the fill
    without its write-behind (every byte left dirty for the fsync at the end) nor its
    drop-behind; ``drop`` False: without its drop-behind (every byte left in the page
    cache, as before `drop_behind`)."""
    store = work / "store"
    durable.write_behind = WRITE_BEHIND if behind else _not_behind
    durable.drop_behind = DROP_BEHIND if behind and drop else _not_behind
    os.sync()  # the last run's dirty pages are written before this one's clock starts

    async def once() -> float:
        host = url.split("/")[2]  # the bench's own server, on loopback over plain http
        fetcher = Fetcher(stall_s=60, reach=Reach(["127.0.0.0/8"]), insecure=frozenset({host}))
        fills = VolumeFills(VolumeStore(store), fetcher, limit=4)
        try:
            started = time.perf_counter()
            await fills.ensure(digest, url)
            return time.perf_counter() - started
        finally:
            await fills.close()

    try:
        return asyncio.run(once())
    finally:
        shutil.rmtree(store, ignore_errors=True)


WRITE_BEHIND = durable.write_behind
DROP_BEHIND = durable.drop_behind


def _not_behind(fd: int, offset: int, length: int) -> None:
    return None


def curl(url: str, work: Path, *, hashed: bool) -> float:
    """curl of the same URL onto the same disk, its file fsynced as the fill's is."""
    target = work / "curl.out"
    os.sync()
    started = time.perf_counter()
    if hashed:
        subprocess.run(f"curl -sf {url} | tee {target} | sha256sum", shell=True, check=True,
                       capture_output=True)  # fmt: skip
    else:
        subprocess.run(["curl", "-sf", "-o", str(target), url], check=True)
    with target.open("rb") as written:
        os.fsync(written.fileno())
    elapsed = time.perf_counter() - started
    target.unlink()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first, not counted")
    parser.add_argument(
        "--without-write-behind",
        action="store_true",
        help="one more side: the fill with its write-behind and drop-behind off",
    )
    parser.add_argument(
        "--keeping-cache",
        action="store_true",
        help="one more side: the fill with its drop-behind off (what dropping saves)",
    )
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
        os.sync()
        url, server = serve(work / "served")
        url += "/weights"
        digest = hasher.hexdigest()
        pair = {
            "fill": lambda: fill(url, digest, work),
            "curl -o": lambda: curl(url, work, hashed=False),
        }
        if args.without_write_behind:
            pair["fill, no write-behind"] = lambda: fill(url, digest, work, behind=False)
        if args.keeping_cache:
            pair["fill, cache kept"] = lambda: fill(url, digest, work, drop=False)
        times: dict[str, list[float]] = {name: [] for name in [*pair, "curl | sha256sum"]}
        try:
            for number in range(args.warmup + args.rounds):
                # Whoever goes first meets another page cache: the order turns each round.
                for name in list(pair) if number % 2 == 0 else list(reversed(pair)):
                    elapsed = pair[name]()
                    if number >= args.warmup:
                        times[name].append(elapsed)
            # Apart from the pairs: a `curl -o` run right after it measured up to 2x slower.
            for _ in range(args.rounds):
                times["curl | sha256sum"].append(curl(url, work, hashed=True))
        finally:
            server.terminate()
            server.wait()
        for name, each in times.items():
            best = statistics.median(each)
            print(f"{name:22} median {best:6.2f} s  {args.mib / best:7.0f} MiB/s  {each}")
        ratio = statistics.median(times["fill"]) / statistics.median(times["curl -o"])
        rounds = [f"{a / b:.2f}" for a, b in zip(times["fill"], times["curl -o"], strict=True)]
        print(f"fill / curl -o: {ratio:.2f}x (medians); each round: {', '.join(rounds)}")
        if args.without_write_behind:
            off = times["fill, no write-behind"]
            ratio = statistics.median(off) / statistics.median(times["fill"])
            rounds = [f"{a / b:.2f}" for a, b in zip(off, times["fill"], strict=True)]
            print(f"no write-behind / fill: {ratio:.2f}x (medians); rounds: {', '.join(rounds)}")
        if args.keeping_cache:
            kept = times["fill, cache kept"]
            ratio = statistics.median(kept) / statistics.median(times["fill"])
            rounds = [f"{a / b:.2f}" for a, b in zip(kept, times["fill"], strict=True)]
            print(f"cache kept / fill: {ratio:.2f}x (medians); rounds: {', '.join(rounds)}")


if __name__ == "__main__":
    main()
