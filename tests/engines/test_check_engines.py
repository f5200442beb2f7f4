"""`tuneplane-node check` as an operator reads it: one line per fact, ok / warn / FAIL,
exit 1 on any FAIL. ``cli.main`` runs in this process with a controlled environment;
the process runtime stands in for an engine where the engine is not the point.

This module holds the ones that need an engine; tests/http/test_check.py has the rest."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.checkcommand import Check
from tests.support.engines import docker_host, engine_addresses, engine_missing, podman_url
from tuneplane_node.checks import engine as engine_checks

# Slow: the check command end to end: ports, files, TLS and engines tried for real.
pytestmark = pytest.mark.slow


@pytest.mark.engine
def test_the_engine_up_passes_naming_its_version_and_address(check: Check) -> None:
    address = docker_host()
    if address is None or not address.startswith("unix://") or not Path(address[7:]).exists():
        engine_missing("docker", f"no socket at {address}")
    code, lines, out = check(TUNEPLANE_LOCAL_RUNTIME="docker", TUNEPLANE_DOCKER_HOST=str(address))
    assert code == 0, out
    assert lines["engine"].startswith("ok engine: docker ")
    assert lines["engine"].endswith(f" at {address}")
    # This kernel has no quota support: the monitor is what holds a job's disk here.
    assert lines["job disk"].startswith(
        "ok job disk: TUNEPLANE_JOB_DISK_LIMIT=50%, held by the disk monitor every 5 s ("
    )
    # The state directory, where scratch is by default, is on the store's disk here.
    assert lines["scratch"].startswith("warn scratch: sparse ext4 files in ")
    assert "on the filesystem of the engine's store" in lines["scratch"]
    assert lines["scratch"].endswith("set TUNEPLANE_SCRATCH_ROOT to another disk")
    elsewhere = Path("/dev/shm") / f"tuneplane-check-{os.getpid()}"  # a tmpfs: another disk
    code, lines, out = check(
        TUNEPLANE_LOCAL_RUNTIME="docker",
        TUNEPLANE_DOCKER_HOST=str(address),
        TUNEPLANE_SCRATCH_ROOT=str(elsewhere),
    )
    assert lines["scratch"] == (
        f"ok scratch: sparse ext4 files in {elsewhere}, up to TUNEPLANE_JOB_SCRATCH_MAX=100g a job"
    )


def two_cards(tmp_path: Path) -> dict[str, str]:
    simulation = tmp_path / "gpus.json"
    cards = [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(2)]
    simulation.write_text(json.dumps({"driver": "580.1", "cards": cards}))
    return {"TUNEPLANE_GPU_SIMULATION_FILE": str(simulation), "TUNEPLANE_LOCAL_GPU_COUNT": ""}


def engine_runtimes() -> list[str]:
    import docker

    client = docker.DockerClient(base_url=str(docker_host()))
    try:
        return list(client.info()["Runtimes"])
    finally:
        client.close()


GPU_FIXES = {
    "docker": (
        "FAIL gpu jobs: cannot run: docker has no nvidia runtime (runtimes: "
        "{runtimes}): install the NVIDIA "
        "Container Toolkit and run `sudo nvidia-ctk runtime configure --runtime=docker`, "
        "then restart docker; or, for development, set TUNEPLANE_LOCAL_GPU_PASSTHROUGH=false"
    ),
    "podman": (
        "FAIL gpu jobs: cannot run: no CDI specification in /etc/cdi, /var/run/cdi names "
        "nvidia.com/gpu=0, nvidia.com/gpu=1, which podman needs to hand the card(s) to a "
        "container: install the NVIDIA Container Toolkit and run `sudo nvidia-ctk cdi "
        "generate --output=/etc/cdi/nvidia.yaml`; or, for development, set "
        "TUNEPLANE_LOCAL_GPU_PASSTHROUGH=false"
    ),
}


@pytest.mark.engine
@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_an_engine_that_cannot_hand_out_the_cards_fails_naming_the_fix(
    check: Check, tmp_path: Path, engine: str
) -> None:
    """Issue 25, finding 1: `check` said only ok, and the first GPU launch was a 502.
    This machine's engines have neither the NVIDIA runtime nor a CDI specification."""
    settings = {**engine_addresses(engine), **two_cards(tmp_path)}
    code, lines, out = check(**settings)
    if "FAIL engine" in out:
        engine_missing(engine, lines["engine"])
    assert code == 1, out
    # The engine's runtimes as it lists them (runsc too where engines.sh registered it).
    runtimes = ", ".join(sorted(engine_runtimes())) if engine == "docker" else ""
    assert lines["gpu jobs"] == GPU_FIXES[engine].replace("{runtimes}", runtimes)
    code, lines, out = check(**settings, TUNEPLANE_LOCAL_GPU_PASSTHROUGH="false")
    assert code == 0, out
    assert lines["gpu jobs"] == (
        "warn gpu jobs: TUNEPLANE_LOCAL_GPU_PASSTHROUGH=false: jobs are labelled with cards "
        "but see none"
    )


