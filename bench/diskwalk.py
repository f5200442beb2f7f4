"""The disk monitor's walk (issue 34): one writable layer of 100,000 files (goal: under
1 s a walk), and its CPU share with 50 such jobs measured every 5 s (goal: under 2 % of
one core). A directory tree stands for the layers: the walk is the node's own code
(`runtime.diskwalk.measure`), on the filesystem the engines keep their layers on here;
``du -s`` walks the same tree in the same run (its peer).

Issue 50, ``--scan``: the descriptor scan that finds deleted files held open
(`runtime.openfiles`), for 50 jobs of 200 processes (goal: under 2 % of one core at the
default period). Real processes (``sleep``), each holding 16 descriptors of files on the
same disk, one of them deleted (shared by the job's processes: counted once); a
directory per job stands for its cgroup (its ``cgroup.procs``); ``lsof +L1`` over the
same processes is the peer.

    .venv/bin/python bench/diskwalk.py [--files 100000] [--dir /var/lib/tuneplane-dev]
    .venv/bin/python bench/diskwalk.py --scan [--jobs 50] [--procs 200]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tuneplane_node.jobs.disk.monitor import FULL_WALK_S
from tuneplane_node.runtime import openfiles
from tuneplane_node.runtime.diskwalk import measure

PERIOD_S = 5.0  # TUNEPLANE_JOB_DISK_CHECK_S's default
FDS = 16  # descriptors each process holds, one of them its job's deleted file

PER_DIR = 1000  # files a directory of the layer holds


def make_layer(root: Path, files: int) -> None:
    """``files`` files of 4 KiB, in directories of `PER_DIR`, as a pip install makes."""
    for n in range(files):
        folder = root / f"d{n // PER_DIR}"
        if n % PER_DIR == 0:
            folder.mkdir()
        with open(folder / f"f{n}", "wb") as file:
            file.write(b"x" * 4096)


def du_seconds(root: Path) -> float:
    """``du -s`` of the same tree, wall seconds (warm)."""
    start = time.perf_counter()
    subprocess.run(["du", "-s", str(root)], capture_output=True, check=True)
    return time.perf_counter() - start


def spawn_job(root: Path, job: int, procs: int) -> list[subprocess.Popen[bytes]]:
    """``procs`` sleeping processes, each holding `FDS` descriptors on ``root``'s disk,
    one of them the job's 1 MiB deleted file; its cgroup.procs written."""
    files = [root / f"job{job}-{i}" for i in range(FDS)]
    for file in files:
        file.write_bytes(b"x" * (2**20 if file == files[0] else 4096))
    fds = [os.open(file, os.O_RDONLY) for file in files]
    files[0].unlink()  # held open by every process of the job: counted once
    try:
        made = [
            subprocess.Popen(["sleep", "3600"], pass_fds=fds, stdin=subprocess.DEVNULL)
            for _ in range(procs)
        ]
    finally:
        for fd in fds:
            os.close(fd)
    cgroup = root / f"cgroup{job}"
    cgroup.mkdir()
    (cgroup / "cgroup.procs").write_text("".join(f"{p.pid}\n" for p in made))
    return made


def scan(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(prefix="tuneplane-bench-scan-", dir=args.dir))
    made: list[subprocess.Popen[bytes]] = []
    try:
        for job in range(args.jobs):
            made += spawn_job(root, job, args.procs)
        device = {os.stat(root).st_dev}
        cgroups = [root / f"cgroup{job}" for job in range(args.jobs)]
        cpus, walls, found = [], [], 0
        for _ in range(args.walks):
            wall, cpu = time.perf_counter(), time.process_time()
            found = 0
            for cgroup in cgroups:
                pids = openfiles.processes(cgroup) or []
                held = openfiles.held_deleted(pids, device, deadline=time.monotonic() + 60)
                found += held.bytes or 0
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        assert found == args.jobs * 2**20, found  # each job's file once
        listed = ",".join(str(p.pid) for p in made)
        start = time.perf_counter()
        argv = ["lsof", "-nP", "-a", "+L1", "-p", listed]  # -a: deleted AND these processes
        peer = subprocess.run(argv, capture_output=True, text=True, check=False)
        lsof_s = time.perf_counter() - start
        per_pass = statistics.median(cpus)
        descriptors = len(made) * (FDS + 3)
        print(f"{args.jobs} jobs x {args.procs} processes, {descriptors} descriptors")
        print(f"scan: median {statistics.median(walls):.3f} s wall, CPU {per_pass:.3f} s a pass")
        print(f"  every pass ({PERIOD_S:g} s): {per_pass / PERIOD_S:.1%} of a core")
        print(f"  as the monitor walks them, the store idle: {per_pass / FULL_WALK_S:.3%}")
        lines = len(peer.stdout.splitlines())
        print(f"peer: lsof -nP -a +L1 -p <all> {lsof_s:.3f} s wall, {lines} lines")
        print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()}, {root}")
    finally:
        for process in made:
            process.kill()
        for process in made:
            process.wait()
        shutil.rmtree(root)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--dir", default=None, help="where to make the layer")
    parser.add_argument("--walks", type=int, default=10)
    parser.add_argument("--scan", action="store_true", help="the descriptor scan instead")
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--procs", type=int, default=200)
    args = parser.parse_args()
    if args.scan:
        scan(args)
        return
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
        du = statistics.median(du_seconds(root) for _ in range(3))
        print(f"peer: du -s {du:.3f} s wall (median of 3)")
        print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()}, {root.parent}")
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
