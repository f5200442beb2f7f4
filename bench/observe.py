"""observe of 1, 10, 100, 300 refs: the daemon's API against asking the engine.

(a) a sweep over raw HTTP on the engine's unix socket: one list of the labelled
containers, then one inspect per asked container, sequential on one kept-alive
connection (what any daemon that asks the engine pays, without SDK overhead);
(b) one ``docker inspect <name>`` process per container (a CLI-wrapping daemon).
The API is asked two ways: through ``requests`` (what the bench's other scripts use,
with the stdlib's JSON decoder: about 1 ms of the client's own per 300 states) and
through a lean client (``http.client`` on one kept-alive TCP connection, orjson), which
shows what the node itself adds. The daemon's CPU per observe of 300 is printed too:
of the same refs back to back (an answer kept whole while nothing changes), and with
their order turned on each call, so every answer is made anew (a node where something
changed between two polls).
Goals at 300 refs: the lean API median under 2 ms and at least 50x faster than (a)
(issue 14; issue 5's were 10 ms and 10x).
"""

from __future__ import annotations

import argparse
import functools
import http.client
import itertools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
from harness import (
    HEADERS,
    LABEL_BENCH,
    REPO,
    Api,
    Daemon,
    Fleet,
    arguments,
    code_version,
    cpu_seconds,
    docker_host,
    fleet,
    free_port,
    machine,
    median,
    ms,
    peer_arguments,
    peer_checkout,
    pin,
    profiled,
    rotated,
    settle,
    this_or_alternated,
    timed,
)

from tuneplane_node.wire.values import LABEL_RUN_ID

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


class LeanApi(http.client.HTTPConnection):
    """observe over one kept-alive TCP connection: no requests, orjson both ways."""

    def __init__(self, url: str) -> None:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        super().__init__(host, int(port))
        self.headers = HEADERS | {"Content-Type": "application/json"}

    def observe(self, refs: Sequence[str]) -> dict[str, Any]:
        body = orjson.dumps({"refs": refs})
        return self.ask("POST", "/node/v1/observe", body)["states"]  # type: ignore[no-any-return]

    def healthz(self) -> Any:
        return self.ask("GET", "/healthz")

    def ask(self, method: str, path: str, body: bytes | None = None) -> Any:
        self.request(method, path, body, self.headers)
        answer = self.getresponse()
        data = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{method} {path}: {answer.status} {data[:200]!r}")
        return orjson.loads(data)