@pytest.mark.engine
def test_a_toolkit_below_the_floor_fails_naming_the_cve(check: Check, tmp_path: Path) -> None:
    """Issue 53: NVIDIAScape (CVE-2025-23266) in toolkit 1.17.7 and older."""
    settings = {"TUNEPLANE_LOCAL_RUNTIME": "docker", **two_cards(tmp_path)}
    settings["TUNEPLANE_DOCKER_HOST"] = str(docker_host())
    simulation = Path(settings["TUNEPLANE_GPU_SIMULATION_FILE"])
    machine = json.loads(simulation.read_text())
    simulation.write_text(json.dumps({**machine, "toolkit_version": "1.17.7"}))
    code, lines, out = check(**settings)
    if "FAIL engine" in out:
        engine_missing("docker", lines["engine"])
    assert code == 1, out
    assert lines["gpu jobs"].startswith(
        "FAIL gpu jobs: cannot run: the NVIDIA Container Toolkit is 1.17.7, older than "
        "TUNEPLANE_GPU_TOOLKIT_MIN_VERSION=1.17.8: CVE-2025-23266 (NVIDIAScape) gives a "
        "hostile image host root"
    )


@pytest.mark.engine
@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_whether_the_engine_remaps_users_is_said(check: Check, engine: str, tmp_path: Path) -> None:
    settings = {"TUNEPLANE_LOCAL_RUNTIME": engine}
    if engine == "docker":
        settings["TUNEPLANE_DOCKER_HOST"] = str(docker_host())
    else:
        settings["TUNEPLANE_PODMAN_URL"] = podman_url()
    code, _, out = check(**settings)
    assert code == 0, out
    remap = [line for line in out.splitlines() if "remap users" in line or "remaps users" in line]
    assert len(remap) == 1, out  # this machine's engines do not: the fix is named
    assert remap[0].startswith(f"warn jobs: {engine} does not remap users: a root job shares")
    if engine == "podman":
        assert "ok   jobs: podman seccomp profile " in out
    assert not (tmp_path / "state").exists()  # issue 36, finding 8: check creates nothing
    assert f"ok   jobs: {engine}'s init is PID 1 of every job" in out  # catatonit installed
    code, _, out = check(**settings, TUNEPLANE_JOB_INIT="false")
    assert "warn jobs: no init (TUNEPLANE_JOB_INIT=false): a shell entrypoint" in out


