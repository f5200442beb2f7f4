"""volumelaunch (issue 39): what present volumes add to a launch.

One daemon, one run, alternating within each round: a launch through the API naming 4
volumes already in the node's store (prefetched with ``POST /node/v1/volumes/pull``
before the first round) against the same launch with none (image present, 0 GPUs;
removal not timed). What is timed is the console's launch call: the store's check that
each entry is there, its file opened without links and bound read-only at the job's
staging path, the ``tuneplane.volumes`` label, and the engine's create and start of the
4 extra binds. Goal (the issue): present volumes add under 20 ms to a launch.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from harness import (
    Api,
    Daemon,
    Fleet,
    arguments,
    fleet,
    machine,
    median,
    ms,
    percentile,
    rotated,
    timed,
)
from launch import launch_body
from mounts import staged
from volumes import serve

from tuneplane_node.jobs.words import Opened
from tuneplane_node.wire.values import Mount

OPEN = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC  # as the keeper opens an entry

VOLUMES = 4
METHODS = ("4 volumes", "none")


def volume_files(directory: Path, mib: int) -> list[tuple[str, str]]:
    """Four files of random bytes: (name, sha256)."""
    directory.mkdir(parents=True, exist_ok=True)
    made = []
    for index in range(VOLUMES):
        data = os.urandom(mib * 2**20)
        (directory / f"v{index}.bin").write_bytes(data)
        made.append((f"v{index}.bin", hashlib.sha256(data).hexdigest()))
    return made


class Rounds:
    """Each launch, and its removal, untimed, afterwards."""

    def __init__(self, api: Api, made: Fleet, volumes: list[dict[str, str]]) -> None:
        self.api, self.made, self.volumes = api, made, volumes
        self.count = 0

    def run(self, method: str) -> float:
        self.count += 1
        name = self.made.name(self.count) + f"-{'v' if method != 'none' else 'n'}"
        self.made.names.append(name)  # removed at the end even if the round fails
        body = launch_body(name, self.made.session)
        if method != "none":
            body["container"]["volumes"] = self.volumes
        elapsed = timed(lambda: self.api.launch(body))
        self.api.remove(name)  # through the node: its staging released
        return elapsed


def prefetch(api: Api, volumes: list[dict[str, str]]) -> None:
    for volume in volumes:
        body: dict[str, Any] = {
            "source": volume["source"],
            "sha256": volume["sha256"],
            "wait": True,
        }
        answer = api.session.post(api.url + "/node/v1/volumes/pull", json=body)
        if answer.status_code != 200:
            raise RuntimeError(f"volume pull: {answer.status_code} {answer.text}")


def staging_alone(files: list[Path], state: Path, rounds: int) -> dict[str, list[float]]:
    """The node's own work for 4 present volumes, in this process: each entry opened
    without links and bound read-only at the staging path (the launch's part), then
    released (the removal's)."""

    def opened() -> list[Opened]:
        return [
            Opened(Mount(str(path), f"/v/{path.name}", True), os.open(path, OPEN), False)
            for path in files
        ]

    return staged(opened, state, rounds)


def report(times: dict[str, list[float]], alone: dict[str, list[float]]) -> None:
    medians = {method: median(values) for method, values in times.items()}
    for method in METHODS:
        print(f"{method:>9}: median {ms(medians[method])} (min {ms(min(times[method]))})")
    added = medians["4 volumes"] - medians["none"]
    print(f"4 present volumes add: {ms(added)} to a launch through the API")
    for path, values in alone.items():
        spread = f"p90 {ms(percentile(values, 90))}, min {ms(min(values))}"
        print(f"in-process, 4 volumes, the {path}'s part: median {ms(median(values))} ({spread})")
    met = max(added, median(alone["launch"])) < 0.020
    print(f"goal: under 20 ms added: {'MET' if met else 'MISSED'}")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], containers=0, rounds=20)
    parser.add_argument("--mib", type=int, default=16, help="each volume's size")
    args = parser.parse_args()
    print(machine())
    daemon = Daemon()
    files = volume_files(daemon.dir / "served", args.mib)
    base, _ = serve(daemon.dir / "served")
    host = base.removeprefix("http://")
    daemon.extra_env["TUNEPLANE_VOLUME_INSECURE_HOSTS"] = f'["{host}"]'
    daemon.extra_env["TUNEPLANE_VOLUME_ALLOWED_NETWORKS"] = '["127.0.0.0/8"]'
    volumes = [
        {"source": f"{base}/{name}", "path": f"/v/{name}", "sha256": digest}
        for name, digest in files
    ]
    with fleet("volumes") as made, daemon:
        api = Api(daemon.url)
        prefetch(api, volumes)
        rounds = Rounds(api, made, volumes)
        for method in METHODS:  # warm-up: connections, image cache
            rounds.run(method)
        times: dict[str, list[Any]] = {method: [] for method in METHODS}
        for index in range(args.rounds):
            for method in rotated(list(METHODS), index):
                times[method].append(rounds.run(method))
            print(f"round {index + 1}: " + ", ".join(f"{m} {ms(times[m][-1])}" for m in METHODS))
        served = [daemon.dir / "served" / name for name, _ in files]
        alone = staging_alone(served, daemon.dir / "bench-state", args.rounds * 20)
        report(times, alone)
        api.close()


if __name__ == "__main__":
    main()
