"""mounts (issue 33): what opening and staging a job's mounts adds to its launch.

One daemon, one run, alternating within each round: a launch through the API with 4 host
mounts against one with none (image present, 0 GPUs; removal not timed). The engine's own
cost of 4 binds is measured the same way through the SDK (create+start with the 4 plain
binds against none), so the node's part is the API's difference less the SDK's. The
node's work alone (open 4 paths from their root, bind each at its staging path, and
release them) is timed in this process too: the figure the goal is judged on, since a
launch through the API on a busy two-core machine varies by more than the goal. Goal: the
staging adds under 10 ms to a launch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
from harness import (
    Api,
    Daemon,
    Fleet,
    arguments,
    engine_client,
    fleet,
    machine,
    median,
    ms,
    percentile,
    profiled,
    remove_container,
    rotated,
    timed,
)
from launch import launch_body, sdk_options

from tuneplane_node.jobs.mounts.policy import MountPolicy
from tuneplane_node.jobs.mounts.staging import MountStaging
from tuneplane_node.jobs.words import Opened
from tuneplane_node.wire.values import Mount

MOUNTS = 4
METHODS = ("api 4 mounts", "api none", "sdk 4 binds", "sdk none")


def mount_dirs(storage: Path) -> list[list[object]]:
    """Four directories as a launch names them, two of them read-only."""
    dirs = [storage / "tenant" / f"ckpt{i}" for i in range(MOUNTS)]
    for directory in dirs:
        directory.mkdir(parents=True, exist_ok=True)
    return [[str(d), f"/m{i}", i % 2 == 0] for i, d in enumerate(dirs)]


class Rounds:
    """Each way of starting one container, and its removal, untimed, afterwards."""

    def __init__(self, api: Api, made: Fleet, sdk: docker.DockerClient, mounts: list[Any]):
        self.api, self.made, self.sdk, self.mounts = api, made, sdk, mounts
        self.count = 0

    def body(self, tag: str, mounts: list[Any]) -> dict[str, Any]:
        self.count += 1
        name = self.made.name(self.count) + f"-{tag}"
        self.made.names.append(name)  # removed at the end even if the round fails
        body = launch_body(name, self.made.session)
        body["container"]["mounts"] = mounts
        return body

    def api_launch(self, mounts: list[Any]) -> float:
        body = self.body("api", mounts)
        elapsed = timed(lambda: self.api.launch(body))
        self.api.remove(body["container"]["name"])  # through the node: staging released
        return elapsed

    def sdk_launch(self, mounts: list[Any]) -> float:
        body = self.body("sdk", mounts)
        options = sdk_options(body)  # the plain binds, as the node before issue 33 gave them
        elapsed = timed(lambda: self.sdk.containers.create(**options).start())
        remove_container(self.sdk, body["container"]["name"])
        return elapsed

    def run(self, method: str) -> float:
        mounts = self.mounts if "4" in method else []
        return self.api_launch(mounts) if method.startswith("api") else self.sdk_launch(mounts)


def staging_alone(
    storage: Path, state: Path, mounts: list[Any], rounds: int
) -> dict[str, list[float]]:
    """The node's own work for one job, in this process: the launch's (open 4 paths from
    their root, bind each at its staging path) and the removal's (release them)."""
    policy = MountPolicy([storage], never_a_root=lambda path: None)
    given = [Mount(host, target, read_only) for host, target, read_only in mounts]
    return staged(lambda: policy.open(given), state, rounds)


def staged(opened: Callable[[], list[Opened]], state: Path, rounds: int) -> dict[str, list[float]]:
    """``rounds`` (after a warm-up) of one job's staging: what ``opened`` opens bound at
    its staging path (the launch's part), then released (the removal's)."""
    staging = MountStaging(state)
    times: dict[str, list[float]] = {"launch": [], "removal": []}

    def launch() -> None:
        each_opened = opened()
        try:
            staging.stage("bench.0", each_opened)
        finally:
            for each in each_opened:
                each.close()

    for index in range(rounds + 1):  # the first is a warm-up
        launched, removed = timed(launch), timed(lambda: staging.release("bench.0"))
        if index:
            times["launch"].append(launched)
            times["removal"].append(removed)
    return times


def report(times: dict[str, list[float]], alone: dict[str, list[float]]) -> None:
    medians = {method: median(values) for method, values in times.items()}
    for method in METHODS:
        print(f"{method:>13}: median {ms(medians[method])} (min {ms(min(times[method]))})")
    api = medians["api 4 mounts"] - medians["api none"]
    sdk = medians["sdk 4 binds"] - medians["sdk none"]
    print(f"4 mounts add, through the API: {ms(api)}; the engine's 4 binds alone: {ms(sdk)}")
    print(f"the node's part (API's less the engine's): {ms(api - sdk)}")
    for path, values in alone.items():
        spread = f"p90 {ms(percentile(values, 90))}, min {ms(min(values))}"
        print(f"in-process, 4 mounts, the {path}'s part: median {ms(median(values))} ({spread})")
    staged = median(alone["launch"])
    print(f"goal: staging adds under 10 ms to a launch: {'MET' if staged < 0.010 else 'MISSED'}")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], containers=0, rounds=20)
    args = parser.parse_args()
    print(machine())
    sdk = engine_client()
    daemon = Daemon()
    storage = daemon.dir / "storage"
    mounts = mount_dirs(storage)
    daemon.extra_env["TUNEPLANE_STORAGE_ROOT"] = str(storage)
    with fleet("mounts") as made, daemon:
        api = Api(daemon.url)
        rounds = Rounds(api, made, sdk, mounts)
        for method in METHODS:  # warm-up: connections, image cache
            rounds.run(method)
        times: dict[str, list[float]] = {method: [] for method in METHODS}
        with profiled(daemon, args.profile):
            for index in range(args.rounds):
                for method in rotated(list(METHODS), index):
                    times[method].append(rounds.run(method))
                print(
                    f"round {index + 1}: " + ", ".join(f"{m} {ms(times[m][-1])}" for m in METHODS)
                )
        alone = staging_alone(storage, daemon.dir / "bench-state", mounts, args.rounds * 20)
        report(times, alone)
        api.close()
    sdk.close()


if __name__ == "__main__":
    main()
