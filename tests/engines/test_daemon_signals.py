"""Stops a training job can checkpoint in, on the real engines through the API: the
image's STOPSIGNAL and the launch's own, a signal without a stop, a warning before the
stop, the init that lets a shell entrypoint hear SIGTERM and reaps its zombies, a stop
that races the job's own end."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeNode
from tests.support.console import Console
from tests.support.engines import engine_settings
from tests.support.images import IMAGE
from tests.support.jobs import unique
from tests.support.nodes import storage_root
from tests.support.waiting import wait_until
from tuneplane_node.runtime.engines.docker import DockerRuntime
from tuneplane_node.runtime.engines.podman import PodmanRuntime

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]
READY = "ready-for-signals"


def trapping(*traps: str, then: str = "while true; do sleep 0.1; done") -> list[str]:
    """A shell job that traps these (``'echo got INT; exit 2' INT``), says it is ready,
    then runs on: a trap runs once the short sleep in hand ends."""
    script = "; ".join(f"trap {trap}" for trap in traps)
    return ["/bin/sh", "-c", f"{script}; echo {READY}; {then}"]


async def ready(node: Console, ref: str) -> None:
    deadline = time.monotonic() + 30
    while READY not in await node.logs(ref):
        assert time.monotonic() < deadline, await node.state(ref)
        await asyncio.sleep(0.05)


def sdk(engine: str) -> DockerRuntime | PodmanRuntime:
    settings = engine_settings(engine)
    return DockerRuntime(settings) if engine == "docker" else PodmanRuntime(settings)


@pytest.fixture
async def stopsignal_image(request: pytest.FixtureRequest) -> AsyncIterator[Callable[[str], str]]:
    """``image(engine)``: the test image with ``STOPSIGNAL SIGINT``, made on that engine
    for this test (a commit of a container of the test image) and removed after it."""
    made: list[tuple[DockerRuntime | PodmanRuntime, str]] = []

    def image(engine: str) -> str:
        return committed(engine, made, "stopsignal", conf={"StopSignal": "SIGINT"},
                         changes=["STOPSIGNAL SIGINT"])  # fmt: skip

    yield image
    await remove_images(made)


def committed(
    engine: str,
    made: list[tuple[DockerRuntime | PodmanRuntime, str]],
    kind: str,
    *,
    conf: dict[str, Any],
    changes: list[str],
) -> str:
    """The test image with docker's ``conf`` (podman's ``changes``, the same in
    Dockerfile words), committed on that engine; its id added to ``made``."""
    runtime = sdk(engine)
    # Fully qualified: the node hands the engine canonical names (docker.io/ added).
    name = f"docker.io/tuneplane-test/{kind}-{unique('img')}"
    container: Any
    if isinstance(runtime, DockerRuntime):
        container = runtime.client.containers.create(IMAGE, ["true"])
        image = container.commit(name, "1", conf=conf)
    else:
        container = runtime.client.containers.create(f"docker.io/{IMAGE}", ["true"])
        image = container.commit(repository=name, tag="1", changes=changes)
    container.remove()
    made.append((runtime, str(image.id)))
    return f"{name}:1"


async def remove_images(made: list[tuple[DockerRuntime | PodmanRuntime, str]]) -> None:
    for runtime, image_id in made:
        with contextlib.suppress(Exception):
            runtime.client.images.remove(image_id, force=True)
        await runtime.close()


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_images_stopsignal_stops_it_unasked_and_the_launchs_own_overrides_it(
    make_node: MakeNode, engine: str, stopsignal_image: Callable[[str], str]
) -> None:
    node = await make_node(engine)
    image = stopsignal_image(engine)
    job = trapping("'echo got INT; exit 2' INT", "'echo got USR2; exit 12' USR2",
                   "'echo got TERM; exit 15' TERM")  # fmt: skip
    by_image, _ = await node.launch(job, image=image)
    by_launch, _ = await node.launch(job, image=image, stop_signal="SIGUSR2")
    assert (await node.state(by_image))["stop_signal"] == "SIGINT"
    assert (await node.state(by_launch))["stop_signal"] == "SIGUSR2"
    for ref in (by_image, by_launch):
        await ready(node, ref)
        await node.stop(ref, timeout=20)
    assert (await node.state(by_image))["exit_code"] == 2
    assert "got INT" in await node.logs(by_image)
    assert (await node.state(by_launch))["exit_code"] == 12
    assert "got USR2" in await node.logs(by_launch)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_warned_job_that_checkpoints_and_exits_ends_with_its_own_code(
    make_node: MakeNode, engine: str, tmp_path: Path
) -> None:
    """The job writes its checkpoint to a mount on SIGUSR1 and exits 0: no SIGTERM."""
    node = await make_node(engine)
    save = "'echo saving > /ckpt/step; echo saved; exit 0' USR1"
    ckpt = storage_root(tmp_path)  # a mount comes from under a mount root
    ref, _ = await node.launch(
        trapping(save, "'echo got TERM; exit 15' TERM"), mounts=[[str(ckpt), "/ckpt"]]
    )
    await ready(node, ref)
    started = time.monotonic()
    await node.stop(ref, timeout=30, warn_signal="SIGUSR1", warn_s=30)
    # It ended by itself: no wait for warn_s (half of it: a loaded podman takes seconds).
    assert time.monotonic() - started < 15
    state = await node.state(ref)
    assert (state["status"], state["exit_code"]) == ("exited", 0)
    log = await node.logs(ref)
    assert "saved" in log and "got TERM" not in log
    assert (ckpt / "step").read_text() == "saving\n"


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_job_that_catches_no_warning_gets_its_stop_signal_without_it(
    make_node: MakeNode, engine: str
) -> None:
    """Issue 36, finding 5: SIGUSR1 to a job without a handler ended it at once (exit
    138), no SIGTERM, no grace. Now it gets its stop signal, and observe says why."""
    node = await make_node(engine)
    ref, _ = await node.launch(trapping("'echo got TERM; sleep 1; echo saved; exit 15' TERM"))
    await ready(node, ref)
    stop = asyncio.ensure_future(node.stop(ref, timeout=30, warn_signal="SIGUSR1", warn_s=60))
    seen: dict[str, Any] = {}
    while not stop.done() and "stopping" not in seen:
        seen = await node.state(ref)
    await stop
    assert seen["stopping"]["note"] == "warning skipped: not caught", seen
    state = await node.state(ref)
    assert (state["status"], state["exit_code"]) == ("exited", 15)  # its own TERM trap
    assert "saved" in await node.logs(ref)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_shell_job_ends_by_sigterm_at_once_with_the_init_and_is_killed_without(
    make_node: MakeNode, engine: str
) -> None:
    """``sh -c "sleep 300"``: as PID 1 the shell has no SIGTERM handler and ignores it,
    so without the init the job dies by SIGKILL once the grace period ends (3 s here,
    20 s in the issue: the same path), with it by SIGTERM at once.

    Each stop waits until the shell runs: a stop milliseconds after the start took the
    whole grace period once in CI (podman, under load), most likely a SIGTERM that came
    before the init had blocked its signals (the kernel drops a signal PID 1 has no
    handler for): a window of every engine's, which this test is not about."""
    shell = ["/bin/sh", "-c", "sleep 300"]
    with_init = await make_node(engine)
    ref, _ = await with_init.launch(shell)
    pid = await main_pid(engine, ref)
    await wait_until(lambda: "sleep 300" in commands_of(family(pid)))  # under the init
    started = time.monotonic()
    await with_init.stop(ref, timeout=20)
    # Well within the 20 s grace (the bound tells "at once" from "at its end"; podman took
    # 3.2 s to stop it beside CI and two CPU hogs), and by SIGTERM: 143, not SIGKILL's 137.
    assert time.monotonic() - started < 10
    assert (await with_init.state(ref))["exit_code"] == 143

    without = await make_node(engine, job_init=False)
    ref, _ = await without.launch(shell)
    pid = await main_pid(engine, ref)
    await wait_until(lambda: "sleep 300" in commands_of(family(pid)))  # the shell is up
    started = time.monotonic()
    await without.stop(ref, timeout=3)
    assert time.monotonic() - started >= 3
    assert (await without.state(ref))["exit_code"] == 137


