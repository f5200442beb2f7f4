"""Cordon, drain and uncordon through the daemon, in front of the in-memory engine: what
an operator sees, and what a restart keeps (the operator's decision, never undone)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from tests.conftest import IMAGE, MakeFakeNode, fake_settings
from tests.fakes.clock import FakeClock
from tests.fakes.runtime import FakeRuntime
from tests.support.console import Console
from tests.support.console import console_0315 as console_launch
from tests.support.waiting import settle
from tuneplane_node.clock import parse_rfc3339
from tuneplane_node.daemon.app import create_node_app
from tuneplane_node.daemon.state import HEALTH_STATUS
from tuneplane_node.jobs.drain import DRAIN_AGAIN_S
from tuneplane_node.jobs.nodestate import NodeStateFile
from tuneplane_node.jobs.words import NodeState

# Slow: cordon, drain and their file end to end over a real socket.
pytestmark = pytest.mark.slow

MISSING = "registry.test/missing:1"
STATE_FILE = "state/node-state.json"


async def test_cordon_refuses_new_launches_with_the_reason_and_nothing_else(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    await node.ok("POST", "/node/v1/launch", json=spec("r-run"))
    await node.ok("POST", "/node/v1/launch", json=spec("r-pull", image=MISSING))

    answer = await node.ok("POST", "/node/v1/cordon", json={"reason": "disk swap"})
    assert (answer["state"], answer["reason"]) == ("cordoned", "disk swap")
    assert parse_rfc3339(answer["since"]) is not None

    status, refused = await node.call("POST", "/node/v1/launch", json=spec("r-new"))
    assert status == 409
    assert refused == {
        "detail": "the node is cordoned and takes no new launches: disk swap",
        "code": "cordoned",
    }
    assert "tuneplane-r-new" not in fake.containers
    # The runs already there answer as before, and every other verb goes on.
    again = await node.ok("POST", "/node/v1/launch", json=spec("r-run"))
    assert again == {
        "phase": "running",
        "idempotent": True,
        "gpus": [0, 1],
        "ref": "tuneplane-r-run",
    }
    pending = await node.ok("POST", "/node/v1/launch", json=spec("r-pull", image=MISSING))
    assert pending == {
        "phase": "pulling",
        "idempotent": True,
        "image": MISSING,
        "ref": "tuneplane-r-pull",
    }
    assert await node.stop("tuneplane-r-run", timeout=1) == {"ok": True}
    assert (await node.state("tuneplane-r-run"))["status"] == "exited"
    assert await node.remove("tuneplane-r-pull") == {"ok": True}
    health = await node.health()
    assert health["ok"] is True
    assert health["node_state"] == answer
    inventory = await node.ok("GET", "/node/v1/inventory")
    assert inventory["node_state"] == answer

    ready = await node.ok("POST", "/node/v1/uncordon", json={})
    assert (ready["state"], ready["reason"]) == ("ready", None)
    launched = await node.ok("POST", "/node/v1/launch", json=spec("r-new"))
    assert launched["phase"] == "running"


async def test_a_relaunch_of_an_exited_run_on_a_cordoned_node_keeps_its_container(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    await node.ok("POST", "/node/v1/launch", json=spec("r-1"))
    fake.exit("tuneplane-r-1", 3)
    await node.ok("POST", "/node/v1/cordon", json={"reason": "maintenance"})

    status, _ = await node.call("POST", "/node/v1/launch", json=spec("r-1"))
    assert status == 409
    state = await node.state("tuneplane-r-1")
    assert (state["status"], state["exit_code"]) == ("exited", 3)  # nothing lost


async def test_a_cordon_survives_a_restart(
    fake_node: MakeFakeNode, fake: FakeRuntime, tmp_path: Path
) -> None:
    node = await fake_node()
    cordoned = await node.ok("POST", "/node/v1/cordon", json={"reason": "bad fan"})
    await node.client.close()  # the daemon stops

    saved = json.loads((tmp_path / STATE_FILE).read_text())
    assert (saved["state"], saved["reason"]) == ("cordoned", "bad fan")
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["node-state.json"]  # no temp

    again = await fake_node()
    assert (await again.health())["node_state"] == cordoned
    status, _ = await again.call("POST", "/node/v1/launch", json=spec("r-1"))
    assert status == 409


@pytest.mark.parametrize("content", [b"{not json", b'{"state": "sleepy"}', b"[]"])
async def test_a_node_state_file_that_cannot_be_read_starts_cordoned_saying_why(
    fake_node: MakeFakeNode, tmp_path: Path, content: bytes
) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / STATE_FILE).write_bytes(content)
    node = await fake_node()

    state = (await node.health())["node_state"]
    assert state["state"] == "cordoned"
    assert state["reason"].startswith(f"{tmp_path / STATE_FILE} is not a valid node state")
    status, refused = await node.call("POST", "/node/v1/launch", json=spec("r-1"))
    assert status == 409 and "is not a valid node state" in refused["detail"]
    assert (await node.ok("POST", "/node/v1/uncordon"))["state"] == "ready"  # no body at all


async def test_drain_stops_every_job_within_its_grace_and_observe_says_why(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    await node.ok("POST", "/node/v1/launch", json=spec("r-polite", 1))
    await node.ok("POST", "/node/v1/launch", json=spec("r-stubborn", 1))
    fake.containers["tuneplane-r-stubborn"].ignores_sigterm = True
    await node.ok("POST", "/node/v1/launch", json=spec("r-pull", image=MISSING))
    await fake.pulling.wait()

    answer = await node.ok("POST", "/node/v1/drain", json={"reason": "kernel", "grace_s": 0.2})
    assert (answer["state"], answer["reason"]) == ("draining", "kernel")
    status, refused = await node.call("POST", "/node/v1/launch", json=spec("r-new"))
    assert status == 409 and refused["detail"].startswith("the node is draining")

    await drained(node, fake.clock)
    states = await node.observe("tuneplane-r-polite", "tuneplane-r-stubborn", "tuneplane-r-pull")
    assert states["tuneplane-r-polite"]["exit_code"] == 143  # SIGTERM was enough
    assert states["tuneplane-r-stubborn"]["exit_code"] == 137  # SIGKILL after the grace
    for ref in ("tuneplane-r-polite", "tuneplane-r-stubborn"):
        assert states[ref]["stop_reason"] == "drain: kernel"
    assert states["tuneplane-r-pull"]["exists"] is False  # the pull was cancelled
    health = await node.health()
    assert (health["gpus_free"], health["gpus_reserved"]) == (4, 0)
    assert health["node_state"]["reason"] == "kernel"


async def test_a_job_stopped_by_its_console_has_no_stop_reason(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    await node.ok("POST", "/node/v1/launch", json=spec("r-1"))
    await node.stop("tuneplane-r-1", timeout=1)
    assert "stop_reason" not in await node.state("tuneplane-r-1")


async def test_a_drain_goes_on_after_a_restart_and_the_stop_reason_stays(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await draining_a_stubborn_job(await fake_node(), fake, "reboot")
    await node.client.close()  # the daemon stops mid-drain: the job still runs

    fake.containers["tuneplane-r-1"].ignores_sigterm = False  # it listens this time
    again = await fake_node()
    await drained(again, fake.clock)
    state = await again.state("tuneplane-r-1")
    assert (state["exit_code"], state["stop_reason"]) == (143, "drain: reboot")


async def test_uncordon_ends_a_drain_and_takes_launches_again(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await draining_a_stubborn_job(await fake_node(), fake, "oops")

    assert (await node.ok("POST", "/node/v1/uncordon", json={}))["state"] == "ready"
    await settle()
    assert (await node.state("tuneplane-r-1"))["status"] == "running"  # no SIGKILL came
    assert (await node.ok("POST", "/node/v1/launch", json=spec("r-2")))["phase"] == ("running")


async def test_cordon_of_a_draining_node_keeps_it_draining(fake_node: MakeFakeNode) -> None:
    node = await fake_node()
    await node.ok("POST", "/node/v1/drain", json={"reason": "a"})
    await until(lambda: _state_of(node), "drained")
    answer = await node.ok("POST", "/node/v1/cordon", json={"reason": "b"})
    assert (answer["state"], answer["reason"]) == ("drained", "a")


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/node/v1/cordon", {"reason": 7}, "reason"),
        ("/node/v1/cordon", {"reason": "x" * 1025}, "reason"),
        ("/node/v1/drain", {"reason": "x", "grace_s": -1}, "grace_s"),
        ("/node/v1/drain", {"reason": "x", "grace_s": "soon"}, "grace_s"),
        ("/node/v1/drain", {"reason": "x", "grace_s": 1e300}, "grace_s"),
    ],
)
async def test_bad_cordon_and_drain_bodies_are_422s_naming_the_field(
    fake_node: MakeFakeNode, tmp_path: Path, path: str, body: dict[str, Any], field: str
) -> None:
    node = await fake_node()
    status, answer = await node.call("POST", path, json=body)
    assert status == 422 and answer["detail"].startswith(f"{field}: ")
    assert (await node.health())["node_state"]["state"] == "ready"  # nothing changed
    assert not (tmp_path / STATE_FILE).exists()


async def draining_a_stubborn_job(node: Any, fake: FakeRuntime, reason: str) -> Any:
    """The node drains, with a long grace, a job that ignored its SIGTERM."""
    await node.ok("POST", "/node/v1/launch", json=spec("r-1"))
    fake.containers["tuneplane-r-1"].ignores_sigterm = True
    await node.ok("POST", "/node/v1/drain", json={"reason": reason, "grace_s": 3600})
    await until(lambda: _signals(fake), [("tuneplane-r-1", "SIGTERM")])
    return node


def spec(run_id: str, gpus: int = 2, image: str = IMAGE) -> dict[str, Any]:
    return console_launch(run_id, gpus, image=image)


async def until(read: Callable[[], Awaitable[object]], wanted: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while (got := await read()) != wanted:
        assert time.monotonic() < deadline, f"still {got!r}, never {wanted!r}"
        await asyncio.sleep(0.02)


async def drained(node: Console, clock: FakeClock, timeout: float = 10) -> None:
    """Until the node says drained, moving the clock past each wait of the drain (a
    grace, a pause) in steps shorter than a grace: each request first lets the cache
    take every event, so a job that obeys its SIGTERM is seen to exit before its grace
    can pass."""
    deadline = time.monotonic() + timeout
    while (state := await _state_of(node)) != "drained":
        assert time.monotonic() < deadline, f"still {state!r}, never drained"
        clock.advance(DRAIN_AGAIN_S)


async def _state_of(node: Any) -> str:
    return (await node.health())["node_state"]["state"]  # type: ignore[no-any-return]


async def _signals(fake: FakeRuntime) -> list[tuple[str, str]]:
    return fake.signals


def test_an_older_state_written_late_never_replaces_a_newer_one(tmp_path: Path) -> None:
    """A cancelled drain's thread may still be writing when an uncordon saves."""
    state_file = NodeStateFile(tmp_path)
    state_file.save(NodeState(state="ready"), sequence=2)
    state_file.save(NodeState(state="draining", reason="late"), sequence=1)
    assert state_file.load("now").state == "ready"


