"""ProcessRuntime against real processes: what a developer without an engine would see."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.conftest import fake_settings
from tests.support.runtimes import log_text
from tests.support.waiting import wait_status as shared_wait_status
from tests.support.waiting import wait_until
from tuneplane_node.clock import parse_rfc3339 as parse_time
from tuneplane_node.errors import EngineRefused, InvalidField
from tuneplane_node.runtime.base import PullLimits
from tuneplane_node.runtime.process.runtime import ProcessRuntime
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import LABEL_RUN_ID

# Slow: each test starts, signals and reaps real processes (the contract suite over this
# runtime, tests/contract/test_runtime_contract.py, is in the fast suite).
pytestmark = pytest.mark.slow

STAMPED = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z) (.*)$")


def job(name: str, command: list[str], **fields: object) -> ContainerSpec:
    labels = {LABEL_RUN_ID: name, **fields.pop("labels", {})}  # type: ignore[dict-item]
    return ContainerSpec(
        name=f"tuneplane-{name}",
        image="ignored:latest",
        command=tuple(command),
        labels=labels,
        **fields,  # type: ignore[arg-type]
    )


def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state" / "process-runtime"


def kill_leftovers(root: Path) -> None:
    """Kill every job group under ``root``, independently of the code under test."""
    for proc_file in root.glob("*/proc.json"):
        pid = json.loads(proc_file.read_text())["main"]["pid"]
        with contextlib.suppress(ProcessLookupError):  # the group outlives a dead leader
            os.killpg(pid, signal.SIGKILL)


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[ProcessRuntime]:
    rt = ProcessRuntime(fake_settings(tmp_path))
    yield rt
    kill_leftovers(state_dir(tmp_path))
    await rt.close()


# Bare processes answer faster than engines: poll tighter, give up sooner.
wait_status = functools.partial(shared_wait_status, timeout=10, poll=0.05)


async def wait_file(path: Path, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().endswith("\n")):
        assert time.monotonic() < deadline, f"{path} never appeared"
        await asyncio.sleep(0.05)
    return path.read_text()


def pid_running(pid: int) -> bool:
    """True while the pid is a live process; a zombie (dead, unreaped) is not running."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


