"""The `ContainerRuntime` contract, one suite for every runtime: the in-memory fake the
fast tests stand on, the process runtime, and the real Docker and podman engines.

Each test runs on each runtime and asserts the same thing; where they must differ (the
process runtime has no images and no ids) the `Subject` says so, in one place. A
`Subject` plays the job's part: on a real runtime a shell script, on the fake the test's
levers (`FakeRuntime.exit`, its output, how it takes SIGTERM). When the fake disagrees
with the engines here, the fake is what is wrong.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.conftest import IMAGE as FAKE_IMAGE
from tests.conftest import fake_settings, open_runtime
from tests.fakes.clock import FakeClock
from tests.fakes.runtime import FakeRuntime
from tests.support.engines import engine_missing, engine_settings
from tests.support.images import IMAGE, REGISTRY
from tests.support.jobs import job, unique
from tests.support.runtimes import TrackingRuntime, log_text
from tests.support.throwaway import ThrowawayDocker
from tuneplane_node.clock import parse_rfc3339
from tuneplane_node.errors import EngineConflict, EngineRefused, EngineUnavailable
from tuneplane_node.runtime.base import ContainerRuntime, ContainerState, LogQuery, LogStream
from tuneplane_node.runtime.engines.docker import DockerRuntime
from tuneplane_node.runtime.engines.engine import EngineRuntime
from tuneplane_node.runtime.engines.podman import PodmanRuntime
from tuneplane_node.runtime.process.runtime import ProcessRuntime
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import LABEL_GPUS, LABEL_RUN_ID, container_name

SANDBOXED = "docker-sandbox"
RUNTIMES = [
    "fake",
    "process",
    pytest.param("docker", marks=pytest.mark.engine),
    pytest.param("podman", marks=pytest.mark.engine),
]
SUBJECTS = [*RUNTIMES, pytest.param(SANDBOXED, marks=[pytest.mark.engine, pytest.mark.own_engines])]
"""The runtimes, and docker's jobs under gVisor (runsc) on an engine of the module's own."""
DOWN = ["fake", "process", "docker", "podman"]
"""The runtimes whose engine cannot be asked: no engine is needed to see that (an engine
runtime at a socket that does not exist), so none is marked ``engine``."""
ENGINE_DOWN = "unix:///nonexistent/engine.sock"
ABSENT_IMAGE = f"{REGISTRY}/tuneplane-test/none:1"
READY = "ready"  # what a script prints once its signal handling is in place
QUERY = LogQuery(tail=100, max_bytes=8 * 2**20)


@dataclass
class Subject:
    """One runtime under the contract, and how a job behaves on it."""

    kind: str
    runtime: ContainerRuntime  # a TrackingRuntime: what a test makes is removed after it
    image: str
    fake: FakeRuntime | None = None
    engine: EngineRuntime | None = None  # docker's or podman's: the host pid of a job
    has_images: bool = True  # the process runtime has none: every image is "there"
    # What a job whose command is no program exits with: 127, as a shell's, from the
    # process runtime's wrapper and from docker's init (tini); podman's init (catatonit)
    # exits 1 when it cannot exec the command.
    not_found_exit: int = 127
    # The process runtime enforces no limit (a bare process has no cgroup of its own):
    # a job over its memory limit runs on to its end.
    enforces_memory_limit: bool = True
    # Whether the engine learns that the OOM killer ended a job: podman 4.3's conmon on a
    # cgroup v1 host does not (State.OOMKilled stays false; the exit code, 137, is what
    # shows the kill), and the node reports the engine's word (docs/api.md says so).
    reports_oom: bool = True
    # How long a job is watched to show a signal did not end it. A wrongly ended job
    # reads exited within: the fake at once, the process runtime one poll of its pid
    # (20 ms) after the shell's loop turns, an engine after its event and inspect.
    quiet_s: float = 0.3

    def spec(self, command: list[str], **fields: object) -> ContainerSpec:
        if self.kind == SANDBOXED:
            fields.setdefault("runtime", "runsc")
        return job(command, image=self.image, **fields)

    async def started(self, command: list[str], **fields: object) -> ContainerSpec:
        spec = self.spec(command, **fields)
        await self.runtime.run(spec)
        return spec

    async def sleeper(self, **fields: object) -> ContainerSpec:
        """A job that runs until it is killed (SIGKILL: PID 1 of a container may ignore
        SIGTERM)."""
        return await self.started(["/bin/sh", "-c", "exec sleep 300"], **fields)

    async def exited(self, code: int, *lines: str) -> ContainerState:
        """A job that prints ``lines``, exits ``code`` by itself, and has ended.

        It runs 20 ms at least: the process runtime dates a job's end by its rc file's
        mtime, from the kernel's coarse clock (4 ms a tick on the development machine),
        and a job that ends sooner can read finished before it started."""
        script = "".join(f"echo {line}; " for line in lines) + f"sleep 0.02; exit {code}"
        spec = await self.started(["/bin/sh", "-c", script])
        if self.fake is not None:
            self.fake.containers[spec.name].output.extend(lines)
            self.fake.exit(spec.name, code)
        assert await self.runtime.wait_exited(spec.name, 20)
        return await self.runtime.inspect(spec.name)

    async def printed(self, stdout: str, stderr: str) -> ContainerState:
        """A job that writes one line to each stream and exits 0."""
        spec = await self.started(["/bin/sh", "-c", f"echo {stdout}; echo {stderr} >&2"])
        if self.fake is not None:
            self.fake.containers[spec.name].output.extend([stdout, stderr])
            self.fake.exit(spec.name, 0)
        assert await self.runtime.wait_exited(spec.name, 20)
        return await self.runtime.inspect(spec.name)

    async def handling_sigterm(self, *, exit_code: int | None) -> ContainerSpec:
        """A job that exits ``exit_code`` on SIGTERM, or (None) ignores it; returned once
        its handler is in place."""
        action = "''" if exit_code is None else f"'exit {exit_code}'"
        script = f"trap {action} TERM; trap 'echo got-usr1' USR1; echo {READY}; "
        # A trap runs once the sleep ends. The process runtime signals the whole group: a
        # sleep a signal ended, the shell says so (dash: "User defined signal 1"), to no one.
        script += "while true; do { sleep 0.02; } 2>/dev/null; done"
        spec = await self.started(["/bin/sh", "-c", script])
        if self.fake is not None:
            container = self.fake.containers[spec.name]
            container.output.append(READY)
            container.ignores_sigterm = exit_code is None
            container.sigterm_exit_code = exit_code or 143
            container.handlers["SIGUSR1"] = None
        await self.logged(spec, READY)
        return spec

    async def poked(self, spec: ContainerSpec) -> None:
        """SIGUSR1 to a job of `handling_sigterm`, whose handler writes "got-usr1"."""
        await self.runtime.kill(spec.name, "SIGUSR1")
        if self.fake is not None:
            self.fake.containers[spec.name].output.append("got-usr1")

    async def logged(self, spec: ContainerSpec, text: str) -> None:
        """Once ``text`` is in the job's log."""
        deadline = time.monotonic() + 20
        while text not in await log_text(self.runtime, spec.name):
            assert time.monotonic() < deadline, f"the job never wrote {text!r}"
            await asyncio.sleep(0.01)

    async def finished(
        self, command: list[str], *, output: list[str], **fields: object
    ) -> ContainerState:
        """A job that runs ``command`` to its end; on the fake, it writes ``output`` and
        exits 0."""
        spec = await self.started(command, **fields)
        if self.fake is not None:
            self.fake.containers[spec.name].output.extend(output)
            self.fake.exit(spec.name, 0)
        assert await self.runtime.wait_exited(spec.name, 20)
        return await self.runtime.inspect(spec.name)

    async def no_program(self) -> ContainerState:
        """A job whose argv[0] is no program (`exit`, a shell's builtin), once ended."""
        spec = await self.started(["exit", "0"])
        if self.fake is not None:
            self.fake.exit(spec.name, self.not_found_exit)
        assert await self.runtime.wait_exited(spec.name, 20)
        return await self.runtime.inspect(spec.name)

    async def over_memory(self) -> ContainerState:
        """A job that takes 64 MiB under a 16 MiB memory limit, once ended; on the fake,
        the kernel's OOM killer ends it."""
        hog = 'a=$(dd if=/dev/zero bs=1M count=64 2>/dev/null | tr "\\0" x); echo ${#a}'
        spec = await self.started(["/bin/sh", "-c", hog], memory_limit="16m")
        if self.fake is not None:
            self.fake.exit(spec.name, 137, oom=True)
        assert await self.runtime.wait_exited(spec.name, 60)
        return await self.runtime.inspect(spec.name)

    async def holder(self) -> tuple[ContainerSpec, int]:
        """A running job, and the host pid of one of its processes: on an engine its
        init's (the engine's inspect), on the process runtime a child of its shell (the
        pid it writes), on the fake one the test places in it."""
        spec = await self.started(["/bin/sh", "-c", "sleep 300 & echo pid=$!; wait"])
        if self.fake is not None:
            pid = 999_999_001
            self.fake.holders[pid] = self.fake.containers[spec.name].id
        elif self.engine is not None:
            document = await self.engine.pool.call(self.engine._document, spec.name)
            pid = int(document["State"]["Pid"])
        else:
            await self.logged(spec, "pid=")
            pid = int((await log_text(self.runtime, spec.name)).split("pid=")[1].split()[0])
        return spec, pid

    async def foreign(self) -> ContainerSpec:
        """A container that is not the node's: no run-id label."""
        spec = ContainerSpec(name=unique("foreign"), image=self.image, command=("sleep", "300"))
        if self.fake is not None:
            self.fake.create_outside(spec)
        else:
            await self.runtime.run(spec)
        return spec

    def failing_start(self) -> ContainerSpec:
        """A spec the runtime creates and then cannot start."""
        if self.fake is not None:
            self.fake.refuse_start = "exec: no such file"
            return self.spec(["/bin/true"])
        if self.kind == "process":  # any argv starts (the wrapper runs it): the cwd cannot
            return self.spec(["/bin/true"], workdir="/nonexistent/workdir")
        # A user the image lacks fails before the init runs; a missing command no longer
        # does: the init (tini, catatonit) starts, then fails to exec it (exit 127).
        return self.spec(["/bin/true"], user="no-such-user")


