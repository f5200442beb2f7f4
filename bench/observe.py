"""observe of 1, 10, 100, 300 refs: the daemon's API against asking the engine.

(a) a sweep over raw HTTP on the engine's unix socket: one list of the labelled
containers, then one inspect per asked container, sequential on one kept-alive
connection (what any daemon that asks the engine pays, without SDK overhead);
(b) one ``docker inspect <name>`` process per container (a CLI-wrapping daemon).
Goal at 300 refs: API median under 10 ms, and at least 10x faster than (a).
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import socket
import subprocess
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any

from harness import (
    LABEL_BENCH,
    Api,
    Daemon,
    arguments,
    docker_host,
    fleet,
    machine,
    median,
    ms,
    profiled,
    rotated,
    timed,
)

from tuneplane_node.runtime.base import LABEL_RUN_ID

SIZES = (1, 10, 100, 300)


class EngineSocket(http.client.HTTPConnection):
    """HTTP/1.1 to the engine over its unix socket, kept alive between requests."""

    def __init__(self, path: str) -> None:
        super().__init__("localhost")
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)

    def get_json(self, path: str) -> Any:
        self.request("GET", path)
        answer = self.getresponse()
        body = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"GET {path}: {answer.status} {body[:200]!r}")
        return json.loads(body)


def raw_sweep(engine: EngineSocket, session: str, names: Sequence[str]) -> None:
    """(a): list the labelled containers, then inspect each asked one."""
    filters = json.dumps({"label": [LABEL_RUN_ID, f"{LABEL_BENCH}={session}"]})
    engine.get_json("/v1.41/containers/json?all=1&filters=" + urllib.parse.quote(filters))
    for name in names:
        engine.get_json(f"/v1.41/containers/{name}/json")


def cli_sweep(names: Sequence[str]) -> None:
    """(b): one docker inspect process per container, its JSON read like a wrapper would."""
    env = os.environ | {"DOCKER_HOST": docker_host()}
    for name in names:
        done = subprocess.run(["docker", "inspect", name], env=env, capture_output=True, check=True)
        json.loads(done.stdout)


def methods(api: Api, engine: EngineSocket, session: str) -> dict[str, Callable[..., Any]]:
    return {
        "api": api.observe,
        "floor": lambda names: api.healthz(),
        "raw": lambda names: raw_sweep(engine, session, names),
        "cli": cli_sweep,
    }


def check(api: Api, names: Sequence[str]) -> None:
    states = api.observe(names)
    wrong = [n for n in names if states[n]["status"] != "running"]
    if wrong:
        raise RuntimeError(f"observe does not show {wrong[:3]} running")


def measure(
    calls: dict[str, Callable[..., Any]], names: Sequence[str], *, rounds: int, cli_rounds: int
) -> dict[tuple[str, int], list[float]]:
    sizes = [size for size in SIZES if size <= len(names)]
    times: dict[tuple[str, int], list[float]] = {}
    for size in sizes:  # warm-up: connections open, caches hot
        for call in calls.values():
            call(names[:size])
    for index in range(rounds):
        for size in sizes:
            for method in rotated(list(calls), index):
                if method == "cli" and index >= cli_rounds:
                    continue
                elapsed = timed(functools.partial(calls[method], names[:size]))
                times.setdefault((method, size), []).append(elapsed)
        print(f"round {index + 1}/{rounds} done", flush=True)
    return times


def report(times: dict[tuple[str, int], list[float]]) -> None:
    sizes = sorted({size for _, size in times})
    floor = median([t for (method, _), ts in times.items() if method == "floor" for t in ts])
    print(f"\nHTTP floor (GET /healthz through the same client): {ms(floor)}")
    print("refs | API observe | (a) raw HTTP sweep | (b) docker inspect x N | a/API | b/API")
    for size in sizes:
        api, raw = median(times["api", size]), median(times["raw", size])
        cli = median(times["cli", size])
        print(
            f"{size:4d} | {ms(api)} | {ms(raw)} | {ms(cli)} ({len(times['cli', size])} rounds)"
            f" | {raw / api:.1f}x | {cli / api:.1f}x"
        )
    top = sizes[-1]
    api, raw = median(times["api", top]), median(times["raw", top])
    print(f"goal at {top}: API median < 10 ms: {'MET' if api < 0.010 else 'MISSED'} ({ms(api)})")
    print(f"goal at {top}: >= 10x faster than (a): {'MET' if raw / api >= 10 else 'MISSED'}")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], containers=300, rounds=5)
    parser.add_argument("--cli-rounds", type=int, default=5, help="rounds of (b), the slow one")
    args = parser.parse_args()
    print(machine())
    with fleet("observe") as made, Daemon() as daemon:
        names = made.create(args.containers)
        api = Api(daemon.url)
        api.wait_tracked(names)
        check(api, names)
        engine = EngineSocket(docker_host().removeprefix("unix://"))
        print(f"{len(names)} tracked containers; daemon cache: {api.health()['state_cache']}")
        with profiled(daemon, args.profile):
            times = measure(
                methods(api, engine, made.session),
                names,
                rounds=args.rounds,
                cli_rounds=args.cli_rounds,
            )
        report(times)
        engine.close()
        api.close()


if __name__ == "__main__":
    main()
