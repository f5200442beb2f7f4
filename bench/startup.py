"""startup: from ``tuneplane-node serve`` to its first healthy answer, with 1,000 jobs.

Each round starts fresh daemons and polls ``GET /node/v1/health`` every 5 ms until it
answers ``ok`` with the state cache synced and holding every container of the fleet:
(a) the daemon as it is (it answers from the engine's list; the fill that reads every
    container follows in the background, FILL_THREADS inspects at once);
(b) the same daemon with a background fill of one inspect at a time, by a wrapper that
    sets ``FILL_THREADS = 1`` before the module runs (the first answer waits on neither);
(c) a daemon started before the fleet exists (its own start: Python, imports, engine);
(d) what a CLI-wrapping daemon pays: ``docker ps -aq`` of the fleet, then one
    ``docker inspect`` of all of them (a single process).
Methods alternate within each round. Goal: (a) under 1 s, and never a half-filled answer
(health answers ``ok`` only once every container is in).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import requests
from harness import (
    HEADERS,
    LABEL_BENCH,
    Daemon,
    arguments,
    docker_host,
    fleet,
    machine,
    median,
    rotated,
)

POLL_S = 0.005
WRAPPER = Path(__file__).with_name("fillthreads.py")


def first_healthy(daemon: Daemon, wanted: int) -> tuple[float, int]:
    """Seconds from Popen to a healthy answer holding ``wanted`` containers; and how many
    answers came before it (each must be 503 or not ok: never a partial count)."""
    started = time.monotonic()
    daemon.process = subprocess.Popen(
        [sys.executable, *daemon.python_args, "-m", "tuneplane_node", "serve",
         "--host", "127.0.0.1", "--port", str(daemon.port)],
        cwd=daemon.dir, env=daemon.environment(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    early = 0
    while time.monotonic() - started < 120:
        try:
            answer = requests.get(daemon.url + "/node/v1/health", headers=HEADERS, timeout=5)
        except requests.RequestException:
            time.sleep(POLL_S)
            continue
        body = answer.json()
        cache = body.get("state_cache") or {}
        if body.get("ok") and cache.get("synced"):
            if cache["containers"] < wanted:
                raise RuntimeError(f"a healthy answer with {cache['containers']} of {wanted}")
            return time.monotonic() - started, early
        early += 1
        time.sleep(POLL_S)
    raise RuntimeError("no healthy answer within 120 s")


def timed_daemon(wanted: int, *, sequential: bool) -> float:
    daemon = Daemon(
        python_args=[str(WRAPPER)] if sequential else [],
        env={"BENCH_FILL_THREADS": "1"} if sequential else {},
    )
    try:
        seconds, _ = first_healthy(daemon, wanted)
    finally:
        daemon.stop()
    return seconds


def cli(session: str) -> float:
    env = os.environ | {"DOCKER_HOST": docker_host()}
    started = time.monotonic()
    ids = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label={LABEL_BENCH}={session}"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    subprocess.run(["docker", "inspect", *ids], env=env, capture_output=True, check=True)
    return time.monotonic() - started


def main() -> None:
    args = arguments(__doc__.splitlines()[0], containers=1000, rounds=3).parse_args()
    print(machine())
    with fleet("startup") as made:
        idle = [first_healthy_idle() for _ in range(args.rounds)]  # before the fleet
        made.create(args.containers)
        others = len(requests_count()) - args.containers  # other nodes' jobs on the engine
        wanted = args.containers
        methods = {
            "parallel": lambda: timed_daemon(wanted, sequential=False),
            "sequential": lambda: timed_daemon(wanted, sequential=True),
            "cli": lambda: cli(made.session),
        }
        figures: dict[str, list[float]] = {name: [] for name in methods}
        for round_index in range(args.rounds):
            for name in rotated(list(methods), round_index):
                figures[name].append(methods[name]())
    print(f"\n{args.containers} containers of the fleet, and {others} of other nodes")
    for name, values in [*figures.items(), ("idle daemon", idle)]:
        spread = f"rounds {min(values):.2f} to {max(values):.2f}"
        print(f"{name:12} median {median(values):.2f} s ({spread})")
    ratio = median(figures["sequential"]) / median(figures["parallel"])
    print(
        f"sequential / parallel: {ratio:.2f}x; parallel / cli: "
        f"{median(figures['parallel']) / median(figures['cli']):.2f}x"
    )
    worst = max(figures["parallel"])
    verdict = "MET" if worst < 1 else "MISSED"
    print(f"goal: < 1 s to the first healthy answer: {verdict} (worst {worst:.2f} s)")


def requests_count() -> list[str]:
    """The labelled containers of other nodes on the engine (the daemon tracks them too)."""
    env = os.environ | {"DOCKER_HOST": docker_host()}
    listed = subprocess.run(
        ["docker", "ps", "-aq", "--filter", "label=tuneplane.run-id"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return listed.stdout.split()


def first_healthy_idle() -> float:
    """A daemon's own start, before the fleet's containers exist."""
    return timed_daemon(0, sequential=False)


if __name__ == "__main__":
    main()
