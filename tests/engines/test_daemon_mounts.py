"""Mounts a job cannot redirect (issue 33), through the API on docker AND podman: the
swap race a hostile tenant runs, the staging tree left clean after every way a job ends,
and the engine's own directories never mounted.
"""

from __future__ import annotations

import collections
import ctypes
import json
import os
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeNode, open_runtime
from tests.engines.test_daemon_enginelock_engines import engine_settings_of, healthy
from tests.support.console import HEADERS, Console
from tests.support.daemons import free_port, spawn_daemon
from tests.support.engines import own_docker_host
from tests.support.images import IMAGE, forget_image
from tests.support.jobs import unique
from tests.support.nodes import state_dir, storage_root
from tests.support.proxies import ThrottlingProxy
from tests.support.runtimes import TrackingRuntime
from tests.unit.test_jobs_mounts import swap
from tuneplane_node.errors import ConfigError
from tuneplane_node.jobs.mounts.staging import DIRECTORY, MountStaging

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]
LAUNCHES = 200  # the bar: about 25 s an engine on two cores
READ_AND_WRITE = "cat /ckpt/owner; touch /ckpt/written-by-a-job"


def staged(tmp_path: Path) -> tuple[list[str], list[str]]:
    """What is left of the staging tree: its mounts (this process's mountinfo) and entries."""
    tree = state_dir(tmp_path) / DIRECTORY
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if f" {tree}/" in line]  # fmt: skip
    return mounts, sorted(os.listdir(tree)) if tree.exists() else []


def tenants(tmp_path: Path) -> tuple[Path, Path]:
    """Two tenants' checkpoint directories in the node's storage root, each saying whose."""
    storage = storage_root(tmp_path)
    mine, theirs = storage / "A" / "ckpt", storage / "B" / "ckpt"
    for owner, directory in (("A", mine), ("B", theirs)):
        directory.mkdir(parents=True)
        (directory / "owner").write_text(owner + "\n")
    return mine, theirs


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_job_swapping_its_directory_never_gets_another_tenants(
    make_node: MakeNode, tmp_path: Path, engine: str
) -> None:
    """Tenant A's running job swaps ``A/ckpt`` with a link to ``B/ckpt`` in a tight loop
    (renameat2 RENAME_EXCHANGE, here on the host side); A's next jobs mount ``A/ckpt``:
    each is refused in words (422) or reads and writes A's own directory."""
    node = await make_node(engine)
    mine, theirs = tenants(tmp_path)
    (mine.parent / "swap").symlink_to(theirs)
    stop = threading.Event()
    swapper = threading.Thread(target=swap, args=(mine, mine.parent / "swap", stop))
    answers: collections.Counter[int] = collections.Counter()
    started = []
    swapper.start()
    try:
        for _ in range(LAUNCHES):
            body = launch(mine)
            status, answer = await node.call("POST", "/node/v1/launch", json=body)
            answers[status] += 1
            assert status in (200, 422), (status, answer)
            if status == 200:
                started.append(body["container"]["name"])  # type: ignore[index]
                (node.made or []).append(started[-1])
    finally:
        stop.set()
        swapper.join()
    seen = collections.Counter([await owner_seen(node, ref) for ref in started])
    assert seen["B"] == 0 and seen["A"] > 0, (seen, answers)
    assert list(theirs.iterdir()) == [theirs / "owner"], "a job wrote into tenant B's directory"
    assert not [status for status in answers if status >= 500], answers
    print(f"{engine}: {LAUNCHES} launches, answers {dict(answers)}, jobs saw {dict(seen)}")


def launch(host: Path) -> dict[str, object]:
    run_id = unique("swap")
    return {
        "run_id": run_id,
        "requested_gpus": 0,
        "container": {
            "name": f"tuneplane-{run_id}",
            "image": IMAGE,
            "command": ["/bin/sh", "-c", READ_AND_WRITE],
            "mounts": [[str(host), "/ckpt", False]],
        },
    }


async def owner_seen(node: Console, ref: str) -> str:
    """Whose ``owner`` file the job read: A or B (or nothing, said as "empty")."""
    await node.wait_for(ref, "status", "exited", timeout=120)
    words = (await node.logs(ref)).split()
    return words[-1] if words else "empty"


