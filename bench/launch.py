"""launch overhead: a launch through the API against the same create+start through the SDK.

Image present, 0 GPUs. The SDK side gets the very options the daemon would use
(``DockerRuntime.create_options`` of the spec the wire parses from the same body) and
makes the same two calls the daemon's runtime makes (``containers.create`` then
``start``) on the same network (the node's job network, where a 0-card launch under a
plain ``serve`` runs since issue 38); a third side starts it on the host's network, as
0.3.15 did, for what that network costs. Each round does one of each, in an order that
turns; removal is not timed. Goal: the API within 10% of the SDK.

With ``--kinds plain,mounts,podman,volume,burst --pairs 4`` (issue 56), instead: each
kind of launch against the SDK doing the same work, timed to the engine's start event,
with the node's own breakdown (bench/launchkinds.py).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import docker
from harness import (
    IMAGE,
    LABEL_BENCH,
    SLEEP,
    Api,
    Daemon,
    Fleet,
    arguments,
    docker_host,
    engine_client,
    fleet,
    machine,
    median,
    ms,
    profiled,
    remove_container,
    rotated,
    timed,
)

from tuneplane_node.jobs.launcher import launch_request
from tuneplane_node.jobs.words import LaunchRequest
from tuneplane_node.runtime.engines.docker import DockerRuntime
from tuneplane_node.runtime.engines.networks.jobnetwork import DOCKER_NAMES, ISOLATED
from tuneplane_node.settings import load_settings
from tuneplane_node.wire.requests import parse_launch as read_launch

JOB_NETWORK = DOCKER_NAMES[ISOLATED]


def parse_launch(body: Any) -> LaunchRequest:
    """A launch as the contract reads it and the launcher makes the service's request of it."""
    return launch_request(read_launch(body))


def launch_body(name: str, session: str, cards: int = 0) -> dict[str, Any]:
    container = {"name": name, "image": IMAGE, "command": SLEEP, "labels": {LABEL_BENCH: session}}
    return {"run_id": name, "requested_gpus": cards, "container": container}


def sdk_options(body: dict[str, Any]) -> dict[str, Any]:
    """What DockerRuntime.run would pass to containers.create for this body (0 cards)."""
    spec = replace(parse_launch(body).spec, gpus=())
    runtime = DockerRuntime(load_settings(docker_host=docker_host(), local_gpu_count=0))
    try:
        return runtime.create_options(spec)
    finally:
        runtime.pool.close()
        runtime.client.close()


class Launcher:
    """Both ways of starting one container, and removing it untimed afterwards."""

    def __init__(self, api: Api, made: Fleet, sdk: docker.DockerClient) -> None:
        self.api, self.made, self.sdk = api, made, sdk
        self.count = 0
        self.extra: dict[str, list[float]] = {"inspect image": [], "inspect container": []}

    def body(self, method: str) -> dict[str, Any]:
        self.count += 1
        name = self.made.name(self.count) + f"-{method}"
        self.made.names.append(name)  # removed at the end even if the round fails
        return launch_body(name, self.made.session)

    def through_api(self) -> float:
        body = self.body("api")
        elapsed = timed(lambda: self.api.launch(body))
        self.api.remove(body["container"]["name"])
        return elapsed

    def through_sdk(self) -> float:
        """On the network the API's launch gets: the node's job network (`isolated`, the
        default since issue 38: a 0-card job under a plain `serve` is bridged)."""
        return self._sdk("sdk", JOB_NETWORK)

    def through_sdk_on_host(self) -> float:
        """On the host's network (0.3.15's default): what the job network costs."""
        return self._sdk("sdk-host", "host")

    def _sdk(self, method: str, network: str) -> float:
        body = self.body(method)
        # Outside the clock: the daemon builds these in-process.
        options = sdk_options(body) | {"network_mode": network}
        elapsed = timed(lambda: self.sdk.containers.create(**options).start())
        name = body["container"]["name"]
        # The two engine calls the API path makes beyond these: what each costs here.
        inspect = self.sdk.api.inspect_image  # types-docker leaves it without annotations
        self.extra["inspect image"].append(timed(lambda: inspect(IMAGE)))  # type: ignore[no-untyped-call]
        self.extra["inspect container"].append(timed(lambda: self.sdk.api.inspect_container(name)))
        remove_container(self.sdk, name)
        return elapsed


def measure(launcher: Launcher, rounds: int) -> dict[str, list[float]]:
    methods = {
        "api": launcher.through_api,
        "sdk": launcher.through_sdk,
        "sdk, host network": launcher.through_sdk_on_host,
    }
    for method in methods.values():  # warm-up: connections, image cache, the job network
        method()
    times: dict[str, list[float]] = {name: [] for name in methods}
    for index in range(rounds):
        for name in rotated(list(methods), index):
            times[name].append(methods[name]())
        each = ", ".join(f"{name} {ms(times[name][-1])}" for name in methods)
        print(f"round {index + 1}: {each}")
    return times


def report(times: dict[str, list[float]], extra: dict[str, list[float]]) -> None:
    api, sdk = median(times["api"]), median(times["sdk"])
    ratios = [a / s for a, s in zip(times["api"], times["sdk"], strict=True)]
    print(f"\nlaunch through the API: median {ms(api)} (min {ms(min(times['api']))})")
    print(f"create+start through the SDK: median {ms(sdk)} (min {ms(min(times['sdk']))})")
    print(
        f"API / SDK: {api / sdk:.3f} (ratio of medians), {median(ratios):.3f} (median of "
        f"per-round ratios); the API costs {ms(api - sdk)} more"
    )
    print(f"goal: within 10%: {'MET' if api / sdk <= 1.10 else 'MISSED'}")
    calls = ", ".join(f"{call} {ms(median(values))}" for call, values in extra.items())
    print(f"engine calls the API path adds (SDK, median): {calls}")
    host = median(times["sdk, host network"])
    print(
        f"create+start on the host's network (SDK): median {ms(host)}: the node's job "
        f"network adds {ms(sdk - host)} to a start"
    )


def main() -> None:
    import launchkinds  # it imports this module's helpers

    parser = arguments(__doc__.splitlines()[0], containers=0, rounds=20)
    launchkinds.kinds_arguments(parser)
    args = parser.parse_args()
    print(machine())
    if args.kinds:
        launchkinds.run_kinds(
            launchkinds.wanted_kinds(args.kinds), pairs=args.pairs, launches=args.launches
        )
        return
    sdk = engine_client()
    with fleet("launch") as made, Daemon() as daemon:
        api = Api(daemon.url)
        if args.containers:
            api.wait_tracked(made.create(args.containers))
        launcher = Launcher(api, made, sdk)
        with profiled(daemon, args.profile):
            times = measure(launcher, args.rounds)
        report(times, launcher.extra)
        api.close()
    sdk.close()


if __name__ == "__main__":
    main()