@pytest.mark.engine
@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_the_jobs_parent_cgroup_is_said_with_its_bounds_and_who_holds_them(
    check: Check, engine: str
) -> None:
    """This machine's engines use the cgroupfs driver (cgroup v1), and check runs where
    it may write the tree: the node will make and bound a parent not there yet."""
    settings = {"TUNEPLANE_LOCAL_RUNTIME": engine, "TUNEPLANE_JOB_CGROUP_PARENT": "tp-check-none"}
    if engine == "docker":
        settings["TUNEPLANE_DOCKER_HOST"] = str(docker_host())
    else:
        settings["TUNEPLANE_PODMAN_URL"] = podman_url()
    _, _, out = check(**settings, TUNEPLANE_SYSTEM_RESERVED_PIDS="1000")
    (line,) = [line for line in out.splitlines() if "parent cgroup" in line]
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert line.startswith("ok   jobs: parent cgroup /tp-check-none (cgroupfs driver, cgroup v1)")
    assert f"the node's figures: pids {pid_max - 1000}, memory " in line
    assert line.endswith("the node makes and bounds it at its first launch")


@pytest.mark.engine
def test_podman_without_its_init_program_fails_the_check(
    check: Check, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The places podman looks for catatonit, none of them there: every launch would
    fail to start, which the operator learns here rather than from the first job."""
    monkeypatch.setattr(engine_checks, "PODMAN_INITS", ("/nonexistent/catatonit",))
    code, _, out = check(TUNEPLANE_LOCAL_RUNTIME="podman", TUNEPLANE_PODMAN_URL=podman_url())
    assert code == 1
    assert "FAIL jobs: podman's init (catatonit) is not installed" in out


@pytest.mark.engine
@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_mounts_say_how_they_are_staged_and_refuse_a_root_holding_the_engines_dirs(
    check: Check, tmp_path: Path, engine: str
) -> None:
    """Issue 33: the line the start-up refusal would be, before any start."""
    settings = engine_addresses(engine)
    code, lines, out = check(**settings)
    if "FAIL engine" in out:
        engine_missing(engine, lines["engine"])
    staging = tmp_path / "state" / "mounts"
    staged = f"ok mounts: opened without links, bound by descriptor under {staging}"
    assert lines["mounts"] == staged
    data_root = _data_root(engine)
    code, lines, out = check(**settings, TUNEPLANE_ALLOWED_MOUNT_ROOTS=json.dumps([data_root]))
    assert code == 1, out
    assert lines["mounts"] == (
        f"FAIL mounts: TUNEPLANE_ALLOWED_MOUNT_ROOTS: {data_root} is or holds {data_root} (the "
        f"{engine} engine's own directory), which a job may never mount; keep it out of the "
        "mount roots"
    )


def _data_root(engine: str) -> str:
    import asyncio

    from tests.conftest import open_runtime

    async def ask() -> str:
        runtime = await open_runtime(engine)
        try:
            return (await runtime.mount_support()).engine_dirs[0]
        finally:
            await runtime.close()

    return asyncio.run(ask())


@pytest.mark.engine
@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_an_engine_that_cannot_lock_rdma_jobs_memory_fails_naming_the_fix(
    check: Check, tmp_path: Path, engine: str
) -> None:
    """Issue 38: the development engines' hard memlock is this machine's (8 MiB, a stock
    engine under systemd's): the default ``unlimited`` fails, a size within it passes."""
    import resource

    from tests.unit.test_jobs_rules_confinement_rdma import rdma_dir

    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    if hard == resource.RLIM_INFINITY:
        pytest.skip("this machine's hard memlock is unlimited: the engine's may be too")
    settings = {
        **engine_addresses(engine),
        "TUNEPLANE_RDMA_DEVICE_DIR": str(rdma_dir(tmp_path)),
    }
    code, lines, out = check(**settings)
    if "FAIL engine" in out:
        engine_missing(engine, lines["engine"])
    assert code == 1, out
    assert lines["rdma"].startswith(f"FAIL rdma: 3 devices, and the {engine} engine cannot give")
    assert f"hard limit is {hard} bytes" in lines["rdma"]
    assert "LimitMEMLOCK=infinity" in lines["rdma"]
    _, lines, _ = check(**settings, TUNEPLANE_RDMA_MEMLOCK=str(hard // 2))
    assert lines["rdma"].startswith("ok rdma: 3 devices;")