@pytest.fixture(scope="module")
def sandbox_engine() -> Iterator[ThrowawayDocker]:
    """A throwaway docker engine (it reads /etc/docker/daemon.json, where `engines.sh`
    registers runsc), shared by this module's sandboxed subjects."""
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        engine_missing("a throwaway docker engine", "dockerd and root are needed to start one")
    ThrowawayDocker.clear_stale()
    engine = ThrowawayDocker()
    try:
        engine.start()
        runtimes = engine.docker("info", "--format", "{{json .Runtimes}}").stdout
        if b"runsc" not in runtimes:
            engine_missing("runsc in docker's runtimes", "engines.sh registers it")
        engine.load_test_image()
        yield engine
    finally:
        engine.close()


@pytest.fixture(params=SUBJECTS)
async def subject(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Subject]:
    kind: str = request.param
    inner: ContainerRuntime
    fake = engine = None
    if kind == "fake":
        inner = fake = FakeRuntime(clock=FakeClock(), images=(FAKE_IMAGE,))
    elif kind == "process":
        inner = ProcessRuntime(fake_settings(tmp_path), state_dir=tmp_path / "jobs")
    elif kind == SANDBOXED:
        sandbox: ThrowawayDocker = request.getfixturevalue("sandbox_engine")
        inner = engine = await open_runtime(
            "docker", docker_host=sandbox.host, local_gpu_passthrough=False
        )
    else:
        inner = engine = await open_runtime(kind, local_gpu_passthrough=False)
    runtime = TrackingRuntime(inner)
    yield Subject(
        kind,
        runtime,
        FAKE_IMAGE if fake is not None else IMAGE,
        fake=fake,
        engine=engine,
        has_images=kind != "process",
        not_found_exit=1 if kind == "podman" else 127,
        enforces_memory_limit=kind != "process",
        reports_oom=kind != "podman",
        quiet_s={"fake": 0.02, "process": 0.1}.get(kind, 0.3),
    )
    await runtime.cleanup()
    await inner.close()


