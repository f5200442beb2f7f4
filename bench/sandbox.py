"""sandbox (issue 37): what gVisor (runsc) costs a job's launch and stop, against runc.

One daemon on a Docker engine of the bench's own, started like the tests' throwaway
engines (it reads /etc/docker/daemon.json, where `engines.sh` registers runsc with
``--network=host --platform=ptrace``), the test image loaded into it. Alternating within
each round: a launch through the API of a sleeping job under runc and one asking
``container.isolation: "sandbox"``; launch-to-running (the launch's answer, then observe
until ``running``) and the stop (``POST /node/v1/stop``, SIGTERM through the engine's init,
until it answers) each timed; removal untimed. Root: it starts dockerd.
"""

from __future__ import annotations

import os
import time
from typing import Any

from harness import Api, Daemon, arguments, machine, median, ms, rotated, timed
from launch import launch_body

from tests.support.throwaway import ThrowawayDocker

METHODS = ("runc", "runsc")


def running(api: Api, name: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while api.observe([name])[name].get("status") != "running":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} never ran")
        time.sleep(0.01)


class Rounds:
    def __init__(self, api: Api, session: str) -> None:
        self.api, self.session, self.count = api, session, 0

    def run(self, method: str) -> tuple[float, float]:
        self.count += 1
        name = f"tuneplane-bench-sandbox-{self.session}-{self.count:04d}"
        body: dict[str, Any] = launch_body(name, self.session)
        if method == "runsc":
            body["container"]["isolation"] = "sandbox"
        try:

            def launch() -> None:
                self.api.launch(body)
                running(self.api, name)

            launched = timed(launch)
            answer = self.api.observe([name])[name]
            assert answer["runtime"] == method, answer
            stop: dict[str, Any] = {"ref": name, "timeout": 10}  # requests' JSON type
            stopped = timed(
                lambda: self.api.session.post(
                    self.api.url + "/node/v1/stop", json=stop
                ).raise_for_status()
            )
        finally:
            self.api.remove(name)
        return launched, stopped


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], containers=0, rounds=10)
    args = parser.parse_args()
    print(machine())
    engine = ThrowawayDocker("throwaway-bench-sandbox")
    engine.start()
    try:
        engine.load_test_image()
        os.environ["TUNEPLANE_BENCH_DOCKER_HOST"] = engine.host
        with Daemon() as daemon:
            api = Api(daemon.url)
            rounds = Rounds(api, str(os.getpid()))
            for method in METHODS:  # warm-up: connections, the runtime's first start
                rounds.run(method)
            launches: dict[str, list[float]] = {method: [] for method in METHODS}
            stops: dict[str, list[float]] = {method: [] for method in METHODS}
            for index in range(args.rounds):
                for method in rotated(list(METHODS), index):
                    launched, stopped = rounds.run(method)
                    launches[method].append(launched)
                    stops[method].append(stopped)
            api.close()
    finally:
        engine.close()
    for method in METHODS:
        print(
            f"{method:>5}: launch-to-running median {ms(median(launches[method]))} (max "
            f"{ms(max(launches[method]))}), stop median {ms(median(stops[method]))} (max "
            f"{ms(max(stops[method]))})"
        )
    for figures, what in ((launches, "launch-to-running"), (stops, "stop")):
        ratio = median(figures["runsc"]) / median(figures["runc"])
        print(f"runsc/runc, {what}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
