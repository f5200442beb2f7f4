"""One daemon per engine (issue 25, finding 4): the lock ``serve`` takes, its holder
named in the refusal, released by the kernel when its holder is SIGKILLed; and a
start-up sweep that leaves a launch in flight alone. On the real docker and podman.

This module holds the ones that need an engine; tests/http/test_daemon_enginelock.py
has the rest."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.console import HEADERS
from tests.support.daemons import free_port, python_path, spawn_daemon
from tests.support.engines import docker_host, engine_missing, podman_url

# Slow: flocks held by real processes.
pytestmark = pytest.mark.slow


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
