"""scratch (issue 34): what a job's scratch space adds to its launch, by its size.

In this process, the node's own work for one job, by the code a launch runs
(`ScratchSpaces.make`: the sparse file, mkfs.ext4, the loop device, the mount; then the
staging bind) and its removal (`MountStaging.release`, `ScratchSpaces.release`), for
scratch of 50 MiB, 1 GiB and 50 GiB, with the disk a new one takes (its file's allocated
blocks). Then one daemon, alternating within each round: a launch through the API with a
50 GiB scratch against one with none (image present, 0 GPUs; removal untimed). Goal: a
scratch of 50 GiB adds under 1 s to a launch (the file is sparse). Root: it mounts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness import Api, Daemon, Fleet, arguments, fleet, machine, median, ms, rotated, timed
from launch import launch_body

from tuneplane_node.jobs.mounts.scratch import ScratchSpaces
from tuneplane_node.jobs.mounts.staging import MountStaging
from tuneplane_node.settings import load_settings
from tuneplane_node.wire.values import Scratch

SIZES = {"50 MiB": 50 * 2**20, "1 GiB": 2**30, "50 GiB": 50 * 2**30}
METHODS = ("api scratch 50g", "api none")


def alone(state: Path, rounds: int) -> dict[str, dict[str, float]]:
    """Per size: the launch's part and the removal's (medians, max), the disk taken."""
    settings = load_settings(node_token="b" * 16, node_state_dir=state)
    spaces, staging = ScratchSpaces(settings), MountStaging(state)
    found: dict[str, dict[str, float]] = {}
    for label, size in SIZES.items():
        launches, removals, taken = [], [], 0
        for index in range(rounds + 1):  # the first is a warm-up
            key = f"bench.{index}"

            def launch(key: str = key, size: int = size) -> None:
                opened = spaces.make(key, Scratch("/scratch", size))
                try:
                    staging.stage(key, [opened])
                finally:
                    opened.close()

            def remove(key: str = key) -> None:
                staging.release(key)  # its binds first, as a container's removal does
                spaces.release(key)

            launched = timed(launch)
            taken = os.stat(spaces.file(key)).st_blocks * 512
            removed = timed(remove)
            if index:
                launches.append(launched)
                removals.append(removed)
        found[label] = {
            "launch": median(launches),
            "launch max": max(launches),
            "removal": median(removals),
            "taken": taken,
        }
    return found


class Rounds:
    def __init__(self, api: Api, made: Fleet):
        self.api, self.made, self.count = api, made, 0

    def run(self, method: str) -> float:
        self.count += 1
        name = self.made.name(self.count)
        self.made.names.append(name)  # removed at the end even if the round fails
        body: dict[str, Any] = launch_body(name, self.made.session)
        if "scratch" in method:
            body["container"]["scratch"] = {"path": "/scratch", "size": "50g"}
        elapsed = timed(lambda: self.api.launch(body))
        self.api.remove(name)  # through the node: the scratch released
        return elapsed


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], containers=0, rounds=10)
    args = parser.parse_args()
    print(machine())
    daemon = Daemon()
    found = alone(daemon.dir / "bench-state", args.rounds)
    for label, figures in found.items():
        print(
            f"in-process, {label:>6}: launch {ms(figures['launch'])} (max "
            f"{ms(figures['launch max'])}), removal {ms(figures['removal'])}, "
            f"disk taken {figures['taken'] / 2**20:.1f} MiB"
        )
    with fleet("scratch") as made, daemon:
        api = Api(daemon.url)
        rounds = Rounds(api, made)
        for method in METHODS:  # warm-up: connections, image cache
            rounds.run(method)
        times: dict[str, list[float]] = {method: [] for method in METHODS}
        for index in range(args.rounds):
            for method in rotated(list(METHODS), index):
                times[method].append(rounds.run(method))
        api.close()
    medians = {method: median(values) for method, values in times.items()}
    for method in METHODS:
        print(f"{method:>16}: median {ms(medians[method])} (min {ms(min(times[method]))})")
    added = medians[METHODS[0]] - medians[METHODS[1]]
    print(f"a 50 GiB scratch adds, through the API: {ms(added)}")
    cost = found["50 GiB"]["launch"]
    print(f"goal: a 50 GiB scratch adds under 1 s to a launch: {'MET' if cost < 1 else 'MISSED'}")


if __name__ == "__main__":
    main()
