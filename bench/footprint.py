"""footprint: the daemon's resident memory, idle and with 300 tracked containers.

VmRSS (and VmHWM, the peak) from /proc/<pid>/status, read after a warm-up of a few
requests and a second of quiet. Each round starts a fresh daemon: first rounds with none
of the bench's containers (idle), then, once the containers exist, rounds whose daemon
fills its cache from them at start-up; each loaded daemon is read again after serving
200 concurrent observe + health requests. One daemon lives through the creation and is
read before and after (its cache fed by events). Goal: under 100 MB.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from harness import Api, Daemon, arguments, fleet, machine, median, proc_status_kib

SETTLE_S = 1.0
CONCURRENT = 200


def warm(api: Api, names: Sequence[str]) -> int:
    """A few requests of each kind; answers how many containers the cache holds."""
    for _ in range(5):
        api.observe(names[:10] or ["tuneplane-bench-none"])
        cached = api.health()["state_cache"]["containers"]
    time.sleep(SETTLE_S)
    return int(cached)


def serve_burst(url: str, names: Sequence[str]) -> None:
    """200 requests at once on 200 connections (half observe of 10 refs, half health)."""

    def one(index: int) -> None:
        api = Api(url)
        if index % 2:
            api.observe(names[index % len(names) :][:10])
        else:
            api.health()
        api.close()

    with ThreadPoolExecutor(CONCURRENT) as pool:
        list(pool.map(one, range(CONCURRENT)))
    time.sleep(SETTLE_S)


def fresh(names: Sequence[str], *, burst: bool) -> tuple[int, int, int]:
    """RSS of a newly started daemon (and after a burst): (rss kB, after-burst kB, cached)."""
    with Daemon() as daemon:
        api = Api(daemon.url)
        cached = warm(api, names)
        rss = proc_status_kib("VmRSS", daemon.pid)
        if burst:
            serve_burst(daemon.url, names)
        after = proc_status_kib("VmRSS", daemon.pid)
        api.close()
    return rss, after, cached


def mb(kb: float) -> str:
    return f"{kb / 1024:.1f} MB"


def main() -> None:
    args = arguments(__doc__.splitlines()[0], containers=300, rounds=5).parse_args()
    print(machine())
    with fleet("footprint") as made, Daemon() as lived:
        api = Api(lived.url)
        idle = [fresh([], burst=False) for _ in range(args.rounds)]
        lived_idle = (proc_status_kib("VmRSS", lived.pid), warm(api, []))
        names = made.create(args.containers)
        api.wait_tracked(names)
        lived_loaded = (proc_status_kib("VmRSS", lived.pid), warm(api, names))
        loaded = [fresh(names, burst=True) for _ in range(args.rounds)]
        peak = proc_status_kib("VmHWM", lived.pid)
        api.close()
    report(idle, loaded, lived_idle, lived_loaded, peak)


def report(
    idle: list[tuple[int, int, int]],
    loaded: list[tuple[int, int, int]],
    lived_idle: tuple[int, int],
    lived_loaded: tuple[int, int],
    peak: int,
) -> None:
    idle_rss = median([rss for rss, _, _ in idle])
    loaded_rss = median([rss for rss, _, _ in loaded])
    after = median([after for _, after, _ in loaded])
    extra = loaded[0][2] - idle[0][2]
    print(f"\nfresh daemon, idle ({idle[0][2]} containers cached): {mb(idle_rss)} (median)")
    print(f"fresh daemon, synced at start ({loaded[0][2]} cached): {mb(loaded_rss)} (median)")
    print(f"  after {CONCURRENT} concurrent observe + health: {mb(after)} (median)")
    print(f"  cost per tracked container: {(loaded_rss - idle_rss) / max(extra, 1):.1f} kB")
    print(f"daemon fed by events: {mb(lived_idle[0])} idle, {mb(lived_loaded[0])} with them")
    print(f"  its peak (VmHWM): {mb(peak)}")
    worst = max(after, loaded_rss, lived_loaded[0])
    print(f"goal: < 100 MB: {'MET' if worst < 100 * 1024 else 'MISSED'} (worst {mb(worst)})")


if __name__ == "__main__":
    main()
