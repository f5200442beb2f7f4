"""usage: the stats sampler's read of 300 running jobs' cgroup files, against a peer's.

Every ``TUNEPLANE_STATS_INTERVAL_S`` (5 s) the sampler reads each running job's CPU,
memory and pids from its cgroup files (`tuneplane_node.runtime.cgroups.read`), all of
them in one call on the engine's pool. That thread holds the GIL for most of the call:
a request burst it overlaps waits for it (a timeline of `load.py`'s bursts found one of
48 ms of CPU in the slowest bursts). Here: the thread CPU of one read of all the
fleet's jobs, this checkout's `cgroups.read` against ``--peer``'s (its module loaded
from its file), alternating, ``--rounds`` of each; the median and the ratio.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

from harness import (
    REPO,
    Fleet,
    arguments,
    fleet,
    machine,
    median,
    ms,
    peer_arguments,
    peer_checkout,
    rotated,
)

from tuneplane_node.runtime import cgroups


def module_of(checkout: Path) -> ModuleType:
    """The checkout's ``cgroups`` module, loaded from its file under another name."""
    path = checkout / "tuneplane_node" / "runtime" / "cgroups.py"
    spec = importlib.util.spec_from_file_location("peer_cgroups", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def located(made: Fleet, names: list[str]) -> list[cgroups.CgroupDirs]:
    api = made.client.api
    found = []
    for name in names:
        doc = api.inspect_container(name)
        dirs = cgroups.locate(doc["State"]["Pid"], must_hold=doc["Id"])
        if dirs is None:
            raise SystemExit(f"{name}: its cgroup is not readable from here")
        found.append(dirs)
    return found


def one_read(module: ModuleType, dirs: list[cgroups.CgroupDirs]) -> float:
    """Thread CPU of one read of every job, as the sampler makes it."""
    started = time.thread_time()
    read = [module.read(each) for each in dirs]
    spent = time.thread_time() - started
    if any(usage is None or usage.memory_bytes is None for usage in read):
        raise SystemExit("a job read no figures")
    return spent


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], containers=300, rounds=20)
    peer_arguments(parser)
    args = parser.parse_args()
    peer = peer_checkout(args.peer)
    print(machine())
    sides = {"this": cgroups, "peer": module_of(peer or REPO)}
    with fleet("usage") as made:
        dirs = located(made, made.create(args.containers))
        times: dict[str, list[float]] = {"this": [], "peer": []}
        for index in range(args.rounds):
            for side in rotated(["this", "peer"], index):
                times[side].append(one_read(sides[side], dirs))
    for side, spent in times.items():
        print(f"{side}: one read of {args.containers} jobs, {ms(median(spent))} CPU (median)")
    ratio = median(times["this"]) / median(times["peer"])
    print(f"this / peer: {ratio:.3f}{'' if peer else ' (no --peer: this against itself)'}")


if __name__ == "__main__":
    main()