@pytest.fixture(params=DOWN)
async def down(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ContainerRuntime]:
    """A runtime whose engine cannot be asked."""
    kind: str = request.param
    runtime: ContainerRuntime
    if kind == "fake":
        runtime = FakeRuntime()
        runtime.up = False
    elif kind == "process":
        (tmp_path / "a-file").write_text("")  # its state directory cannot be made or read
        runtime = ProcessRuntime(fake_settings(tmp_path), state_dir=tmp_path / "a-file" / "jobs")
    elif kind == "docker":
        runtime = DockerRuntime(engine_settings("docker", docker_host=ENGINE_DOWN))
    else:
        runtime = PodmanRuntime(engine_settings("podman", podman_url=ENGINE_DOWN))
    yield runtime
    await runtime.close()


def moments(state: ContainerState) -> list[datetime | None]:
    return [parse_rfc3339(t) for t in (state.created_at, state.started_at, state.finished_at)]


def texts(log: str) -> list[str]:
    """The lines of a log without their times."""
    return [line.split(" ", 1)[1] for line in log.splitlines()]


# --- run and inspect ------------------------------------------------------------------------


async def test_a_running_job_shows_its_labels_and_cards_and_no_exit(subject: Subject) -> None:
    before = datetime.now(timezone.utc) - timedelta(seconds=5)
    spec = subject.spec(["/bin/sh", "-c", "exec sleep 300"], labels={"tuneplane.user": "alice"})
    spec = replace(spec, gpus=(2, 0))

    returned = await subject.runtime.run(spec)
    state = await subject.runtime.inspect(spec.name)

    assert re.fullmatch(r"[0-9a-f]{64}", returned), returned
    assert (state.exists, state.status, state.exit_code) == (True, "running", None)
    assert state.labels[LABEL_GPUS] == "0,2" and state.gpus == (0, 2)
    assert state.labels["tuneplane.user"] == "alice"
    assert state.run_id == spec.labels[LABEL_RUN_ID] and state.ours and state.live
    assert state.id in (None, returned)  # the process runtime reports none: its name is all
    assert state.handle == (state.id or spec.name)
    created, started, finished = moments(state)
    assert created is not None and started is not None and finished is None
    if subject.fake is None:  # the fake's clock is the test's, far from now
        assert before <= created <= started
    assert not state.never_started
    if subject.kind == SANDBOXED:
        assert state.runtime == "runsc"  # the engine's word: the suite ran under gVisor


