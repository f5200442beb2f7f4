"""Stops a training job can checkpoint in: the job's own stop signal, a warning signal
and the time it gives, and a signal sent without a stop. Over the in-memory engine,
whose containers end on a signal as a process would (their handlers, else 128 + the
signal's number); `test_daemon_signals.py` replays the same against docker and podman."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE, MakeFakeNode
from tests.fakes.runtime import FakeRuntime
from tests.support.waiting import wait_until
from tuneplane_node.errors import NotRunning
from tuneplane_node.jobs import Node, StopPlan
from tuneplane_node.jobs.nodestate import STATE_FILE, NodeStateFile
from tuneplane_node.jobs.words import NodeState
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.signals import engine_stop_signal, job_signal
from tuneplane_node.wire.values import DRAINING, LABEL_RUN_ID, Launch, container_name

MISSING = "registry.test/missing:1"


def request(run_id: str, *, image: str = IMAGE, stop_signal: str | None = None) -> Launch:
    spec = ContainerSpec(
        name=container_name(run_id),
        image=image,
        command=("/bin/train",),
        labels={LABEL_RUN_ID: run_id},
        stop_signal=stop_signal,
    )
    return Launch(run_id, 0, spec)


# --- the signal list ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "name"),
    [("SIGUSR1", "SIGUSR1"), ("usr1", "SIGUSR1"), (10, "SIGUSR1"), ("2", "SIGINT"),
     ("SIGKILL", None), (9, None), ("SIGSTOP", None), (19, None), (True, None), ("", None),
     ("SIGRTMIN+3", None), ("SIGTERM" * 3, None)],
)  # fmt: skip
def test_a_job_signal_is_one_a_job_can_catch(given: object, name: str | None) -> None:
    assert job_signal(given) == name


@pytest.mark.parametrize(
    ("recorded", "name"),
    [(None, "SIGTERM"), ("", "SIGTERM"), (15, "SIGTERM"), ("SIGINT", "SIGINT"),
     (2, "SIGINT"), (34, "SIGRTMIN"), ("SIGRTMIN+3", "SIGRTMIN+3")],
)  # fmt: skip
def test_an_engines_record_of_the_stop_signal_reads_as_a_name(recorded: object, name: str) -> None:
    """docker records a name or nothing (SIGTERM then), libpod a number."""
    assert engine_stop_signal(recorded) == name


# --- the job's own stop signal ----------------------------------------------------------


async def test_a_stop_sends_the_images_stopsignal_unasked(node: Node, fake: FakeRuntime) -> None:
    fake.stop_signals[IMAGE] = "SIGINT"
    await node.jobs.launch(request("r1"))
    assert (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"].stop_signal == "SIGINT"  # type: ignore[union-attr]
    await node.jobs.stop("tuneplane-r1", StopPlan(grace=5))
    assert fake.signals == [("tuneplane-r1", "SIGINT")]
    assert fake.containers["tuneplane-r1"].exit_code == 130  # 128 + 2: ended by it


async def test_the_launchs_stop_signal_overrides_the_images_and_a_stops_overrides_both(
    node: Node, fake: FakeRuntime
) -> None:
    fake.stop_signals[IMAGE] = "SIGINT"
    await node.jobs.launch(request("r1", stop_signal="SIGUSR2"))
    await node.jobs.launch(request("r2", stop_signal="SIGUSR2"))
    await node.jobs.stop("tuneplane-r1", StopPlan(grace=5))
    await node.jobs.stop("tuneplane-r2", StopPlan(grace=5, signal="SIGQUIT"))
    assert fake.signals == [("tuneplane-r1", "SIGUSR2"), ("tuneplane-r2", "SIGQUIT")]


# --- a warning first --------------------------------------------------------------------


async def test_a_job_that_checkpoints_on_the_warning_ends_with_its_own_code(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.containers["tuneplane-r1"].handlers["SIGUSR1"] = 0  # checkpoints, exits 0
    await node.jobs.stop("tuneplane-r1", StopPlan(grace=5, warn_signal="SIGUSR1", warn_s=5))
    assert fake.signals == [("tuneplane-r1", "SIGUSR1")]  # no SIGTERM ever
    assert fake.containers["tuneplane-r1"].exit_code == 0


async def test_a_job_that_catches_no_warning_gets_its_stop_without_one(
    node: Node, fake: FakeRuntime
) -> None:
    """Issue 36, finding 5: SIGUSR1 ended a job without a handler at once (exit 138): no
    SIGTERM, no grace, nothing saved."""
    ref = await catching_nothing(node, fake)
    await node.jobs.stop(ref, StopPlan(grace=5, warn_signal="SIGUSR1", warn_s=120))
    assert (fake.signals, fake.containers[ref].exit_code) == ([(ref, "SIGTERM")], 143)


async def catching_nothing(node: Node, fake: FakeRuntime) -> str:
    """A running job none of whose processes has a handler for a warning signal."""
    await node.jobs.launch(request("r1"))
    fake.caught["tuneplane-r1"] = False
    return "tuneplane-r1"


@pytest.mark.slow
async def test_observe_says_the_warning_was_skipped_while_the_stop_goes_on(
    node: Node, fake: FakeRuntime
) -> None:
    fake.containers[await catching_nothing(node, fake)].ignores_sigterm = True
    plan = StopPlan(grace=0.5, warn_signal="SIGUSR1", warn_s=120)
    stopping = asyncio.create_task(node.jobs.stop("tuneplane-r1", plan))
    while not fake.signals:
        await asyncio.sleep(0.01)
    view: Any = (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"]
    assert (view.stopping.phase, view.stopping.note) == ("signalled", "warning skipped: not caught")
    await stopping
    assert fake.signals == [("tuneplane-r1", "SIGTERM"), ("tuneplane-r1", "SIGKILL")]


@pytest.mark.slow
async def test_a_job_deaf_to_the_warning_gets_its_stop_signal_after_warn_s_then_sigkill(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    container = fake.containers["tuneplane-r1"]
    container.handlers["SIGUSR1"] = None  # traps it, runs on
    container.ignores_sigterm = True
    phases: list[Any] = []

    async def watch() -> None:
        while container.status == "running":
            view = (await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"]
            phases.append(getattr(view, "stopping", None) and view.stopping.phase)  # type: ignore[union-attr]
            await asyncio.sleep(0.01)

    watching = asyncio.create_task(watch())
    plan = StopPlan(grace=0.1, warn_signal="SIGUSR1", warn_s=0.1)
    await node.jobs.stop("tuneplane-r1", plan)
    await watching

    assert fake.signals == [
        ("tuneplane-r1", "SIGUSR1"),
        ("tuneplane-r1", "SIGTERM"),
        ("tuneplane-r1", "SIGKILL"),
    ]
    assert container.exit_code == 137
    assert phases[0] == "warned" and phases[-1] == "signalled"  # in that order, no other
    assert set(phases) == {"warned", "signalled"}
    assert not hasattr((await node.jobs.observe(["tuneplane-r1"]))["tuneplane-r1"], "stopping")


@pytest.mark.slow
async def test_a_warning_without_its_time_waits_as_long_as_the_grace_period(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.containers["tuneplane-r1"].handlers["SIGUSR1"] = None
    started = asyncio.get_running_loop().time()
    await node.jobs.stop("tuneplane-r1", StopPlan(grace=0.1, warn_signal="SIGUSR1"))
    assert asyncio.get_running_loop().time() - started >= 0.1
    assert fake.signals == [("tuneplane-r1", "SIGUSR1"), ("tuneplane-r1", "SIGTERM")]
    assert fake.containers["tuneplane-r1"].exit_code == 143


@pytest.mark.slow
async def test_a_job_replaced_during_the_warning_gets_no_stop_signal(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("r1"))
    fake.containers["tuneplane-r1"].handlers["SIGUSR1"] = None
    plan = StopPlan(grace=5, warn_signal="SIGUSR1", warn_s=0.3)
    stopping = asyncio.create_task(node.jobs.stop("tuneplane-r1", plan))
    await wait_until(lambda: fake.signals)  # the warning is sent
    await node.jobs.remove("tuneplane-r1")
    await node.jobs.launch(request("r1"))  # relaunched while the first stop waited
    await stopping
    assert fake.containers["tuneplane-r1"].status == "running"
    assert fake.signals == [("tuneplane-r1", "SIGUSR1")]


# --- a signal without a stop ------------------------------------------------------------


async def test_a_signal_reaches_a_running_job_which_goes_on(node: Node, fake: FakeRuntime) -> None:
    await node.jobs.launch(request("r1"))
    fake.containers["tuneplane-r1"].handlers["SIGUSR1"] = None
    await node.jobs.signal("tuneplane-r1", "SIGUSR1")
    assert fake.signals == [("tuneplane-r1", "SIGUSR1")]
    assert fake.containers["tuneplane-r1"].status == "running"


async def test_a_signal_for_a_job_not_running_or_pending_is_refused_and_sends_nothing(
    node: Node, fake: FakeRuntime
) -> None:
    await node.jobs.launch(request("done"))
    await node.jobs.stop("tuneplane-done", StopPlan(grace=1))
    await node.jobs.launch(request("pulling", image=MISSING))
    await fake.pulling.wait()
    sent = len(fake.signals)
    for ref, said in [
        ("tuneplane-done", "(exited)"),
        ("tuneplane-pulling", "(a pending launch (pulling))"),
        ("tuneplane-nobody", "(missing)"),
    ]:
        with pytest.raises(NotRunning) as refused:
            await node.jobs.signal(ref, "SIGUSR1")
        assert refused.value.status == 409 and said in refused.value.message
    assert len(fake.signals) == sent


async def test_a_job_ending_by_itself_as_the_signal_goes_out_is_stopped_but_not_signalled(
    node: Node, fake: FakeRuntime
) -> None:
    """Issue 52: the node read the job running, and it ended as the signal went out, the
    engine finding it stopped (podman's "container state improper: stopped", a 502). A
    stop is done, the job's own exit code kept; a signal sent nothing: the documented
    409, saying the job's status as it is now."""
    for run_id in ("stopped", "signalled"):
        await node.jobs.launch(request(run_id))
        fake.ending[container_name(run_id)] = 3
    await node.jobs.stop("tuneplane-stopped", StopPlan(grace=0))
    with pytest.raises(NotRunning, match=r"is not running \(exited\)"):
        await node.jobs.signal("tuneplane-signalled", "SIGUSR1")
    assert fake.signals == []
    assert {fake.containers[name].exit_code for name in fake.containers} == {3}


# --- over HTTP --------------------------------------------------------------------------


async def test_the_signal_verb_and_the_stops_fields_over_http(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    ref, _ = await node.launch(["/bin/train"], image=IMAGE, run_id="r1", stop_signal="SIGUSR2")
    assert (await node.state(ref))["stop_signal"] == "SIGUSR2"
    fake.containers[ref].handlers["SIGUSR1"] = None
    assert await node.signal(ref, "SIGUSR1") == (200, {"ok": True})
    assert await node.signal(ref, 10) == (200, {"ok": True})  # its number
    assert fake.containers[ref].status == "running"
    fake.containers[ref].handlers["SIGHUP"] = 0
    await node.stop(ref, 5, warn_signal="SIGHUP", warn_s=5)
    state = await node.state(ref)
    assert (state["status"], state["exit_code"]) == ("exited", 0)
    status, answer = await node.signal(ref, "SIGUSR1")
    assert status == 409 and "is not running (exited)" in answer["detail"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/node/v1/signal", {"ref": "tuneplane-r1"}, "signal"),
        ("/node/v1/signal", {"ref": "tuneplane-r1", "signal": "SIGKILL"}, "signal"),
        ("/node/v1/signal", {"ref": "tuneplane-r1", "signal": 19}, "signal"),
        ("/node/v1/signal", {"ref": "tuneplane-r1", "signal": "usr1"}, "signal"),
        ("/node/v1/signal", {"signal": "SIGUSR1"}, "ref"),
        ("/node/v1/stop", {"ref": "tuneplane-r1", "signal": "SIGSTOP"}, "signal"),
        ("/node/v1/stop", {"ref": "tuneplane-r1", "warn_signal": "SIGKILL"}, "warn_signal"),
        ("/node/v1/stop", {"ref": "tuneplane-r1", "warn_s": 5}, "warn_s"),
        ("/node/v1/stop", {"ref": "r", "warn_signal": "SIGUSR1", "warn_s": -1}, "warn_s"),
        ("/node/v1/drain", {"warn_signal": "SIGUSR1", "warn_s": 10**9}, "warn_s"),
        ("/node/v1/drain", {"warn_signal": True}, "warn_signal"),
    ],
)
async def test_a_bad_signal_field_is_a_422_naming_it_and_nothing_is_sent(
    fake_node: MakeFakeNode, fake: FakeRuntime, path: str, body: dict[str, Any], field: str
) -> None:
    node = await fake_node()
    await node.launch(["/bin/train"], image=IMAGE, run_id="r1")
    status, answer = await node.call("POST", path, json=body)
    assert status == 422 and answer["detail"].startswith(f"{field}:"), answer
    assert fake.signals == []
    assert (await node.health())["node_state"][
        "state"
    ] == "ready"  # a refused drain changed nothing


async def test_a_bad_stop_signal_in_a_launch_is_a_422_naming_it(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    _, answer = await node.launch(
        ["/bin/train"], image=IMAGE, run_id="r1", stop_signal="SIGKILL", expect=422
    )
    assert answer["detail"].startswith("container.stop_signal:")
    assert fake.containers == {}
    ref, _ = await node.launch(
        ["/bin/train"], image=IMAGE, run_id="r2", stop_signal=""
    )  # 0.3.15's empty
    assert (await node.state(ref))["stop_signal"] == "SIGTERM"


async def test_a_drain_warns_every_job_first(fake_node: MakeFakeNode, fake: FakeRuntime) -> None:
    node = await fake_node()
    ref, _ = await node.launch(["/bin/train"], image=IMAGE, run_id="r1")
    fake.containers[ref].handlers["SIGUSR1"] = 0
    await node.ok("POST", "/node/v1/drain", json={"warn_signal": "SIGUSR1", "warn_s": 5})
    await node.wait_for(ref, "status", "exited", timeout=10)
    assert fake.signals == [(ref, "SIGUSR1")]
    assert (await node.state(ref))["exit_code"] == 0


def test_a_drains_warning_is_kept_on_disk_for_a_drain_resumed_after_a_restart(
    tmp_path: Path,
) -> None:
    draining = NodeState(DRAINING, "kernel", grace_s=30, warn_signal="SIGUSR1", warn_s=120)
    NodeStateFile(tmp_path).save(draining)
    assert NodeStateFile(tmp_path).load("now") == draining
    (tmp_path / STATE_FILE).write_text('{"state": "draining", "warn_signal": "SIGKILL"}')
    assert NodeStateFile(tmp_path).load("now").warn_signal is None  # never one it cannot send
