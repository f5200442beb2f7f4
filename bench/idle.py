"""idle: the daemon's CPU while nothing is asked of it, with 300 tracked containers.

What a daemon costs a machine between a console's calls: its background loops (the
state cache's relist, the disk monitor's passes, the stats sampler, the card and notice
watchers, the image GC), on a fleet of running containers. Each daemon is started over
the fleet, settled (its start-up passes done), then left alone for ``--seconds`` while
its CPU clock is read; with ``--peer`` the same for another checkout's daemon,
alternately. The figure: the daemon's CPU per second of idleness (shown in ms: 10 ms
is 1 % of a core).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from harness import (
    Api,
    Daemon,
    arguments,
    code_version,
    cpu_seconds,
    fleet,
    machine,
    peer_arguments,
    peer_checkout,
    settle,
    this_or_alternated,
)


def measured(args: argparse.Namespace, names: list[str], checkout: Path) -> dict[str, float]:
    with Daemon(checkout=checkout) as daemon:
        api = Api(daemon.url)
        api.wait_tracked(names)
        settle(daemon.pid)
        before, started = cpu_seconds(daemon.pid), time.monotonic()
        time.sleep(args.seconds)
        cpu, wall = cpu_seconds(daemon.pid) - before, time.monotonic() - started
        api.close()
    print(
        f"daemon {code_version(checkout)}: {cpu * 1000:.2f} ms of CPU over {wall:.1f} s idle, "
        f"{cpu / wall * 1000:.2f} ms/s ({cpu / wall:.2%} of a core)"
    )
    return {"idle CPU per second": cpu / wall}


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], containers=300, rounds=1)
    parser.add_argument("--seconds", type=float, default=60.0, help="idle time measured")
    peer_arguments(parser)
    args = parser.parse_args()
    peer = peer_checkout(args.peer)
    print(machine())
    with fleet("idle") as made:
        names = made.create(args.containers)
        this_or_alternated(peer, args, lambda checkout: measured(args, names, checkout))


if __name__ == "__main__":
    main()