async def test_a_job_that_exits_reports_its_code_and_times(subject: Subject) -> None:
    before = datetime.now(timezone.utc) - timedelta(seconds=5)

    state = await subject.exited(3)

    assert (state.status, state.exit_code, state.oom_killed, state.live) == (
        "exited", 3, False, False,
    )  # fmt: skip
    created, started, finished = moments(state)
    assert created is not None and started is not None and finished is not None
    assert created <= started <= finished
    if subject.fake is None:  # the fake's clock is the test's, far from now
        assert before <= created and finished <= datetime.now(timezone.utc)


async def test_env_workdir_and_argv_reach_the_job_as_given(subject: Subject) -> None:
    """The argv is the program's, word for word: no shell reads it on the way (one
    would run the command substitutions, expand the variable and the glob)."""
    words = ["$(echo pwned)", "; echo pwned", "`echo pwned`", "$HOME", "*", "two  words"]
    script = 'echo "greeting=$GREETING"; echo "cwd=$(pwd)"; printf "arg=%s\\n" "$@"'
    wanted = ["greeting=hello world", "cwd=/tmp", *(f"arg={word}" for word in words)]

    state = await subject.finished(
        ["/bin/sh", "-c", script, "job", *words],
        output=wanted,
        env={"GREETING": "hello world"},
        workdir="/tmp",
    )

    assert state.exit_code == 0
    assert texts(await log_text(subject.runtime, state.handle)) == wanted


async def test_a_command_that_is_no_program_ends_the_job_as_not_found(subject: Subject) -> None:
    """argv[0] is a program looked up in PATH, never a shell's builtin (`exit 0` would
    end the job well): the job starts, and ends as a shell's "not found" does."""
    state = await subject.no_program()

    assert (state.status, state.exit_code) == ("exited", subject.not_found_exit)
    assert not state.never_started