def methods(
    api: Api, lean: LeanApi, engine: EngineSocket, session: str
) -> dict[str, Callable[..., Any]]:
    return {
        "api": api.observe,
        "lean": lean.observe,
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
    print(
        "refs | API observe (requests) | API observe (lean) | (a) raw HTTP sweep "
        "| (b) docker inspect x N | a/lean | b/lean"
    )
    for size in sizes:
        api, lean = median(times["api", size]), median(times["lean", size])
        raw, clis = median(times["raw", size]), times.get(("cli", size), [])
        cli = median(clis) if clis else float("nan")  # left out (--peer): nan
        print(
            f"{size:4d} | {ms(api)} | {ms(lean)} (spread {spread(times['lean', size])}) "
            f"| {ms(raw)} | {ms(cli)} ({len(clis)} rounds)"
            f" | {raw / lean:.1f}x | {cli / lean:.1f}x"
        )
    top = sizes[-1]
    lean, raw = median(times["lean", top]), median(times["raw", top])
    print(f"goal at {top}: lean median < 2 ms: {'MET' if lean < 0.002 else 'MISSED'} ({ms(lean)})")
    print(f"goal at {top}: >= 50x faster than (a): {'MET' if raw / lean >= 50 else 'MISSED'}")


def spread(values: Sequence[float]) -> str:
    return f"{ms(min(values))} to {ms(max(values))}"


BARE_APP = """
import sys
from aiohttp import web
async def ok(request):
    return web.Response(body=b'{"ok":true}', content_type="application/json")
app = web.Application()
app.router.add_get("/healthz", ok)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def daemon_cpu(
    daemon: Daemon, lean: LeanApi, names: Sequence[str], calls: int = 1000
) -> dict[str, float]:
    """The daemon's own CPU per request (its /proc figures), apart from any client: the
    bare HTTP floor (/healthz), health, and observe of every name, back to back; and the
    peer: an aiohttp app of one handler and no middleware answering the same way."""
    turns = itertools.count()

    def anew() -> Any:  # another order each call: an answer kept whole is never the next's
        turn = next(turns) % len(names)
        return lean.observe([*names[turn:], *names[:turn]])

    asks = {
        "GET /healthz": lean.healthz,
        "GET /node/v1/health": lambda: lean.ask("GET", "/node/v1/health"),
        f"observe of {len(names)} refs": lambda: lean.observe(names),
        f"observe of {len(names)} refs, each answer made anew": anew,
    }
    figures = {what: cpu_per_call(what, daemon.pid, ask, calls) for what, ask in asks.items()}
    port = free_port()
    bare = subprocess.Popen([sys.executable, "-c", BARE_APP, str(port)])
    try:
        peer = LeanApi(f"http://127.0.0.1:{port}")
        wait_listening(peer)
        cpu_per_call("bare aiohttp, GET /healthz (the peer)", bare.pid, peer.healthz, calls)
        peer.close()
    finally:
        bare.terminate()
        bare.wait()
    return figures


def cpu_per_call(what: str, pid: int, ask: Callable[[], Any], calls: int) -> float:
    for _ in range(20):  # warm
        ask()
    before, started = cpu_seconds(pid), time.monotonic()
    for _ in range(calls):
        ask()
    cpu, wall = cpu_seconds(pid) - before, time.monotonic() - started
    print(
        f"CPU per request, {what}: {ms(cpu / calls)} "
        f"({calls} back to back, {ms(wall / calls)} each end to end)"
    )
    return cpu / calls


def wait_listening(peer: LeanApi) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            peer.healthz()
            return
        except OSError:
            peer.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def measured_daemon(
    args: argparse.Namespace, made: Fleet, names: Sequence[str], *, checkout: Path = REPO
) -> dict[str, float]:
    """One daemon of ``checkout`` over the fleet: the table, the CPU lines; their summary
    (with a peer the CLI sweep is left out: it measures the engine, not the daemon)."""
    with Daemon(checkout=checkout) as daemon:
        api = Api(daemon.url)
        api.wait_tracked(names)
        settle(daemon.pid)
        if args.pin:
            pin(daemon.pid)
        check(api, names)
        engine = EngineSocket(docker_host().removeprefix("unix://"))
        lean = LeanApi(daemon.url)
        print(f"daemon {code_version(checkout)}; cache: {api.health()['state_cache']}")
        calls = methods(api, lean, engine, made.session)
        if args.peer is not None:
            del calls["cli"]
        with profiled(daemon, args.profile):
            times = measure(calls, names, rounds=args.rounds, cli_rounds=args.cli_rounds)
            report(times)
            cpu = daemon_cpu(daemon, lean, names)
        lean.close()
        engine.close()
        api.close()
    top, observed = max(size for _, size in times), f"observe of {len(names)} refs"
    raw, fast = median(times["raw", top]), median(times["lean", top])
    return {
        f"lean observe({top})": fast,
        f"raw sweep / lean observe({top}) (x)": raw / fast,
        "cpu health": cpu["GET /node/v1/health"],
        f"cpu observe({top})": cpu[observed],
        f"cpu observe({top}) made anew": cpu[f"{observed}, each answer made anew"],
    }


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], containers=300, rounds=5)
    parser.add_argument("--cli-rounds", type=int, default=5, help="rounds of (b), the slow one")
    parser.add_argument(
        "--pin", action="store_true", help="the daemon on the last CPU, the bench on the others"
    )
    peer_arguments(parser)
    args = parser.parse_args()
    peer = peer_checkout(args.peer)
    print(machine())
    with fleet("observe") as made:
        names = made.create(args.containers)
        measure = functools.partial(measured_daemon, args, made, names)
        this_or_alternated(peer, args, lambda checkout: measure(checkout=checkout))


if __name__ == "__main__":
    main()
