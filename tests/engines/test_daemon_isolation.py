"""Per-job user namespaces and a sandboxed runtime (issue 37), through the API on real
engines: on podman a job's root is an unprivileged range of its own (disjoint from the
next job's), a writable mount or scratch runc 1.1 cannot id-map is handed to that range
(issue 51; ``refuse``: a 409, ``host``: the host's namespace, said why), ``off`` is the old
behaviour; on a docker engine with runsc
registered (`engines.sh`: /etc/docker/daemon.json), ``TUNEPLANE_JOB_SANDBOX=cpu`` runs
jobs without cards under gVisor, and a sandbox an engine lacks is a 409.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import MakeNode
from tests.engines.test_daemon_scratch import logged, sweep
from tests.support.console import Console
from tests.support.daemons import interruptible
from tests.support.engines import DEV_ROOT, RUN_DIR, engine_missing
from tests.support.nodes import storage_root
from tests.support.throwaway import ThrowawayDocker

pytestmark = pytest.mark.engine
UID_MAP = ["/bin/sh", "-c", "cat /proc/self/uid_map; echo mapped; exec sleep 300"]
HOST_MAP = (0, 0, 4294967295)


async def uid_map(node: Console, ref: str) -> tuple[int, ...]:
    """The job's one line of /proc/self/uid_map: (inside, outside, count)."""
    said = await logged(node, ref, "mapped")
    line = said.splitlines()[0].split()
    return tuple(int(word) for word in line[-3:])


async def test_podman_jobs_get_disjoint_ranges_of_their_own(make_node: MakeNode) -> None:
    node = await make_node("podman")
    first, _ = await node.launch(UID_MAP)
    second, _ = await node.launch(UID_MAP)
    inside_a, host_a, count_a = await uid_map(node, first)
    inside_b, host_b, count_b = await uid_map(node, second)
    assert (inside_a, count_a) == (inside_b, count_b) == (0, 65536)
    assert host_a != 0 and host_b != 0  # root in the job is nobody on the host
    assert abs(host_a - host_b) >= 65536  # disjoint
    states = await node.observe(first, second)
    assert {s["userns"] for s in states.values()} == {"own"}
    assert {s["runtime"] for s in states.values()} == {"runc"}  # libpod's word, not "oci"
    isolation = (await node.ok("GET", "/node/v1/inventory"))["isolation"]
    assert isolation == {
        "userns": "auto",
        "sandbox": "off",
        "sandbox_runtime": "runsc",
        "own_userns": True,
        "sandbox_available": False,  # podman 4.3 runs every container under its own
        "runtimes": ["runc"],
    }


def tenant_dir(tmp_path: Path) -> Path:
    """A tenant's directory under the node's storage root (made, root's, as the host's)."""
    data = storage_root(tmp_path) / "data"
    data.mkdir()
    return data


WRITES = "cat /proc/self/uid_map; cat /data/old; touch /data/x && ls -ln /data && echo mapped"


@pytest.mark.podman
async def test_a_writable_mount_runc_cannot_map_is_handed_to_the_jobs_own_range(
    make_node: MakeNode, tmp_path: Path
) -> None:
    """Issue 51: one writable mount gave the job the host's namespace under the default;
    now it keeps its own, writes its mount, and the host sees its range own the files
    (the one there before included: the node's hand-over before its start)."""
    data = tenant_dir(tmp_path)
    (data / "old").write_text("before\n")
    node = await make_node("podman")
    ref, _ = await node.launch(
        ["/bin/sh", "-c", f"{WRITES}; exec sleep 300"], mounts=[[str(data), "/data", False]]
    )
    inside, host, count = await uid_map(node, ref)
    assert (inside, count) == (0, 65536) and host != 0  # not the host's (0 0 4294967295)
    said = await node.logs(ref)
    assert "before" in said  # the tenant's file, readable in its own namespace
    owners = {path.name: path.stat().st_uid for path in (data, data / "old", data / "x")}
    assert owners == {"data": host, "old": host, "x": host}, said  # root in the job: the range
    state = await node.state(ref)
    assert state["userns"] == "own" and "handed to its range" in state["userns_note"]


