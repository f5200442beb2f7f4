"""Runs the daemon with an event-loop lag meter inside, the daemon's code untouched.

``python3 bench/lagmeter.py OUT.json -m tuneplane_node serve ...`` (as ``python -m
cProfile -m ...`` wraps a module): the app gets one more cleanup context, a timer task
that sleeps 1 ms at a time and records by how much each wake-up came late. At shutdown
every lag over 1 ms goes to OUT.json as [monotonic time, lag s] pairs (CLOCK_MONOTONIC
is system-wide, so the bench can line them up with its bursts), with the tick count.
"""

from __future__ import annotations

import asyncio
import json
import runpy
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

Lifecycle = Callable[[web.Application], AsyncIterator[None]]
TICK_S = 0.001
RECORD_OVER_S = 0.001


async def measure(lags: list[tuple[float, float]], ticks: list[int]) -> None:
    loop = asyncio.get_running_loop()
    while True:
        before = loop.time()
        await asyncio.sleep(TICK_S)
        lag = loop.time() - before - TICK_S
        ticks[0] += 1
        if lag > RECORD_OVER_S:
            lags.append((time.monotonic(), lag))


def meter(out: Path) -> Lifecycle:
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        lags: list[tuple[float, float]] = []
        ticks = [0]
        task = asyncio.create_task(measure(lags, ticks), name="bench loop-lag meter")
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        out.write_text(json.dumps({"ticks": ticks[0], "lags": lags}))

    return lifecycle


def install(lifecycle: Lifecycle) -> None:
    """Give the daemon's app one more cleanup context (the daemon's code untouched)."""
    import tuneplane_node.daemon.app as daemon_app

    original = daemon_app.create_node_app

    def create_node_app(*args: Any, **kwargs: Any) -> web.Application:
        app = original(*args, **kwargs)
        app.cleanup_ctx.append(lifecycle)
        return app

    daemon_app.create_node_app = create_node_app  # cli.serve imports it when called


def wrap(usage: str, lifecycle_of: Callable[[Path], Lifecycle]) -> None:
    """``SCRIPT OUT -m MODULE ARGS...``: the module run with ``lifecycle_of(OUT)`` added."""
    out, flag, module, *rest = sys.argv[1:]
    if flag != "-m":
        raise SystemExit(f"usage: {usage} -m MODULE ARGS...")
    install(lifecycle_of(Path(out)))
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main() -> None:
    wrap("lagmeter.py OUT.json", meter)


if __name__ == "__main__":
    main()
