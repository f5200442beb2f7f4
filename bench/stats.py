"""stats: per-job resource usage for 300 running jobs, against `docker stats --no-stream`.

Two questions, each a ratio measured in the same run against `docker stats --no-stream`
for the same 300 containers (issue 13):

1. A ``POST /node/v1/stats`` of 300 refs, answered from the samples: wall time per call
   (median of a batch per round) against one `docker stats --no-stream` of the 300.
   Goal: under 10 ms.
2. What sampling 300 jobs costs: the CPU time of a daemon sampling every 5 s (the
   default) less that of a second daemon on the same fleet that samples once an hour,
   over the same window; per sample, and as a share of one core. Against the CPU one
   `docker stats --no-stream` costs (the CLI's own, plus the engine's during it).
   Goal: under 5% of one core.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import requests
from harness import (
    HEADERS,
    Daemon,
    arguments,
    cpu_seconds,
    docker_host,
    fleet,
    machine,
    median,
    ms,
    rotated,
)

CALLS_PER_ROUND = 20
INTERVAL_S = 5.0  # the default
DOCKERD_PID = Path("/run/tuneplane-dev/docker.pid")


def stats_call(session: requests.Session, url: str, names: list[str]) -> dict[str, Any]:
    answer = session.post(url + "/node/v1/stats", json={"refs": names})
    answer.raise_for_status()
    return answer.json()["stats"]  # type: ignore[no-any-return]


def wait_sampled(session: requests.Session, url: str, names: list[str]) -> None:
    """Until every job has a CPU figure: two samples since the fleet was tracked."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        answer = stats_call(session, url, names)
        if all(job.get("cpu_ratio") is not None for job in answer.values()):
            return
        time.sleep(0.5)
    raise RuntimeError("the daemon never sampled every job twice")


def docker_stats(names: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the CLI and of dockerd) of one --no-stream."""
    engine = int(DOCKERD_PID.read_text()) if DOCKERD_PID.exists() else None
    before_engine = cpu_seconds(engine) if engine else 0.0
    before = os.times()
    started = time.perf_counter()
    subprocess.run(
        ["docker", "-H", docker_host(), "stats", "--no-stream", *names],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - started
    after = os.times()
    cli = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    engine_cpu = (cpu_seconds(engine) - before_engine) if engine else 0.0
    return wall, cli + engine_cpu


def api_round(session: requests.Session, url: str, names: list[str]) -> float:
    walls = []
    for _ in range(CALLS_PER_ROUND):
        started = time.perf_counter()
        stats_call(session, url, names)
        walls.append(time.perf_counter() - started)
    return median(walls)


def sampling_round(sampling: Daemon, idle: Daemon, window: float) -> float:
    """CPU seconds the sampling daemon spent over the idle one's, per sample."""
    a, b = sampling.cpu_seconds(), idle.cpu_seconds()
    time.sleep(window)
    extra = (sampling.cpu_seconds() - a) - (idle.cpu_seconds() - b)
    return extra / (window / INTERVAL_S)


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], containers=300, rounds=3)
    parser.add_argument("--window", type=float, default=30.0, help="seconds per cost round")
    args = parser.parse_args()
    print(machine())
    every = {"TUNEPLANE_STATS_INTERVAL_S": str(INTERVAL_S)}
    hourly = {"TUNEPLANE_STATS_INTERVAL_S": "3600"}
    with fleet("stats") as made, Daemon(env=every) as sampling, Daemon(env=hourly) as idle:
        names = made.create(args.containers)
        session = requests.Session()
        session.headers.update(HEADERS)
        wait_sampled(session, sampling.url, names)
        api, docker, cost, docker_cpu = [], [], [], []
        for round_index in range(args.rounds):
            for method in rotated(["api", "docker"], round_index):
                if method == "api":
                    api.append(api_round(session, sampling.url, names))
                else:
                    wall, cpu = docker_stats(names)
                    docker.append(wall)
                    docker_cpu.append(cpu)
            cost.append(sampling_round(sampling, idle, args.window))
            print(
                f"round {round_index + 1}: api {ms(api[-1])}, docker stats {ms(docker[-1])}, "
                f"sample {ms(cost[-1])} CPU, docker stats {ms(docker_cpu[-1])} CPU",
                flush=True,
            )
        session.close()
    report(api, docker, cost, docker_cpu)


def spread(values: list[float]) -> str:
    return f"median {ms(median(values))} (rounds {ms(min(values))} to {ms(max(values))})"


def report(api: list[float], docker: list[float], cost: list[float], cpu: list[float]) -> None:
    faster = median(docker) / median(api)
    print(f"\n1. stats of 300 refs: {spread(api)}")
    print(f"   docker stats --no-stream: {spread(docker)}: {faster:.0f}x the API's time")
    share = [c / INTERVAL_S for c in cost]
    low, high = 100 * min(share), 100 * max(share)
    print(f"2. one sample of 300 jobs, daemon CPU: {spread(cost)}")
    core = 100 * median(share)
    print(f"   = {core:.2f}% of one core at {INTERVAL_S:g} s ({low:.2f} to {high:.2f}%)")
    print(f"   docker stats --no-stream, CLI + engine CPU: {spread(cpu)}: "
          f"{median(cpu) / median(cost):.1f}x a sample")  # fmt: skip
    api_ok, cost_ok = median(api) < 0.010, max(share) < 0.05
    print(f"goals: < 10 ms {'MET' if api_ok else 'MISSED'}; < 5% {'MET' if cost_ok else 'MISSED'}")


if __name__ == "__main__":
    main()