# The sandbox is left out: gVisor's own kernel (the sentry, tens of MiB) lives in the
# job's memory cgroup and takes the limit with the job's pages; what the engine then
# reads of an OOM kill varies (gVisor #2433, #10980), and no run here has shown it.
@pytest.mark.parametrize("subject", RUNTIMES, indirect=True)
async def test_a_job_over_its_memory_limit_is_oom_killed(subject: Subject) -> None:
    state = await subject.over_memory()

    if subject.enforces_memory_limit:
        said = subject.reports_oom
        assert (state.status, state.exit_code, state.oom_killed) == ("exited", 137, said)
    else:  # nothing bounds it: the job ran to its end and said how much it took
        assert (state.status, state.exit_code, state.oom_killed) == ("exited", 0, False)
        assert texts(await log_text(subject.runtime, state.handle)) == [str(64 * 2**20)]


async def test_a_name_in_use_running_or_exited_is_a_conflict(subject: Subject) -> None:
    running = await subject.sleeper()
    ended = await subject.exited(0)

    for spec in (running, replace(running, name=ended.name)):
        with pytest.raises(EngineConflict, match="already in use"):
            await subject.runtime.run(spec)
    assert (await subject.runtime.inspect(running.name)).status == "running"  # untouched


async def test_a_start_that_fails_leaves_no_container(subject: Subject) -> None:
    spec = subject.failing_start()

    with pytest.raises(EngineRefused):
        await subject.runtime.run(spec)

    assert await subject.runtime.inspect(spec.name) == ContainerState.missing(spec.name)
    assert spec.name not in {state.name for state in await subject.runtime.ps()}


async def test_a_missing_container_reads_missing_and_its_verbs_succeed(subject: Subject) -> None:
    name = container_name(unique("absent"))
    runtime = subject.runtime

    assert await runtime.inspect(name) == ContainerState.missing(name)
    assert await runtime.inspect_fresh(name) == ContainerState.missing(name)
    assert await runtime.logs(name, QUERY) is None
    assert await runtime.follow_logs(name, QUERY) is None
    await runtime.kill(name, "SIGTERM")
    await runtime.kill(name, "SIGKILL")
    await runtime.remove(name)
    assert await runtime.wait_exited(name, 1)
    assert await runtime.usage([name]) == {}


async def test_inspect_many_answers_each_name_in_order(subject: Subject) -> None:
    first, second = await subject.sleeper(), await subject.exited(0)
    absent = container_name(unique("absent"))

    states = await subject.runtime.inspect_many([second.name, absent, first.name])

    assert [state.name for state in states] == [second.name, absent, first.name]
    assert [state.status for state in states] == ["exited", "", "running"]
    assert states[1] == ContainerState.missing(absent)
    assert await subject.runtime.inspect_fresh(first.name) == states[2]


async def test_ps_lists_only_the_nodes_containers_exited_ones_included(subject: Subject) -> None:
    running, ended = await subject.sleeper(), await subject.exited(4)
    foreign = await subject.foreign()

    listed = {state.name: state for state in await subject.runtime.ps()}

    assert listed[running.name].status == "running"
    assert (listed[ended.name].status, listed[ended.name].exit_code) == ("exited", 4)
    assert listed[running.name].run_id == running.labels[LABEL_RUN_ID]
    assert foreign.name not in listed
    assert all(state.ours for state in listed.values())


# --- signals, waiting, removing ---------------------------------------------------------------


async def test_sigterm_reaches_the_job_and_its_exit_is_awaited(subject: Subject) -> None:
    spec = await subject.handling_sigterm(exit_code=42)

    await subject.runtime.kill(spec.name, "SIGTERM")

    assert await subject.runtime.wait_exited(spec.name, 10)
    state = await subject.runtime.inspect(spec.name)
    assert (state.status, state.exit_code) == ("exited", 42)


async def test_a_trapped_signal_reaches_the_job_which_runs_on(subject: Subject) -> None:
    """SIGUSR1, as a checkpoint request: the job's handler runs and the job goes on (on
    the process runtime the whole group gets it, the wrapper that records the exit code
    included, which must outlive it)."""
    spec = await subject.handling_sigterm(exit_code=42)
    await subject.runtime.kill(spec.name, "SIGUSR1")
    assert not await subject.runtime.wait_exited(spec.name, subject.quiet_s)
    if subject.fake is None:
        assert "got-usr1" in await log_text(subject.runtime, spec.name)
    await subject.runtime.kill(spec.name, "SIGTERM")
    assert await subject.runtime.wait_exited(spec.name, 10)
    assert (await subject.runtime.inspect(spec.name)).exit_code == 42


