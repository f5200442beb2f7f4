"""handler (issue 40): health's route handler alone, this checkout's against a peer's.

Each side's daemon is built in a process of its own (``PYTHONPATH`` names whose
`tuneplane_node` runs) on the development engine, started as `serve` starts it (the
engine's state cache synced, the node's background tasks running) but with no socket:
the route's handler for ``GET /node/v1/health`` is called directly, with a mocked
request, so the figures are the handler's own CPU (the node's status, the answer and its
encoding), without aiohttp's, the middlewares' or a client's, which bursts over HTTP
(`load.py`) measure with them and with their noise. Per side: the loop thread's CPU
clock over ``--calls`` calls one at a time (each timed alone, a turn of the loop between
two, as requests that come one at a time are read in turns of their own), and over the
same number in gathers of 200 (as a burst's requests wait on the loop together), each
gather timed alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import (
    TOKEN,
    alternate,
    docker_host,
    fleet,
    machine,
    peer_arguments,
    peer_checkout,
)

CHILD = """
import asyncio, json, sys, time
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from tuneplane_node.daemon.app import create_node_app
from tuneplane_node.settings import NodeSettings

async def main(calls):
    app = create_node_app(NodeSettings(), sweep=False)
    runner = web.AppRunner(app)
    await runner.setup()  # the app's start-up: the engine's cache synced, the node built
    try:
        handler = next(
            route.handler for route in app.router.routes()
            if route.method == "GET" and route.resource.canonical == "/node/v1/health"
        )
        request = make_mocked_request("GET", "/node/v1/health", app=app)
        size = len((await handler(request)).body)
        for _ in range(500):
            await handler(request)
        alone = 0.0
        for _ in range(calls):
            await asyncio.sleep(0)  # a turn of the loop between them, as requests come
            started = time.thread_time()
            await handler(request)
            alone += time.thread_time() - started
        alone /= calls
        gathered = 0.0
        for _ in range(calls // 200):
            await asyncio.sleep(0.02)
            started = time.thread_time()
            await asyncio.gather(*(handler(request) for _ in range(200)))
            gathered += time.thread_time() - started
        gathered /= calls // 200 * 200
        print(json.dumps({"alone": alone, "gathered": gathered, "size": size}))
    finally:
        await runner.cleanup()

asyncio.run(main(int(sys.argv[1])))
"""


def measure(checkout: Path, calls: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="tuneplane-bench-handler-") as state:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEPLANE_")}
        env |= {
            "PYTHONPATH": str(checkout),
            "TUNEPLANE_NODE_TOKEN": TOKEN,
            "TUNEPLANE_LOCAL_RUNTIME": "docker",
            "TUNEPLANE_DOCKER_HOST": docker_host(),
            "TUNEPLANE_LOCAL_GPU_COUNT": "0",
            "TUNEPLANE_NODE_STATE_DIR": str(Path(state) / "state"),
            "TUNEPLANE_DEV_SHARED_ENGINE": "true",  # the development engine is everyone's
        }
        done = subprocess.run(  # not from a checkout: its own tuneplane_node would win
            [sys.executable, "-c", CHILD, str(calls)],
            cwd=state, env=env, capture_output=True, text=True, check=False, timeout=600,
        )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the handler's process failed:\n{done.stderr[-3000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"health handler: one at a time {found['alone'] * 1e6:.1f} us, in gathers of 200 "
        f"{found['gathered'] * 1e6:.1f} us; answer {found['size']} bytes"
    )
    return {"one at a time (us)": found["alone"], "in gathers of 200 (us)": found["gathered"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--containers", type=int, default=300, help="tracked containers")
    parser.add_argument("--calls", type=int, default=10_000, help="calls each way, per run")
    peer_arguments(parser)
    args = parser.parse_args()
    peer = peer_checkout(args.peer)
    if peer is None:
        raise SystemExit("--peer CHECKOUT: the checkout to compare with")
    print(machine())
    with fleet("handler") as made:
        made.create(args.containers)
        alternate(
            peer, args.pairs, lambda checkout: measure(checkout, args.calls), warmup=args.warmup
        )


if __name__ == "__main__":
    main()
