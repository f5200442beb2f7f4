"""networks (issues 38 and 40): what a job network of its own adds to a launch and a removal.

Two daemons on one engine, at once: one with ``TUNEPLANE_JOB_NETWORK=isolated`` (the
default), one with ``bridge`` (the engine's shared default network: the path without
it). Within each round, the order turned each round: a launch through each daemon's API
asking ``network: bridge`` (so the job is on the node's job network), then its removal;
both timed as the console sees them. On podman (the default here) ``isolated`` makes a
bridge network of the job's own with the node's firewall rules, and takes both away
with the job: that is the cost measured. On docker ``isolated`` is one network of the
node's, made once, that a job joins at its create (``--engine docker`` measures it
where the engine has a default bridge; the development engines have none).
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from harness import (
    IMAGE,
    LABEL_BENCH,
    SLEEP,
    Api,
    Daemon,
    docker_host,
    machine,
    median,
    ms,
    percentile,
    timed,
)

PODMAN_URL = "unix:///run/podman/podman.sock"  # the development podman (engines.sh)
SETTINGS = ("isolated", "bridge")


def engine_env(engine: str, network: str) -> dict[str, str]:
    env = {"TUNEPLANE_JOB_NETWORK": network, "TUNEPLANE_LOCAL_RUNTIME": engine}
    if engine == "podman":
        env["TUNEPLANE_PODMAN_URL"] = PODMAN_URL
    else:
        env["TUNEPLANE_DOCKER_HOST"] = docker_host()
    return env


def body(name: str, session: str) -> dict[str, Any]:
    container = {
        "name": name,
        "image": IMAGE,
        "command": SLEEP,
        "network": "bridge",
        "labels": {LABEL_BENCH: session},
    }
    return {"run_id": name, "requested_gpus": 0, "container": container}


def once(api: Api, name: str, session: str, network: str, made: set[str]) -> tuple[float, float]:
    """One launch and its removal, each timed; the job must be on the network asked."""
    made.add(name)
    launched = timed(lambda: api.launch(body(name, session)))
    got = api.observe([name])[name].get("network")
    if got != network:
        raise SystemExit(f"{name}: on the network {got!r}, not {network!r}")
    removed = timed(lambda: api.remove(name))
    made.discard(name)
    return launched, removed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--engine", choices=("podman", "docker"), default="podman")
    args = parser.parse_args()
    print(machine())
    session = uuid.uuid4().hex[:8]
    times: dict[str, list[float]] = {}
    daemons = {network: Daemon(env=engine_env(args.engine, network)) for network in SETTINGS}
    apis: dict[str, Api] = {}
    made: set[str] = set()  # launched and not removed yet: removed however the run ends
    try:
        apis |= {network: Api(daemon.start().url) for network, daemon in daemons.items()}
        for number in range(1 + args.rounds):  # one round first, not counted
            order = SETTINGS if number % 2 == 0 else tuple(reversed(SETTINGS))
            for network in order:
                name = f"tuneplane-bench-net-{session}-{network}-{number}"
                launched, removed = once(apis[network], name, session, network, made)
                if number:
                    times.setdefault(f"launch, {network}", []).append(launched)
                    times.setdefault(f"remove, {network}", []).append(removed)
    finally:
        for name in made:
            apis[name.split("-")[-2]].remove(name)
        for daemon in daemons.values():
            daemon.stop()
    print(f"{args.engine}, {args.rounds} rounds, image present, 0 cards:")
    for label, each in times.items():
        print(f"  {label:18} median {ms(median(each))}, p90 {ms(percentile(each, 90))}")
    for verb in ("launch", "remove"):
        added = median(times[f"{verb}, isolated"]) - median(times[f"{verb}, bridge"])
        print(f"  {verb}: a network of the job's own adds {ms(added)} (medians)")


if __name__ == "__main__":
    main()
