"""A job's root and the jobs' parent cgroup, on docker and podman, launched through the
API like any job: what a hostile job tries, and what the host still has after it.

The jobs are busybox shell scripts. Every figure is bounded: the parent's PIDs are
lowered to a few dozen for the fork test (under a parent of the test's own, removed after
it), and a filler writes at most a few MiB more than its tmpfs takes.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import MakeNode, open_runtime
from tests.support.console import Console
from tests.support.jobs import unique
from tests.support.nodes import storage_root
from tuneplane_node.runtime.cgroups import CGROUP_ROOT, pid_max

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]
MIB = 2**20


def value(logs: str, key: str) -> str:
    """``key=value`` from a job's log (each line after its timestamp)."""
    match = re.search(rf"(?:^|\s){re.escape(key)}=(\S*)", logs, re.MULTILINE)
    assert match, f"no {key}= in {logs!r}"
    return match.group(1)


async def logs_once(node: Console, ref: str, marker: str, timeout: float = 60) -> str:
    """The job's log once it holds ``marker``."""
    deadline = time.monotonic() + timeout
    while True:
        logs = await node.logs(ref)
        if marker in logs:
            return logs
        assert time.monotonic() < deadline, f"{ref}: no {marker!r} in {logs!r}"
        await asyncio.sleep(0.2)


async def upper_dir(engine: str, ref: str) -> Path:
    """The job's writable layer on the engine's disk (overlay's upper directory)."""
    runtime = await open_runtime(engine)
    try:
        doc = await runtime.pool.call(runtime._document, ref)
    finally:
        await runtime.close()
    return Path(doc["GraphDriver"]["Data"]["UpperDir"])


def written(layer: Path) -> dict[str, int]:
    """The regular files of a layer that hold data, with their allocated bytes
    (st_blocks, as a disk monitor counts them). What the engine makes at create is
    not: its mount points (docker's /sbin/docker-init) are empty files, its links
    (podman's /etc/mtab) and directories hold nothing."""
    found = {}
    for top, _, names in os.walk(layer):
        for name in names:
            info = Path(top, name).lstat()
            if stat.S_ISREG(info.st_mode) and (info.st_size or info.st_blocks):
                found[str(Path(top, name).relative_to(layer))] = info.st_blocks * 512
    return found


WRITER = "; ".join(
    [
        "echo data 2>/dev/null >/written; echo root=$?",
        "touch /etc/written 2>/dev/null; echo etc=$?",
        # exec from /tmp: a compiler's cache loads what it builds there.
        "cp /bin/busybox /tmp/true && /tmp/true; echo exec=$?; rm -f /tmp/true",
        "dd if=/dev/zero of=/tmp/fill bs=1M count=24 2>/dev/null; echo tmp=$(du -k /tmp/fill)",
        "dd if=/dev/zero of=/run/fill bs=1M count=24 2>/dev/null; echo run=$(du -k /run/fill)",
        "echo done",
        "sleep 300",
    ]
)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_read_only_root_refuses_writes_and_tmp_takes_at_most_its_bound(
    make_node: MakeNode, engine: str
) -> None:
    node = await make_node(engine, job_tmpfs_size="8m")
    ref, _ = await node.launch(["/bin/sh", "-c", WRITER], read_only_root=True)
    logs = await logs_once(node, ref, "done")

    assert (value(logs, "root"), value(logs, "etc")) == ("1", "1")  # EROFS
    assert value(logs, "exec") == "0"
    assert 7 * 1024 <= int(value(logs, "tmp")) <= 8 * 1024  # KiB: 24 MiB asked, 8 held
    assert int(value(logs, "run")) <= 8 * 1024  # at most 64 MiB and at most /tmp's
    assert written(await upper_dir(engine, ref)) == {}  # the writable layer stays empty
    assert (await node.state(ref))["read_only_root"] is True  # observe says it


@pytest.mark.parametrize("engine", ENGINES)
async def test_without_a_read_only_root_the_same_job_writes_its_layer(
    make_node: MakeNode, engine: str
) -> None:
    """The measure above can fail: a writable root takes the write, in the layer."""
    node = await make_node(engine)
    ref, _ = await node.launch(["/bin/sh", "-c", WRITER])
    logs = await logs_once(node, ref, "done")

    assert value(logs, "root") == "0"
    assert "written" in written(await upper_dir(engine, ref))
    assert (await node.state(ref))["read_only_root"] is False


# --- the jobs' parent cgroup --------------------------------------------------------------

PARENT_PIDS = 80
"""The lowered parent: two jobs trying 200 processes each share this many."""
# The bomb in a child shell, which dies at its first failed fork; its sleeps stay (init
# is their parent then), and the job's shell holds on without a fork of its own (exec).
BOMB = (
    "until [ -e /go/go ]; do sleep 0.1; done; "
    "sh -c 'i=0; while [ $i -lt 200 ]; do sleep 300 & i=$((i+1)); done' 2>/dev/null; "
    "echo forked; exec sleep 300"
)