async def test_removing_a_drained_job_forgets_why_it_stopped(
    fake_node: MakeFakeNode, fake: FakeRuntime, tmp_path: Path
) -> None:
    node = await fake_node()
    await node.ok("POST", "/node/v1/launch", json=spec("r-1"))
    await node.ok("POST", "/node/v1/drain", json={"reason": "fan", "grace_s": 1})
    await drained(node, fake.clock)
    assert (await node.state("tuneplane-r-1"))["stop_reason"] == "drain: fan"

    await node.remove("tuneplane-r-1")
    assert json.loads((tmp_path / STATE_FILE).read_text())["stop_reasons"] == {}


async def test_on_the_process_runtime_a_relaunch_does_not_inherit_a_stop_reason(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    """The process runtime has no container ids: the reason is kept by name, and goes
    when the job it belongs to is removed (here by the relaunch of its run)."""
    settings = fake_settings(tmp_path, local_runtime="process", local_gpu_count=0)
    node = Console(await aiohttp_client(create_node_app(settings)))
    launch = console_launch("p-1", 0, image="none", command=["/bin/sleep", "300"])
    await node.ok("POST", "/node/v1/launch", json=launch)
    await node.ok("POST", "/node/v1/drain", json={"reason": "fan", "grace_s": 1})
    await until(lambda: _state_of(node), "drained", timeout=30)
    stopped = await node.state("tuneplane-p-1")
    assert (stopped["status"], stopped["stop_reason"]) == ("exited", "drain: fan")

    await node.ok("POST", "/node/v1/uncordon")
    await node.ok("POST", "/node/v1/launch", json=launch)
    again = await node.state("tuneplane-p-1")
    assert again["status"] == "running" and "stop_reason" not in again
    await node.remove("tuneplane-p-1")


@pytest.fixture
def full_state_dir(tmp_path: Path) -> Iterator[Path]:
    """The state directory on a tmpfs of its own, 16 KiB, filled by the test."""
    directory = tmp_path / "state"
    directory.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(directory)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"mounting a small tmpfs needs root: {mounted.stderr.decode().strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)


async def test_a_full_state_directory_is_a_507_saying_so_and_leaves_no_temporary_file(
    fake_node: MakeFakeNode, full_state_dir: Path
) -> None:
    """Finding 16 of issue 25: a full disk left a 0-byte temporary file and answered 500."""
    node = await fake_node()
    with (
        (full_state_dir / "filler").open("wb", buffering=0) as filler,
        contextlib.suppress(OSError),
    ):
        while True:
            filler.write(b"x" * 1024)

    status, refused = await node.call("POST", "/node/v1/cordon", json={"reason": "bad fan"})
    assert status == 507, refused
    assert refused["detail"] == (
        f"the node is cordoned now, but {full_state_dir / 'node-state.json'} could not be "
        "written (No space left on device): a restart would not keep it; free space on that "
        "disk and ask again"
    )
    assert sorted(p.name for p in full_state_dir.iterdir()) == ["filler"]  # no temporary file
    assert (await node.health())["node_state"]["state"] == "cordoned"  # in force all the same

    (full_state_dir / "filler").unlink()
    assert (await node.ok("POST", "/node/v1/cordon", json={"reason": "bad fan"}))["reason"]
    assert json.loads((full_state_dir / "node-state.json").read_text())["state"] == "cordoned"


async def test_a_change_answered_ends_the_sharing_of_healths_status(
    fake_node: MakeFakeNode,
) -> None:
    """The health requests of one turn of the loop share one status; a change answered
    in that turn ends it, so the next is made after the change: on one connection a
    health request pipelined after a cordon runs in the cordon's turn when the cordon
    never waited (Python 3.12's eager tasks)."""
    node = await fake_node()
    shared = node.app[HEALTH_STATUS]
    await shared.get()
    await asyncio.sleep(0.01)  # its readings made: the status is made without a wait
    first = await shared.get()
    answers = [("GET", "/node/v1/health", True), ("POST", "/node/v1/observe", True)]
    answers.append(("POST", "/node/v1/cordon", False))
    for method, path, kept in answers:  # no await here suspends: all in one turn
        answered = make_mocked_request(method, path, app=node.app)
        await node.app.on_response_prepare.send(answered, web.Response())
        assert (await shared.get() is first) is kept, path
