"""The disk monitor's walk (issue 34): one writable layer of 100,000 files (goal: under
1 s a walk), and its CPU share with 50 such jobs measured every 5 s (goal: under 2 % of
one core). A directory tree stands for the layers: the walk is the node's own code
(`runtime.diskwalk.measure`), on the filesystem the engines keep their layers on here.

    .venv/bin/python bench/diskwalk.py [--files 100000] [--dir /var/lib/tuneplane-dev]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tuneplane_node.jobs.disk.monitor import FULL_WALK_S
from tuneplane_node.runtime.diskwalk import measure

PER_DIR = 1000  # files a directory of the layer holds


def make_layer(root: Path, files: int) -> None:
    """``files`` files of 4 KiB, in directories of `PER_DIR`, as a pip install makes."""
    for n in range(files):
        folder = root / f"d{n // PER_DIR}"
        if n % PER_DIR == 0:
            folder.mkdir()
        with open(folder / f"f{n}", "wb") as file:
            file.write(b"x" * 4096)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--dir", default=None, help="where to make the layer")
    parser.add_argument("--walks", type=int, default=10)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tuneplane-bench-walk-", dir=args.dir))
    try:
        make_layer(root, args.files)
        measure([str(root)], budget_s=60)  # warm, as every walk after the first is
        walls, cpus = [], []
        for _ in range(args.walks):
            wall, cpu = time.perf_counter(), time.process_time()
            use = measure([str(root)], budget_s=60)
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        assert use.complete and use.used_bytes
        per_walk = statistics.median(cpus)
        every_pass = 50 * per_walk / 5.0  # 50 jobs, one walk each every 5 s
        idle = 50 * per_walk / FULL_WALK_S  # the store idle: the floor's walk only
        print(f"{args.files} files, {use.used_bytes} bytes counted, {args.walks} walks")
        print(f"walk: median {statistics.median(walls):.3f} s, max {max(walls):.3f} s wall")
        print(f"CPU per walk {per_walk:.4f} s; 50 such jobs:")
        print(f"  walked every 5 s: {every_pass:.1%} of a core")
        floor = f"every {FULL_WALK_S / 60:.0f} min"
        print(f"  as the monitor walks them, the store idle ({floor}): {idle:.2%}")
        print(f"machine: {os.cpu_count()} CPUs, {root.parent}")
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