@pytest.mark.parametrize("engine", ENGINES)
async def test_nothing_is_left_staged_after_remove_failure_and_restart(
    make_node: MakeNode, tmp_path: Path, engine: str
) -> None:
    mine, _ = tenants(tmp_path)
    node = await make_node(engine)
    mount = [[str(mine), "/ckpt", True]]
    removed, _ = await node.launch(["/bin/sleep", "300"], mounts=mount)
    assert len(staged(tmp_path)[0]) == 1  # one staged mount, read-only
    assert all(" ro," in line or " ro " in line for line in staged(tmp_path)[0])

    await node.remove(removed)
    # The engine refuses to start it (a user the image has not): the launch fails.
    _, body = await node.launch(mounts=mount, user="no-such-user", expect=422)
    assert body["detail"].startswith("container.user"), body
    assert staged(tmp_path) == ([], [])

    # A second daemon on the same state dir, a job's container gone meanwhile: its start
    # sweeps that job's staging (a real SIGKILL: test_a_daemon_killed_...).
    gone, _ = await node.launch(["/bin/sleep", "300"], mounts=mount)
    kept, _ = await node.launch(["/bin/sleep", "300"], mounts=mount)
    await remove_directly(engine, [gone])
    restarted = await make_node(engine)
    mounts, keys = staged(tmp_path)
    assert len(mounts) == 1 and len(keys) == 1 and keys[0].startswith(kept), (mounts, keys)
    await restarted.remove(kept)
    assert staged(tmp_path) == ([], [])


@pytest.mark.own_engines
async def test_a_reaped_job_leaves_nothing_staged(
    make_node: MakeNode, own_docker: TrackingRuntime, tmp_path: Path
) -> None:
    """On the suite's own engine: a reap takes every exited job of the engine's."""
    mine, _ = tenants(tmp_path)
    node = await make_node(feed=own_docker, docker_host=own_docker_host())
    reaped, _ = await node.launch(["/bin/true"], mounts=[[str(mine), "/ckpt", True]])
    assert len(staged(tmp_path)[0]) == 1
    await node.wait_for(reaped, "status", "exited")
    assert (await node.ok("POST", "/node/v1/reap", json={"max_age_s": 0}))["removed"] == 1
    assert staged(tmp_path) == ([], [])


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_root_holding_the_engines_data_root_refuses_the_start(
    make_node: MakeNode, tmp_path: Path, engine: str
) -> None:
    runtime = await open_runtime(engine)
    try:
        (data_root, *_) = (await runtime.mount_support()).engine_dirs
    finally:
        await runtime.close()
    root = Path(data_root)  # the root is the data root (its parent may be a system path)
    with pytest.raises(ConfigError) as refused:
        await make_node(engine, allowed_mount_roots=[root])
    (line,) = refused.value.message.splitlines()
    assert line.startswith(f"TUNEPLANE_ALLOWED_MOUNT_ROOTS: {root} is or holds {data_root}"), line


async def test_a_pending_launch_opens_its_mounts_after_its_pull(
    make_node: MakeNode, docker_runtime: TrackingRuntime, proxy: ThrottlingProxy, tmp_path: Path
) -> None:
    """The walk at create, after a 3 s pull: a directory swapped for a link during the
    pull fails the launch in words; left alone, the job reads its own tenant's file from
    the staged mount, and its removal takes the staging."""
    mine, theirs = tenants(tmp_path)
    node = await make_node(feed=docker_runtime)
    mount = [[str(mine), "/ckpt", False]]
    image = await proxy.big_image(docker_runtime, rate=3_000_000)
    command = ["/bin/sh", "-c", READ_AND_WRITE]
    swapped, answer = await node.launch(command, image=image, mounts=mount)
    assert answer["phase"] == "pulling"
    mine.rename(mine.with_name("kept"))
    mine.symlink_to(theirs)
    state = await node.failed(swapped)
    assert f"{mine} is not its own real path: ckpt is a symlink" in state["pending_error"]
    assert staged(tmp_path) == ([], [])
    mine.unlink()
    mine.with_name("kept").rename(mine)

    await forget_image(docker_runtime, image)
    ref, answer = await node.launch(command, image=image, mounts=mount)
    assert answer["phase"] == "pulling"
    assert await owner_seen(node, ref) == "A"
    assert len(staged(tmp_path)[0]) == 1
    await node.remove(ref)
    assert staged(tmp_path) == ([], [])
    assert list(theirs.iterdir()) == [theirs / "owner"]
    await forget_image(docker_runtime, image)