async def test_a_job_gets_a_minimal_env_never_the_daemons(
    runtime: ProcessRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon's own variables (its token) stay out of a job; a minimal base env is
    there (HOME, and PATH: ``sh`` was found). What the spec gives reaches it: the
    contract (tests/contract)."""
    monkeypatch.setenv("TUNEPLANE_NODE_TOKEN", "daemon-secret")
    script = 'printf "%s|%s\\n" "$TUNEPLANE_NODE_TOKEN" "$HOME" > seen'
    spec = job("env", ["sh", "-c", script], workdir=str(tmp_path))

    await runtime.run(spec)

    assert (await wait_status(runtime, spec.name, "exited")).exit_code == 0
    token, home = (await wait_file(tmp_path / "seen")).rstrip("\n").split("|")
    assert (token, bool(home)) == ("", True)


@pytest.mark.parametrize(("gpus", "visible"), [((2, 0), "set:0,2"), ((), "set:")])
async def test_gpus_become_cuda_visible_devices_and_the_spec_cannot_widen_them(
    runtime: ProcessRuntime, tmp_path: Path, gpus: tuple[int, ...], visible: str
) -> None:
    spec = job(
        "gpus",
        ["sh", "-c", 'echo "${CUDA_VISIBLE_DEVICES+set}:$CUDA_VISIBLE_DEVICES" > cards'],
        env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        gpus=gpus,
        workdir=str(tmp_path),
    )

    await runtime.run(spec)

    assert (await wait_file(tmp_path / "cards")).strip() == visible


async def test_logs_are_timestamped_and_hold_stdout_and_stderr_in_order(
    runtime: ProcessRuntime,
) -> None:
    spec = job("logs", ["sh", "-c", "echo to-out; echo to-err >&2; printf no-newline"])
    before = datetime.now(timezone.utc) - timedelta(seconds=1)

    await runtime.run(spec)
    await wait_status(runtime, spec.name, "exited")

    lines = (await log_text(runtime, spec.name, 100)).splitlines()
    matches = [STAMPED.match(line) for line in lines]
    assert all(matches), lines
    assert [m.group(2) for m in matches if m] == ["to-out", "to-err", "no-newline"]
    for m in matches:
        assert m is not None
        stamp = parse_time(m.group(1))
        assert stamp is not None and before <= stamp <= datetime.now(timezone.utc)
    last = (await log_text(runtime, spec.name, 1)).splitlines()
    assert len(last) == 1 and last[0].endswith(" no-newline")
    assert await log_text(runtime, spec.name, 0) == ""


async def test_output_after_a_daemon_restart_is_still_stamped(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path)
    first = ProcessRuntime(settings)
    spec = job("restart", ["sh", "-c", "echo before; sleep 0.3; echo after; exit 4"])
    try:
        await first.run(spec)
        await first.close()  # the daemon goes away; the job does not
        restarted_at = datetime.now(timezone.utc)
        second = ProcessRuntime(settings)
        assert (await second.inspect(spec.name)).status == "running"

        state = await wait_status(second, spec.name, "exited")

        assert state.exit_code == 4
        lines = (await log_text(second, spec.name, 10)).splitlines()
        after = [STAMPED.match(line) for line in lines if line.endswith(" after")]
        assert len(after) == 1 and after[0] is not None
        stamp = parse_time(after[0].group(1))
        assert stamp is not None and stamp >= restarted_at
        await second.close()
    finally:
        kill_leftovers(state_dir(tmp_path))


async def test_sigterm_reaches_the_whole_process_tree(
    runtime: ProcessRuntime, tmp_path: Path
) -> None:
    spec = job("tree", ["sh", "-c", "sleep 300 & echo $! > child.pid; wait"], workdir=str(tmp_path))
    await runtime.run(spec)
    child = int(await wait_file(tmp_path / "child.pid"))
    assert pid_running(child)

    await runtime.kill(spec.name, "SIGTERM")

    assert await runtime.wait_exited(spec.name, 5)
    state = await runtime.inspect(spec.name)
    assert (state.status, state.exit_code) == ("exited", 128 + signal.SIGTERM)
    # The group's signal is pending in the child from the kill on; it dies when next
    # scheduled, which a loaded machine delays (seen in CI): a bound of the scheduler's,
    # with a wide margin. A child the signal missed sleeps its 300 s and fails this.
    await wait_until(lambda: not pid_running(child), timeout=30)


async def test_a_job_killed_from_outside_reads_exited_137(
    runtime: ProcessRuntime, tmp_path: Path
) -> None:
    spec = job("outside", ["sh", "-c", "echo $$ > job.pid; exec sleep 300"], workdir=str(tmp_path))
    await runtime.run(spec)
    pid = int(await wait_file(tmp_path / "job.pid"))

    os.killpg(os.getpgid(pid), signal.SIGKILL)

    state = await wait_status(runtime, spec.name, "exited")
    assert state.exit_code == 137
    assert state.finished_at is not None
    assert (await runtime.inspect(spec.name)).finished_at == state.finished_at  # stable


async def test_a_recycled_pid_is_not_taken_for_the_job(tmp_path: Path) -> None:
    """After a reboot the recorded pid may belong to a stranger: the job is over."""
    settings = fake_settings(tmp_path)
    first = ProcessRuntime(settings)
    spec = job("reboot", ["true"])
    stranger = subprocess.Popen(["sleep", "300"])
    await asyncio.sleep(0.1)  # start times count in 10 ms ticks: be a tick apart at least
    try:
        await first.run(spec)
        await wait_status(first, spec.name, "exited")
        await first.close()
        proc_file = state_dir(tmp_path) / spec.name / "proc.json"
        (state_dir(tmp_path) / spec.name / "rc").unlink()  # it never got to write one
        record = json.loads(proc_file.read_text())
        record["main"]["pid"] = stranger.pid  # its start time stays the job's
        proc_file.write_text(json.dumps(record))

        state = await ProcessRuntime(settings).inspect(spec.name)

        assert (state.status, state.exit_code) == ("exited", 137)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


async def test_background_processes_die_when_the_job_ends(
    runtime: ProcessRuntime, tmp_path: Path
) -> None:
    spec = job("orphan", ["sh", "-c", "sleep 300 & echo $! > child.pid"], workdir=str(tmp_path))

    await runtime.run(spec)

    state = await wait_status(runtime, spec.name, "exited")
    assert state.exit_code == 0
    child = int(await wait_file(tmp_path / "child.pid"))
    await wait_until(lambda: not pid_running(child), timeout=2)  # the group's SIGKILL lands


async def test_remove_kills_a_running_job_deletes_it_and_frees_the_name(
    runtime: ProcessRuntime, tmp_path: Path
) -> None:
    spec = job("gone", ["sh", "-c", "echo $$ > job.pid; exec sleep 300"], workdir=str(tmp_path))
    await runtime.run(spec)
    pid = int(await wait_file(tmp_path / "job.pid"))

    await runtime.remove(spec.name)

    assert not pid_running(pid)
    assert not (await runtime.inspect(spec.name)).exists
    assert await runtime.ps() == []
    assert not (state_dir(tmp_path) / spec.name).exists()
    await runtime.run(job("gone", ["true"]))
    assert (await wait_status(runtime, spec.name, "exited")).exit_code == 0


HOLDER = """
import mmap, os, time
held = mmap.mmap(-1, 512 << 20)
for page in range(0, len(held), mmap.PAGESIZE):
    held[page] = 1
with open("child.pid", "w") as out:
    out.write(f"{os.getpid()}\\n")
time.sleep(300)
"""
"""A child of the job that holds 512 MiB: after a SIGKILL the kernel takes about 80 ms
here to free it, where the job's leader, a shell, is gone in a millisecond."""


async def test_remove_returns_once_every_process_of_the_job_has_ended(
    runtime: ProcessRuntime, tmp_path: Path
) -> None:
    """Issue 52: remove returned once the job's leader was gone, while a process it
    started could still run (seen under load with a plain ``sleep``). A child slow to end
    shows it on a quiet machine too: remove now waits for the whole group."""
    command = ["sh", "-c", '"$0" -c "$1" & wait', sys.executable, HOLDER]
    spec = job("holder", command, workdir=str(tmp_path))
    await runtime.run(spec)
    child = int(await wait_file(tmp_path / "child.pid"))

    await runtime.remove(spec.name)

    assert not pid_running(child)


async def test_run_refuses_what_it_cannot_start_and_leaves_nothing(
    runtime: ProcessRuntime, tmp_path: Path
) -> None:
    escape = ContainerSpec(name="../escape", image="x", command=("true",))
    with pytest.raises(InvalidField, match=r"^container\.name: "):
        await runtime.run(escape)
    with pytest.raises(EngineRefused):
        await runtime.run(job("nowhere", ["true"], workdir=str(tmp_path / "missing")))
    with pytest.raises(InvalidField, match="needs a command"):
        await runtime.run(job("empty", []))

    assert await runtime.ps() == []
    assert not (tmp_path / "state" / "escape").exists()


async def test_health_images_and_pull(runtime: ProcessRuntime) -> None:
    health = await runtime.health()

    assert (health.ok, health.engine) == (True, "process")
    assert health.version and "Python" in health.version
    assert await runtime.image_exists("anything:at-all")
    await runtime.pull("anything:at-all", limits=PullLimits(1, 1))
    assert runtime.status() is None


async def test_usage_sums_the_jobs_process_group(runtime: ProcessRuntime) -> None:
    spec = job("usage", ["/bin/sh", "-c", "sleep 30 & wait"])
    await runtime.run(spec)
    deadline = time.monotonic() + 10
    while (found := (await runtime.usage([spec.name]))[spec.name]).pids != 3:
        assert time.monotonic() < deadline, found  # the wrapper, the job's sh, its sleep
        await asyncio.sleep(0.05)
    assert list(await runtime.usage([spec.name, "tuneplane-nobody"])) == [spec.name]
    assert found.memory_bytes is not None and found.memory_bytes > 0
    assert found.cpu_seconds is not None and found.memory_limit_bytes is None
