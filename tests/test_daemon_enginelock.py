"""One daemon per engine (issue 25, finding 4): the lock ``serve`` takes, its holder
named in the refusal, released by the kernel when its holder is SIGKILLed; and a
start-up sweep that leaves a launch in flight alone. On the real docker and podman."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import MakeFakeNode
from tests.fakes import FakeClock, FakeRuntime
from tests.helpers import (
    HEADERS,
    IMAGE,
    docker_host,
    engine_missing,
    free_port,
    podman_url,
    python_path,
    spawn_daemon,
)
from tuneplane_node.daemon.enginelock import EngineLock, EngineTaken, engine_address
from tuneplane_node.runtime.base import LABEL_RUN_ID
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import load_settings

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


# --- two daemons on one real engine -------------------------------------------------------


def engine_settings_of(engine: str) -> dict[str, str]:
    settings = {
        "TUNEPLANE_LOCAL_RUNTIME": engine,
        "TUNEPLANE_LOCAL_GPU_COUNT": "0",
        "TUNEPLANE_DEV_SHARED_ENGINE": "false",  # the rule itself, as in production
    }
    if engine == "docker":
        settings["TUNEPLANE_DOCKER_HOST"] = str(docker_host())
    else:
        settings["TUNEPLANE_PODMAN_URL"] = podman_url()
    return settings


def healthy(port: int, process: subprocess.Popen[bytes], log: Path) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, log.read_text()
        try:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/node/v1/health", headers=HEADERS
            )
            with urllib.request.urlopen(request, timeout=5) as answer:
                health: dict[str, object] = json.loads(answer.read())
                if health["ok"]:
                    return health
        except OSError:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


@pytest.mark.engine
@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_a_second_daemon_on_one_engine_refuses_until_the_first_is_killed(
    tmp_path: Path, engine: str
) -> None:
    settings = engine_settings_of(engine)
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    port = free_port()
    first = spawn_daemon(first_dir, port, settings_of=settings)
    try:
        try:
            healthy(port, first, first_dir / "serve.log")
        except AssertionError:
            engine_missing(engine, (first_dir / "serve.log").read_text()[-300:])
        node_id = (first_dir / "state" / "node-id").read_text().strip()
        second = spawn_daemon(second_dir, free_port(), settings_of=settings)
        assert second.wait(timeout=60) == 1
        lines = (second_dir / "serve.log").read_text().splitlines()
        refusal = [line for line in lines if "another tuneplane-node daemon" in line]
        assert len(refusal) == 1 and "Traceback" not in "\n".join(lines), lines
        assert f"(pid {first.pid}, node id {node_id}) manages the engine at unix://" in refusal[0]
        assert not any("node ready" in line for line in lines), lines
        # The rule is serve's: check and inventory work beside the running daemon.
        for verb in ("inventory", "check"):
            done = subprocess.run(
                [sys.executable, "-m", "tuneplane_node", verb],
                env={"PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin", **settings,
                     "TUNEPLANE_NODE_TOKEN": "x" * 32, "TUNEPLANE_NODE_PORT": str(free_port()),
                     "TUNEPLANE_NODE_STATE_DIR": str(second_dir / "state")},
                capture_output=True, text=True, timeout=120, cwd=second_dir,
            )  # fmt: skip
            assert "another tuneplane-node daemon" not in done.stdout + done.stderr
            assert verb == "check" or done.returncode == 0, done.stderr
            if verb == "check":
                assert f"ok   engine: {engine} " in done.stdout, done.stdout
    finally:
        first.send_signal(signal.SIGKILL)  # no clean-up of any kind
        first.wait(timeout=10)
    port = free_port()
    third = spawn_daemon(second_dir, port, settings_of=settings)
    try:
        healthy(port, third, second_dir / "serve.log")  # the kernel let the lock go
    finally:
        third.send_signal(signal.SIGTERM)
        assert third.wait(timeout=60) == 0
