"""Scratch space with a hard size (issue 34), through the API on docker AND podman: a job
writing past its scratch gets ENOSPC and keeps running, the host's disk grows by at most
the size, and no loop device, mount or file of it outlives its container: after a
remove, and after a daemon's SIGKILL and restart.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from tests.conftest import MakeNode
from tests.engines.test_daemon_enginelock_engines import engine_settings_of, healthy
from tests.engines.test_daemon_mounts import kill_and_remove, post, remove_directly
from tests.support.console import Console
from tests.support.daemons import free_port, spawn_daemon
from tests.support.engines import own_docker_host
from tests.support.loops import NOTHING, SETTLE_S, Left, loops_backing
from tests.support.nodes import state_dir
from tests.support.runtimes import TrackingRuntime
from tests.support.waiting import settled_async
from tuneplane_node.jobs.mounts.scratch import MOUNTS, SUFFIX, ScratchSpaces
from tuneplane_node.jobs.mounts.staging import DIRECTORY
from tuneplane_node.settings import load_settings

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]
MIB = 2**20
SIZE = 50 * MIB
FILL = (
    "dd if=/dev/zero of=/scratch/fill bs=1048576 count=200; echo dd-exit=$?; sync; exec sleep 300"
)


def scratch_dir(tmp_path: Path) -> Path:
    return state_dir(tmp_path) / "scratch"


def left(tmp_path: Path) -> Left:
    """This node's scratch files, its mounts (scratch and staged, this process's
    mountinfo) and the loop devices backed by its files."""
    state = state_dir(tmp_path)
    files = sorted(os.listdir(scratch_dir(tmp_path))) if scratch_dir(tmp_path).exists() else []
    trees = (f" {state / MOUNTS}/", f" {state / DIRECTORY}/")
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if any(tree in line for tree in trees)]  # fmt: skip
    return files, mounts, loops_backing(state)


async def nothing_left(tmp_path: Path, timeout: float = SETTLE_S) -> Left:
    """`left`, once empty (a released device goes at its last close: `settled_async`)."""
    return await settled_async(lambda: left(tmp_path), NOTHING, timeout)


async def logged(node: Console, ref: str, words: str, timeout: float = 120) -> str:
    """The job's log once it holds ``words``."""
    deadline = time.monotonic() + timeout
    while words not in (said := await node.logs(ref)):
        assert time.monotonic() < deadline, said
        await asyncio.sleep(0.5)
    return said


def sweep(tmp_path: Path) -> None:
    """What a failed test left: its containers are gone by now."""
    settings = load_settings(node_token="t" * 16, node_state_dir=state_dir(tmp_path))
    ScratchSpaces(settings).sweep(())


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_job_filling_its_scratch_gets_enospc_keeps_running_and_leaves_nothing(
    make_node: MakeNode, tmp_path: Path, engine: str
) -> None:
    node = await make_node(engine)
    names: list[str] = []
    try:
        ref, _ = await node.launch(
            ["/bin/sh", "-c", FILL], scratch={"path": "/scratch", "size": "50m"}
        )
        names.append(ref)
        files, mounts, loops = left(tmp_path)
        assert len(files) == 1 and files[0].endswith(SUFFIX) and loops, (files, loops)
        assert len(mounts) == 2, mounts  # its own, and its copy staged for the engine
        said = await logged(node, ref, "dd-exit=")
        assert "No space left on device" in said and "dd-exit=1" in said, said
        assert (await node.state(ref))["status"] == "running"
        key = files[0][: -len(SUFFIX)]
        written = (state_dir(tmp_path) / MOUNTS / key / "fill").stat().st_size
        assert 40 * MIB < written <= SIZE, written  # about the size: ext4's own blocks less
        taken = (scratch_dir(tmp_path) / files[0]).stat().st_blocks * 512
        assert written <= taken <= SIZE, taken  # the host's disk: at most the size

        await node.remove(ref)
        assert await nothing_left(tmp_path) == ([], [], [])

        # The engine refuses to start it (a user the image has not): the launch fails.
        scratch = {"path": "/scratch", "size": "50m"}
        _, body = await node.launch(scratch=scratch, user="no-such-user", expect=422)
        assert body["detail"].startswith("container.user"), body
        assert await nothing_left(tmp_path) == ([], [], [])
    finally:
        await remove_directly(engine, names)
        sweep(tmp_path)


