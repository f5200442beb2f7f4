"""Runs the daemon with cProfile on its event loop's thread, the daemon's code untouched.

``python3 bench/loopprofile.py OUT.prof -m tuneplane_node serve ...`` (as ``lagmeter.py``
wraps it): the app gets one more cleanup context that turns the profiler on once the app
is set up (start-up is not measured) and writes its statistics to OUT.prof at shutdown.
cProfile sees only the thread it runs in, the loop's: the engine calls in worker threads
are left out, which is the point (the loop is what a burst waits for). Read the file
with ``python3 bench/loopprofile.py --top OUT.prof [N]``. A profiled daemon is slower:
quote no latency of a profiled run.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web
from lagmeter import Lifecycle, wrap


def profiling(out: Path) -> Lifecycle:
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        profiler = cProfile.Profile()
        profiler.enable()
        yield
        profiler.disable()
        profiler.dump_stats(str(out))

    return lifecycle


def top(path: Path, count: int = 25) -> str:
    """The profile's top entries by own time, then by cumulative time of the node's code."""
    text = io.StringIO()
    stats = pstats.Stats(str(path), stream=text)
    stats.sort_stats("tottime").print_stats(count)
    stats.sort_stats("cumulative").print_stats("tuneplane_node", count)
    return text.getvalue()


def main() -> None:
    if sys.argv[1:2] == ["--top"]:
        print(top(Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 25))
        return
    wrap("loopprofile.py OUT.prof", profiling)


if __name__ == "__main__":
    main()
