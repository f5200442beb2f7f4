"""Runs the daemon with the state cache filled by $BENCH_FILL_THREADS inspects at once,
the daemon's code otherwise untouched: ``python3 bench/fillthreads.py -m tuneplane_node
serve ...`` (1: the one-at-a-time fill of the code before issue 14)."""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tuneplane_node.runtime.cache import events as cache

cache.FILL_THREADS = int(os.environ.get("BENCH_FILL_THREADS", "1"))
if sys.argv[1:2] != ["-m"] or len(sys.argv) < 3:
    sys.exit("usage: fillthreads.py -m MODULE [ARGS...]")
module = sys.argv[2]
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