CAP_SYS_ADMIN, PR_CAPBSET_DROP = 21, 24


def without_sys_admin() -> None:
    """In the daemon's child before its exec: root without CAP_SYS_ADMIN, as a node in a
    sandbox that forgot it (the unit before issue 33, the image's default run)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_CAPBSET_DROP, CAP_SYS_ADMIN, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_node_that_cannot_mount_refuses_host_mounts_and_says_why(
    tmp_path: Path, engine: str
) -> None:
    """Fail closed: never the path as given. The start says it once; each launch with
    host mounts is a 422 naming the mount and the missing privilege; others run."""
    mine, _ = tenants(tmp_path)
    port = free_port()
    settings = {**engine_settings_of(engine), "TUNEPLANE_DEV_SHARED_ENGINE": "true"}
    daemon = spawn_daemon(tmp_path, port, preexec=without_sys_admin, settings_of=settings)
    made = []
    try:
        healthy(port, daemon, tmp_path / "serve.log")
        assert "launches with host mounts will be refused" in (tmp_path / "serve.log").read_text()
        body = launch(mine)
        status, answer = post(port, "/node/v1/launch", body)
        assert status == 422, answer
        assert answer["detail"].startswith("container.mounts[0]: the node cannot make mounts")
        assert "CAP_SYS_ADMIN" in answer["detail"]
        body["container"]["mounts"] = []  # type: ignore[index]
        made.append(body["container"]["name"])  # type: ignore[index]
        assert post(port, "/node/v1/launch", body)[0] == 200
    finally:
        for name in made:
            post(port, "/node/v1/remove", {"ref": name})
        daemon.terminate()
        daemon.wait(timeout=60)
    assert staged(tmp_path) == ([], [])


def post(port: int, path: str, body: object) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(), HEADERS, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_daemon_killed_with_mounts_staged_sweeps_them_at_its_restart(
    tmp_path: Path, engine: str
) -> None:
    """SIGKILL with two jobs' mounts staged; one job's container goes while the daemon is
    dead. The restart keeps the live job's staging (its label names it) and removes the
    other's, mounts and directories."""
    mine, _ = tenants(tmp_path)
    settings = {**engine_settings_of(engine), "TUNEPLANE_DEV_SHARED_ENGINE": "true"}
    port = free_port()
    daemon = spawn_daemon(tmp_path, port, settings_of=settings)
    gone, kept = launch(mine), launch(mine)
    names = [body["container"]["name"] for body in (gone, kept)]  # type: ignore[index]
    try:
        healthy(port, daemon, tmp_path / "serve.log")
        for body in (gone, kept):
            body["container"]["command"] = ["/bin/sleep", "300"]  # type: ignore[index]
            assert post(port, "/node/v1/launch", body)[0] == 200
        assert len(staged(tmp_path)[0]) == 2
        await kill_and_remove(daemon, engine, names[:1])
        assert len(staged(tmp_path)[0]) == 2  # the kernel's mounts outlive the daemon
        daemon = spawn_daemon(tmp_path, port, settings_of=settings)
        healthy(port, daemon, tmp_path / "serve.log")
        mounts, keys = staged(tmp_path)
        assert len(mounts) == 1 and len(keys) == 1 and keys[0].startswith(names[1] + ".")
        assert post(port, "/node/v1/remove", {"ref": names[1]})[0] == 200
        assert staged(tmp_path) == ([], [])
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
        await remove_directly(engine, names)
        MountStaging(state_dir(tmp_path)).sweep(())  # what a failure left


async def kill_and_remove(daemon: subprocess.Popen[bytes], engine: str, names: list[str]) -> None:
    """SIGKILL the daemon, then remove these containers behind its back."""
    daemon.kill()
    daemon.wait(timeout=30)
    await remove_directly(engine, names)


async def remove_directly(engine: str, names: list[str]) -> None:
    """Through the engine, as an operator's ``docker rm -f`` (no daemon there to ask)."""
    runtime = await open_runtime(engine)
    try:
        for name in names:
            await runtime.remove(name)
    finally:
        await runtime.close()