@pytest.mark.own_engines
async def test_a_reaped_job_leaves_no_scratch(
    make_node: MakeNode, own_docker: TrackingRuntime, tmp_path: Path
) -> None:
    """On the suite's own engine: a reap takes every exited job of the engine's."""
    node = await make_node(feed=own_docker, docker_host=own_docker_host())
    try:
        reaped, _ = await node.launch(["/bin/true"], scratch={"path": "/s", "size": "8m"})
        assert len(left(tmp_path)[0]) == 1
        await node.wait_for(reaped, "status", "exited")
        assert (await node.ok("POST", "/node/v1/reap", json={"max_age_s": 0}))["removed"] == 1
        assert await nothing_left(tmp_path) == ([], [], [])
    finally:
        sweep(tmp_path)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_daemon_killed_with_scratch_sweeps_it_at_its_restart(
    tmp_path: Path, engine: str
) -> None:
    """SIGKILL with two jobs' scratch mounted; one job's container goes while the daemon is
    dead. The restart keeps the live job's scratch (its label names it) and removes the
    other's: mount, loop device and file; the remove of the last leaves nothing."""
    settings = {**engine_settings_of(engine), "TUNEPLANE_DEV_SHARED_ENGINE": "true"}
    port = free_port()
    daemon = spawn_daemon(tmp_path, port, settings_of=settings)
    run_ids = [f"scratch-{os.getpid()}-{i}-{port}" for i in range(2)]
    names = [f"tuneplane-{run_id}" for run_id in run_ids]
    try:
        healthy(port, daemon, tmp_path / "serve.log")
        for run_id, name in zip(run_ids, names, strict=True):
            container = {
                "name": name,
                "image": "tuneplane-test/busybox:1",
                "command": ["/bin/sleep", "300"],
                "scratch": {"path": "/scratch", "size": "64m"},
            }
            body = {"run_id": run_id, "requested_gpus": 0, "container": container}
            assert post(port, "/node/v1/launch", body)[0] == 200
        assert [len(each) for each in left(tmp_path)] == [2, 4, 2]  # 2 scratch + 2 staged
        await kill_and_remove(daemon, engine, names[:1])
        assert len(left(tmp_path)[2]) == 2  # the kernel's mounts outlive the daemon
        daemon = spawn_daemon(tmp_path, port, settings_of=settings)
        healthy(port, daemon, tmp_path / "serve.log")
        files, mounts, loops = left(tmp_path)
        assert len(files) == 1 and files[0].startswith(names[1] + "."), files
        assert len(mounts) == 2 and len(loops) == 1, (mounts, loops)
        assert post(port, "/node/v1/remove", {"ref": names[1]})[0] == 200
        assert await nothing_left(tmp_path) == ([], [], [])
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
        await remove_directly(engine, names)
        sweep(tmp_path)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_container_removed_behind_the_node_releases_its_scratch_at_once(
    make_node: MakeNode, tmp_path: Path, engine: str
) -> None:
    """Issue 50: its loop device, mounts and file stayed until the node's next start."""
    node = await make_node(engine)
    ref, _ = await node.launch(scratch={"path": "/scratch", "size": "8m"})
    try:
        files, mounts, loops = left(tmp_path)
        assert (len(files), len(mounts), len(loops)) == (1, 2, 1), (files, mounts, loops)

        await remove_directly(engine, [ref])  # the engine's own remove, not the node's
        # The engine's event, then a sweep: well within 10 s.
        gone = await nothing_left(tmp_path, timeout=10)
        assert gone == ([], [], []), f"its scratch outlived its container: {gone}"
        assert (await node.answered_health())["ok"] is True  # the daemon running on
    finally:
        await remove_directly(engine, [ref])
        sweep(tmp_path)