async def test_a_job_ignoring_sigterm_runs_on_until_sigkill(subject: Subject) -> None:
    spec = await subject.handling_sigterm(exit_code=None)

    await subject.runtime.kill(spec.name, "SIGTERM")
    assert not await subject.runtime.wait_exited(spec.name, subject.quiet_s)  # ignored
    assert (await subject.runtime.inspect(spec.name)).status == "running"

    await subject.runtime.kill(spec.name, "SIGKILL")
    assert await subject.runtime.wait_exited(spec.name, 10)
    assert (await subject.runtime.inspect(spec.name)).exit_code == 137
    await subject.runtime.kill(spec.name, "SIGKILL")  # not running any more: nothing to do
    assert (await subject.runtime.inspect(spec.name)).exit_code == 137


async def test_remove_takes_a_running_container_and_frees_its_name(subject: Subject) -> None:
    spec = await subject.sleeper()
    handle = (await subject.runtime.inspect(spec.name)).handle

    await subject.runtime.remove(handle)

    assert await subject.runtime.inspect(spec.name) == ContainerState.missing(spec.name)
    assert spec.name not in {state.name for state in await subject.runtime.ps()}
    await subject.runtime.run(spec)  # the name is free again
    assert (await subject.runtime.inspect(spec.name)).status == "running"


async def test_remove_kills_a_job_ignoring_sigterm_at_once(subject: Subject) -> None:
    """A forced remove is no stop: no grace period (libpod waited 10 s, its default)."""
    spec = await subject.handling_sigterm(exit_code=None)

    started = time.monotonic()
    await subject.runtime.remove(spec.name)

    # Behaviour, not speed: a grace would be 10 s (libpod's default); a loaded podman
    # takes seconds to remove a running job (3 s to stop one beside CI and two hogs).
    assert time.monotonic() - started < 9
    assert not (await subject.runtime.inspect(spec.name)).exists


# --- logs -----------------------------------------------------------------------------------


async def test_logs_hold_both_streams_each_line_after_its_time(subject: Subject) -> None:
    state = await subject.printed("to-stdout", "to-stderr")

    log = await log_text(subject.runtime, state.handle)

    assert sorted(texts(log)) == ["to-stderr", "to-stdout"]
    for line in log.splitlines():
        assert parse_rfc3339(line.split(" ", 1)[0]) is not None, line


async def test_logs_give_the_tail_within_the_byte_cap_and_since(subject: Subject) -> None:
    state = await subject.exited(0, "line1", "line2", "line3", "line4", "line5")
    runtime, ref = subject.runtime, state.handle
    future = datetime.now(timezone.utc) + timedelta(days=3650)

    tail = await runtime.logs(ref, LogQuery(tail=2, max_bytes=2**20))
    capped = await runtime.logs(ref, LogQuery(tail=5, max_bytes=10))
    later = await runtime.logs(ref, LogQuery(tail=5, max_bytes=2**20, since=future))

    assert tail is not None and texts(tail.text) == ["line4", "line5"]
    assert not tail.truncated
    assert capped is not None and capped.truncated
    assert len(capped.text.encode()) <= 10 and capped.text.endswith("line5\n")
    assert later is not None and later.text == ""


async def test_a_followed_log_gives_the_tail_then_each_line_as_the_job_writes_it(
    subject: Subject,
) -> None:
    spec = await subject.handling_sigterm(exit_code=42)  # it has written READY
    await subject.poked(spec)
    await subject.logged(spec, "got-usr1")

    stream = await subject.runtime.follow_logs(spec.name, LogQuery(tail=1, max_bytes=2**20))

    assert stream is not None
    lines = Lines(stream)
    try:
        assert await lines.next() == "got-usr1"  # the tail: READY is before it
        for _ in range(2):
            await subject.poked(spec)
            assert await lines.next() == "got-usr1"  # while the job runs on
        await subject.runtime.kill(spec.name, "SIGTERM")
        assert await lines.next() is None  # the follow ends with the job
    finally:
        await stream.aclose()
    assert (await subject.runtime.inspect(spec.name)).exit_code == 42


