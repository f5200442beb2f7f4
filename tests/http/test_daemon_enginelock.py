"""One daemon per engine (issue 25, finding 4): the lock ``serve`` takes, its holder
named in the refusal, released by the kernel when its holder is SIGKILLed; and a
start-up sweep that leaves a launch in flight alone. On the real docker and podman."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import MakeFakeNode
from tests.fakes.clock import FakeClock
from tests.fakes.runtime import FakeRuntime
from tests.support.daemons import python_path
from tests.support.images import IMAGE
from tuneplane_node.daemon.enginelock import EngineLock, EngineTaken, engine_address
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import load_settings
from tuneplane_node.wire.values import LABEL_RUN_ID

# Slow: flocks held by real processes.
pytestmark = pytest.mark.slow

ADDRESS = "unix:///run/tuneplane-test/engine.sock"


def test_a_second_holder_is_refused_naming_the_first(tmp_path: Path) -> None:
    first = EngineLock.take(ADDRESS, node_id="3f0e-node", directory=tmp_path)
    with pytest.raises(EngineTaken) as refused:
        EngineLock.take(ADDRESS, node_id="other", directory=tmp_path)
    message = str(refused.value)
    assert message.startswith(
        f"another tuneplane-node daemon (pid {os.getpid()}, node id 3f0e-node) "
        f"manages the engine at {ADDRESS} (lock {first.path}): stop it first"
    )
    assert "\n" not in message
    EngineLock.take("unix:///another/engine.sock", node_id="x", directory=tmp_path).release()
    first.release()
    EngineLock.take(ADDRESS, node_id="other", directory=tmp_path).release()


def test_a_sigkilled_holder_never_holds_the_next_start_back(tmp_path: Path) -> None:
    holding = (
        "import sys, time; from tuneplane_node.daemon.enginelock import EngineLock; "
        f"EngineLock.take({ADDRESS!r}, node_id='killed', directory=__import__('pathlib')"
        f".Path({str(tmp_path)!r})); print('held', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", holding],
        stdout=subprocess.PIPE,
        env={"PYTHONPATH": python_path()},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(EngineTaken, match=rf"\(pid {holder.pid}, node id killed\)"):
            EngineLock.take(ADDRESS, node_id="next", directory=tmp_path)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    EngineLock.take(ADDRESS, node_id="next", directory=tmp_path).release()  # the kernel let go


def test_one_engine_is_one_address_however_spelt(tmp_path: Path) -> None:
    settings = load_settings(node_token="x" * 16, storage_root=tmp_path)
    spelt = [
        settings.model_copy(update={"podman_url": url})
        for url in (
            "unix:///run/podman/podman.sock",
            "http+unix:///run//podman/../podman/podman.sock",
        )
    ]
    assert {engine_address(s, "podman") for s in spelt} == {
        f"unix://{Path('/run/podman/podman.sock').resolve()}"
    }
    assert engine_address(settings, "process") is None


async def test_the_start_up_sweep_leaves_a_young_never_started_container(
    fake_node: MakeFakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    """Another daemon's launch between its create and its start is not wreckage yet."""

    def wreck(run_id: str) -> None:
        spec = ContainerSpec(name=f"tuneplane-{run_id}", image=IMAGE, labels={LABEL_RUN_ID: run_id})
        fake.create_outside(spec, start=False)

    wreck("old")
    clock.advance(120)  # past the periodic sweep's grace (TUNEPLANE_LOCAL_API_TIMEOUT, 60 s)
    wreck("in-flight")
    await fake_node()
    assert "tuneplane-in-flight" in fake.containers
    assert "tuneplane-old" not in fake.containers