@pytest.fixture
async def parent(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A parent cgroup of the test's own (the node makes it at the first launch),
    removed once the jobs under it are (their fixture is torn down first)."""
    name = unique("tp-test-parent")
    yield name
    for directory in _parent_dirs(name):
        await _remove_tree(directory)


def _parent_dirs(name: str) -> list[Path]:
    return [path for path in CGROUP_ROOT.glob(f"*/{name}")] + [
        path for path in [CGROUP_ROOT / name] if path.is_dir()
    ]


async def _remove_tree(directory: Path, timeout: float = 20) -> None:
    """rmdir, deepest first (podman's conmon/ under it), once its processes are gone."""
    deadline = time.monotonic() + timeout
    while directory.exists():
        tree = sorted((Path(top) for top, _, _ in os.walk(directory)), key=lambda p: -len(p.parts))
        try:
            for path in tree:
                path.rmdir()
        except OSError:
            assert time.monotonic() < deadline, f"{directory} still busy"
            await asyncio.sleep(0.2)


@pytest.mark.parametrize("engine", ENGINES)
async def test_two_jobs_forking_without_end_share_the_parents_pids_and_the_host_keeps_its_own(
    parent: str, make_node: MakeNode, engine: str, tmp_path: Path
) -> None:
    kernel_max = pid_max()
    assert kernel_max is not None
    node = await make_node(
        engine, job_cgroup_parent=parent, system_reserved_pids=kernel_max - PARENT_PIDS
    )
    go = storage_root(tmp_path) / "go"  # a mount comes from under a mount root
    go.mkdir()
    refs = [
        (await node.launch(["/bin/sh", "-c", BOMB], mounts=[[str(go), "/go", True]]))[0]
        for _ in range(2)
    ]
    for ref in refs:
        await node.wait_for(ref, "status", "running")
    runtime = await open_runtime(engine, job_cgroup_parent=parent)
    try:
        report = await runtime.cgroup_parent()
    finally:
        await runtime.close()
    if not report.parent.owned:
        pytest.skip(f"{engine}'s cgroup driver is systemd: the slice is systemd's to bound")
    pids_dir = report.parent.dirs()["pids"]
    assert (pids_dir / "pids.max").read_text().strip() == str(PARENT_PIDS)  # the node's

    (go / "go").touch()
    for ref in refs:
        await logs_once(node, ref, "forked")

    held = int((pids_dir / "pids.current").read_text())
    # 400 asked, each job under its own limit of 16,384: the parent's bound stopped them.
    assert PARENT_PIDS - 5 <= held <= PARENT_PIDS, held
    jobs = [d for d in pids_dir.iterdir() if d.is_dir() and d.name != "conmon"]
    assert len(jobs) == 2
    # Which bomb took the most is the scheduler's to say (one may take all before the
    # other forks once): both are alive, and between them they hold what the parent holds.
    by_job = [int((job_dir / "pids.current").read_text()) for job_dir in jobs]
    assert all(pids >= 2 for pids in by_job), by_job  # each job's init and its sleep
    monitors = [int((d / "pids.current").read_text()) for d in pids_dir.glob("conmon")]
    assert sum(by_job) + sum(monitors) == held, (by_job, monitors, held)  # podman's conmon
    # A fork refused: v1 counts it in the job's cgroup, where it was tried; v2 in the
    # parent, whose bound refused it.
    assert sum(_refused(d) for d in [pids_dir, *jobs]) >= 2
    ps = subprocess.run(["ps", "-e", "-o", "pid="], capture_output=True, text=True, timeout=30)
    assert ps.returncode == 0 and len(ps.stdout.split()) > held  # the host forks still


def _refused(pids_dir: Path) -> int:
    """Forks refused for a pids limit, as the cgroup's pids.events counts them."""
    for line in (pids_dir / "pids.events").read_text().splitlines():
        key, _, number = line.partition(" ")
        if key == "max":
            return int(number)
    return 0


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_parent_gone_is_made_and_bounded_again_at_the_next_launch(
    parent: str, make_node: MakeNode, engine: str
) -> None:
    """As after a reboot, or an operator's rmdir: the node's figures come back."""
    node = await make_node(engine, job_cgroup_parent=parent, system_reserved_pids=1000)
    first, _ = await node.launch()
    await node.wait_for(first, "status", "running")
    await node.remove(first)
    for directory in _parent_dirs(parent):
        await _remove_tree(directory)

    second, _ = await node.launch()
    await node.wait_for(second, "status", "running")
    (pids_dir,) = [d for d in _parent_dirs(parent) if (d / "pids.max").exists()]
    assert (pids_dir / "pids.max").read_text().strip() == str((pid_max() or 0) - 1000)