def family(pid: int) -> list[dict[str, str]]:
    """The ``/proc/PID/status`` fields of ``pid`` and of its children (on this machine:
    the job's PID 1, and the orphans it took on), with its ``Cmdline``."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        with contextlib.suppress(OSError):
            fields = dict(
                line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
            )
            if fields.get("Pid") == str(pid) or fields.get("PPid") == str(pid):
                command = (status.parent / "cmdline").read_bytes()
                fields["Cmdline"] = command.rstrip(b"\0").replace(b"\0", b" ").decode()
                found.append(fields)
    return found


def commands_of(processes: list[dict[str, str]], *, zombies: bool = False) -> list[str]:
    """The command lines of the processes alive (or, with ``zombies``, of the zombies:
    a zombie has none, so those are all "")."""
    return [p["Cmdline"] for p in processes if p.get("State", "").startswith("Z") == zombies]


def zombies_of(pid: int) -> int:
    """Zombie processes whose parent is ``pid`` (on this machine: the job's PID 1)."""
    return len(commands_of([p for p in family(pid) if p["PPid"] == str(pid)], zombies=True))


async def main_pid(engine: str, ref: str) -> int:
    """The host pid of the job's PID 1, from the engine's inspect."""
    runtime = sdk(engine)
    try:
        document = await runtime.pool.call(runtime._document, ref)
        return int(document["State"]["Pid"])
    finally:
        await runtime.close()


def orphans_ended(pid: int) -> bool:
    commands = commands_of(family(pid))
    return "sleep 300" in commands and "sleep 2" not in commands


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_children_a_job_leaves_are_reaped_by_its_init(
    make_node: MakeNode, engine: str
) -> None:
    """Five orphans whose parent exits at once; the job's command then becomes a
    ``sleep``, which never waits for anyone. Without the init the orphans stay zombies
    of that PID 1; with it, the init reaps them."""
    # Each orphan outlives the loop (2 s): one that ended while the shell still ran the
    # loop was reaped by the shell's own wait (4 zombies, not 5, beside CI and two hogs).
    orphans = ["/bin/sh", "-c", 'for i in 1 2 3 4 5; do sh -c "sleep 2 &"; done; exec sleep 300']
    seen: dict[bool, int] = {}
    for init in (True, False):
        node = await make_node(engine, job_init=init)
        ref, _ = await node.launch(orphans)
        pid = await main_pid(engine, ref)
        # The orphans have ended: the command made all five, then became its `sleep`.
        await wait_until(lambda: orphans_ended(pid), timeout=30)  # noqa: B023
        deadline = time.monotonic() + 10  # an init reaps each a moment after its end
        while init and zombies_of(pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        seen[init] = zombies_of(pid)
        await node.remove(ref)
    assert seen == {True: 0, False: 5}


async def test_fifty_stops_in_their_warning_phase_hold_no_thread_and_health_stays_fast(
    make_node: MakeNode,
) -> None:
    """50 jobs that trap the warning and ignore SIGTERM, stopped with a 20 s warning
    phase: while they wait, health answers in milliseconds and a launch of another run
    runs within 2 s of its normal time, on 8 engine threads."""
    node = await make_node(runtime_threads=8)
    job = trapping("'echo warned' USR1", "'' TERM")
    refs: list[str] = []
    for _ in range(5):
        launched = await asyncio.gather(*(node.launch(job) for _ in range(10)))
        refs += [ref for ref, _ in launched]
    await asyncio.gather(*(ready(node, ref) for ref in refs))
    started = time.monotonic()
    await node.launch()
    normal = time.monotonic() - started

    plan: dict[str, Any] = {"warn_signal": "SIGUSR1", "warn_s": 20}
    stops = [asyncio.create_task(node.stop(ref, timeout=600, **plan)) for ref in refs]
    # Every warning out (50 stop requests reach the node in about a second, longer under
    # load); then the 50 stops wait out warn_s.
    states = await node.stopping(refs)
    assert {state["stopping"]["phase"] for state in states.values()} == {"warned"}
    took = []
    for _ in range(10):
        started = time.monotonic()
        await node.health()
        took.append(time.monotonic() - started)
    started = time.monotonic()
    _, answer = await node.launch()
    loaded = time.monotonic() - started

    assert answer["phase"] == "running"
    assert loaded < normal + 2, (normal, loaded)
    # A health call waiting on a held thread would wait for warn_s (20 s); a free one is
    # milliseconds (the figure is bench's), so a second tells them apart under any load.
    assert sorted(took)[5] < 1, took
    assert not any(stop.done() for stop in stops)
    await asyncio.gather(*(node.remove(ref) for ref in refs))
    assert await asyncio.wait_for(asyncio.gather(*stops), 30) == [{"ok": True}] * 50


STOP_RACES = int(os.environ.get("TUNEPLANE_STOP_RACES", "50"))
"""Rounds of the stop race per engine (about 0.5 s each on podman, 0.3 s on docker). Here
one round in ten meets podman's race, so 50 miss it 3 times in 1,000; issue 52 asked for
200 on each engine, run by hand with ``TUNEPLANE_STOP_RACES=200``."""


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_stop_that_races_the_jobs_own_end_is_done_every_time(
    make_node: MakeNode, engine: str
) -> None:
    """Issue 52: ``timeout: 0`` on podman raced a job's own end and answered ``502``
    ("container state improper: stopped"). Each round's job ends by itself a moment
    after its start, a moment that moves across the rounds, and is stopped at once: a
    stop that meets a job already gone is a stop done, ``200`` every round."""
    node = await make_node(engine)
    codes: list[int] = []
    for round_ in range(STOP_RACES):
        after = (round_ % 10) / 50  # 0 to 0.18 s: before, during and after the stop
        ref, _ = await node.launch(["/bin/sh", "-c", f"sleep {after}"])
        status, answer = await node.call("POST", "/node/v1/stop", json={"ref": ref, "timeout": 0})
        assert (status, answer) == (200, {"ok": True}), (round_, after)
        state = await node.wait_for(ref, "status", "exited")
        codes.append(state["exit_code"])
        await node.remove(ref)
    # Its own end (0), the stop's SIGKILL (137) or SIGTERM (143): the engine's word. Once
    # in a run of 50 rounds, beside CI and two CPU hogs, each engine said 2 for a job
    # stopped as it began (not the node's figure): shown if more, the answers held.
    expected = sum(code in (0, 137, 143) for code in codes)
    assert expected >= STOP_RACES - 2, sorted(set(codes))