@pytest.mark.podman
async def test_a_scratch_runc_cannot_map_is_the_jobs_own_too(
    make_node: MakeNode, tmp_path: Path
) -> None:
    node = await make_node("podman")
    ref, _ = await node.launch(
        ["/bin/sh", "-c", "cat /proc/self/uid_map; touch /s/y && stat -c %u /s/y && echo mapped"],
        scratch={"path": "/s", "size": "8m"},
    )
    try:
        assert (await uid_map(node, ref))[1] != 0
        said = await logged(node, ref, "mapped")
        assert said.splitlines()[-2].split()[-1] == "0"  # its root's file, in its own namespace
        assert (await node.state(ref))["userns"] == "own"
    finally:
        await node.remove(ref)  # the node's remove lets the scratch go
        sweep(tmp_path)


@pytest.mark.podman
async def test_host_keeps_the_unmappable_mount_in_the_host_namespace_and_says_why(
    make_node: MakeNode, tmp_path: Path
) -> None:
    data = tenant_dir(tmp_path)
    node = await make_node("podman", job_userns_writable="host")
    ref, _ = await node.launch(
        ["/bin/sh", "-c", "cat /proc/self/uid_map; touch /data/x && echo mapped; exec sleep 300"],
        mounts=[[str(data), "/data", False]],
    )
    assert await uid_map(node, ref) == HOST_MAP
    assert (data / "x").stat().st_uid == 0  # root's file, as the host sees it: writable
    state = await node.state(ref)
    assert state["userns"] == "host"
    assert "container.mounts[0]" in state["userns_note"] and "id-map" in state["userns_note"]
    read_only, _ = await node.launch(UID_MAP, mounts=[[str(data), "/data", True]])
    assert (await uid_map(node, read_only))[1] != 0  # read-only mounts need no mapping


@pytest.mark.podman
async def test_refuse_answers_the_unmappable_mount_a_409_naming_it(
    make_node: MakeNode, tmp_path: Path
) -> None:
    data = tenant_dir(tmp_path)
    node = await make_node("podman", job_userns_writable="refuse")
    _, answer = await node.launch(mounts=[[str(data), "/data", False]], expect=409)
    assert answer["code"] == "userns_unavailable"
    assert "container.mounts[0]" in answer["detail"]
    assert "TUNEPLANE_JOB_USERNS_WRITABLE=chown" in answer["detail"]
    try:
        _, answer = await node.launch(scratch={"path": "/s", "size": "8m"}, expect=409)
        assert "container.scratch" in answer["detail"]
    finally:
        sweep(tmp_path)  # refused before the scratch is made: nothing, unless it regressed


@pytest.mark.podman
async def test_off_and_card_jobs_keep_the_host_namespace(make_node: MakeNode) -> None:
    off = await make_node("podman", job_userns="off")
    ref, _ = await off.launch(UID_MAP)
    assert await uid_map(off, ref) == HOST_MAP
    assert (await off.state(ref))["userns"] is None
    node = await make_node("podman")
    card, _ = await node.launch(UID_MAP, gpus=1)
    assert await uid_map(node, card) == HOST_MAP
    state = await node.state(card)
    assert state["userns"] == "host" and "TUNEPLANE_JOB_USERNS_CARDS" in state["userns_note"]


@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_a_sandbox_the_engine_lacks_is_a_409_never_runc(
    make_node: MakeNode, engine: str
) -> None:
    node = await make_node(engine, sandbox_runtime="no-such-sandbox")
    _, answer = await node.launch(isolation="sandbox", expect=409)
    assert answer["code"] == "sandbox_unavailable"
    assert "no-such-sandbox" in answer["detail"] and "runtimeArgs" in answer["detail"]


@pytest.fixture
async def sandbox_docker(throwaway_docker: ThrowawayDocker) -> ThrowawayDocker:
    """A throwaway docker engine that reads /etc/docker/daemon.json, with runsc in it."""
    runtimes = throwaway_docker.docker("info", "--format", "{{json .Runtimes}}").stdout
    if b"runsc" not in runtimes:
        engine_missing("runsc in docker's runtimes", "engines.sh registers it")
    return throwaway_docker