class Lines:
    """A followed log's lines, each without its time, one at a time (its chunks are cut
    anywhere)."""

    def __init__(self, stream: LogStream) -> None:
        self.chunks = aiter(stream)
        self.held = b""

    async def next(self) -> str | None:
        """The next line, or None once the stream has ended; a failure after 20 s."""
        while b"\n" not in self.held:
            try:
                self.held += await asyncio.wait_for(anext(self.chunks), 20)
            except StopAsyncIteration:
                assert not self.held, self.held
                return None
        line, _, self.held = self.held.partition(b"\n")
        return line.decode().split(" ", 1)[1]


async def test_a_followed_log_of_an_ended_job_gives_its_tail_and_ends(subject: Subject) -> None:
    state = await subject.exited(0, "line1", "line2", "line3")

    stream = await subject.runtime.follow_logs(state.handle, LogQuery(tail=2, max_bytes=1024))

    assert stream is not None
    try:
        chunks = [chunk async for chunk in stream]  # ends by itself: the job is over
    finally:
        await stream.aclose()
    assert texts(b"".join(chunks).decode()) == ["line2", "line3"]


# --- usage, holders, health, images ----------------------------------------------------------


async def test_usage_reads_only_running_containers(subject: Subject) -> None:
    running, ended = await subject.sleeper(), await subject.exited(0)
    handle = (await subject.runtime.inspect(running.name)).handle
    absent = container_name(unique("absent"))

    usage = await subject.runtime.usage([handle, ended.handle, absent])

    assert list(usage) == [handle]


async def test_a_process_in_no_container_is_held_by_none(subject: Subject) -> None:
    assert subject.runtime.holders_of([os.getpid()]) == {os.getpid(): None}


async def test_a_jobs_process_is_held_by_the_job_until_it_is_removed(subject: Subject) -> None:
    """What the GPU probe's pids are matched against: the job as the node acts on it."""
    spec, pid = await subject.holder()
    handle = (await subject.runtime.inspect(spec.name)).handle
    gone = 999_999_999  # above any pid_max: no process

    holders = subject.runtime.holders_of([pid, os.getpid(), gone])

    assert holders == {pid: handle, os.getpid(): None, gone: None}
    await subject.runtime.remove(handle)
    assert subject.runtime.holders_of([pid]) == {pid: None}  # its processes are gone


async def test_health_names_the_engine_and_its_version(subject: Subject) -> None:
    health = await subject.runtime.health()

    assert (health.ok, health.engine, health.error) == (True, subject.runtime.name, None)
    assert health.version


async def test_image_exists_only_for_images_on_the_engine(subject: Subject) -> None:
    assert await subject.runtime.image_exists(subject.image)
    assert await subject.runtime.image_exists(ABSENT_IMAGE) is not subject.has_images


async def test_image_info_is_the_id_its_containers_are_made_from(subject: Subject) -> None:
    info = await subject.runtime.image_info(subject.image)
    if not subject.has_images:
        assert info is None  # nothing the node could list or collect
        return
    assert info is not None and info.id.startswith("sha256:")
    assert info.size_bytes and info.size_bytes > 0
    assert any(name.endswith(subject.image) for name in info.names), info.names
    assert await subject.runtime.image_info(info.id) == info  # by id too
    assert await subject.runtime.image_info(ABSENT_IMAGE) is None

    spec = await subject.started(["sleep", "300"])
    assert (await subject.runtime.inspect(spec.name)).image_id == info.id


async def test_an_engine_that_cannot_be_asked_is_unavailable_never_missing(
    down: ContainerRuntime,
) -> None:
    name = container_name(unique("unknown"))

    health = await down.health()  # never raises

    assert health.ok is False and health.error
    verbs: list[Callable[[], Awaitable[object]]] = [
        lambda: down.inspect(name),
        lambda: down.logs(name, QUERY),
        lambda: down.kill(name, "SIGKILL"),
        lambda: down.remove(name),
    ]
    for verb in verbs:
        with pytest.raises(EngineUnavailable):
            await verb()