@pytest.mark.parametrize("network", ["none", "host"])
@pytest.mark.own_engines
async def test_the_cpu_rule_runs_jobs_without_cards_under_gvisor(
    sandbox_docker: ThrowawayDocker, make_node: MakeNode, network: str
) -> None:
    node = await make_node(docker_host=sandbox_docker.host, job_sandbox="cpu")
    isolation = (await node.ok("GET", "/node/v1/inventory"))["isolation"]
    assert isolation["sandbox_available"] is True and isolation["own_userns"] is False
    assert "runsc" in isolation["runtimes"]
    done, _ = await node.launch(
        ["/bin/sh", "-c", "cat /proc/version; echo said; exit 3"], network=network
    )
    await node.wait_for(done, "status", "exited")
    state = await node.state(done)
    assert state["exit_code"] == 3 and state["runtime"] == "runsc"
    said = await node.logs(done)
    assert "said" in said and "Linux version 4.4.0" in said  # gVisor's, not the host's
    sleeper, _ = await node.launch(["/bin/sleep", "300"], network=network)
    await node.wait_for(sleeper, "status", "running")
    await node.stop(sleeper, timeout=5)
    stopped = await node.state(sleeper)
    assert stopped["status"] == "exited" and stopped["runtime"] == "runsc"
    card, _ = await node.launch(["/bin/sh", "-c", "cat /proc/version"], gpus=1, network=network)
    await node.wait_for(card, "status", "exited")
    assert (await node.state(card))["runtime"] == "runc"
    assert "Linux version 4.4.0" not in await node.logs(card)


@pytest.mark.podman
async def test_a_job_of_its_own_namespace_is_removed_once_it_exits(make_node: MakeNode) -> None:
    """podman 4.3 answers its remove with "userdata/shm: device or resource busy" after
    removing everything: the node reads the container gone, not a 502."""
    node = await make_node("podman")
    for _ in range(3):
        ref, _ = await node.launch(["/bin/sh", "-c", "exit 0"], network="none")
        await node.wait_for(ref, "status", "exited")
        assert (await node.state(ref))["userns"] == "own"
        await node.remove(ref)
        assert (await node.state(ref))["exists"] is False


@pytest.fixture
def runsc_podman(tmp_path: Path) -> Iterator[str]:
    """A podman service whose own runtime is gVisor (``podman --runtime runsc``, as an
    operator's containers.conf would make it), on the tests' store (its image is there),
    on a socket of its own: podman 4.3's API takes no runtime per container."""
    conf = DEV_ROOT / "podman-tests-containers.conf"
    if shutil.which("runsc") is None or not conf.exists():
        engine_missing("runsc and the tests' podman", "engines.sh installs and writes them")
    sock = tmp_path / "runsc-podman.sock"
    service = subprocess.Popen(
        ["podman", "--root", str(DEV_ROOT / "podman-tests/storage"),
         "--runroot", str(RUN_DIR / "podman-tests-run/storage"),
         "--runtime", "runsc", "--runtime-flag", "network=host",
         "--runtime-flag", "platform=ptrace", "system", "service", "--time=0", f"unix://{sock}"],
        env={**os.environ, "CONTAINERS_CONF": str(conf)},
        cwd="/",  # conmon keeps the service's directory: never the test's, removed later
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "podman.log").open("w"),
        preexec_fn=interruptible,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not sock.exists():
            assert service.poll() is None, (tmp_path / "podman.log").read_text()
            assert time.monotonic() < deadline, "the runsc podman service never listened"
            time.sleep(0.05)
        yield f"unix://{sock}"
    finally:
        service.terminate()
        service.wait(timeout=30)


async def test_a_podman_whose_runtime_is_gvisor_sandboxes_its_jobs_and_refuses_card_jobs(
    runsc_podman: str, make_node: MakeNode
) -> None:
    node = await make_node("podman", podman_url=runsc_podman, job_sandbox="all")
    isolation = (await node.ok("GET", "/node/v1/inventory"))["isolation"]
    assert isolation["sandbox_available"] is True and isolation["runtimes"] == ["runsc"]
    done, _ = await node.launch(["/bin/sh", "-c", "cat /proc/version; echo said; exit 3"])
    await node.wait_for(done, "status", "exited")
    state = await node.state(done)
    assert state["exit_code"] == 3 and state["runtime"] == "runsc"
    assert state["userns"] == "host" and "runs under runsc" in state["userns_note"]
    said = await node.logs(done)
    assert "said" in said and "Linux version 4.4.0" in said  # gVisor's, not the host's
    sleeper, _ = await node.launch(["/bin/sleep", "300"])
    await node.wait_for(sleeper, "status", "running")
    await node.stop(sleeper, timeout=5)
    assert (await node.state(sleeper))["status"] == "exited"
    _, refused = await node.launch(gpus=1, expect=409)  # no GPU proxy registered
    assert refused["code"] == "sandbox_unavailable" and "--nvproxy" in refused["detail"]
