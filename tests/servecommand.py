"""The daemon's command line in a process of its own (`serve`, its environment, its port):
what tests/http/test_cli.py and tests/engines/test_cli_engines.py share."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.daemons import python_path


def cli_env(home: Path, **settings: str) -> dict[str, str]:
    """A minimal environment: nothing from the caller's shell leaks into the settings."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PYTHONPATH": python_path(),
        "TUNEPLANE_NODE_STATE_DIR": str(home / "state"),
        # The development engines hold every engineer's test daemons at once.
        "TUNEPLANE_DEV_SHARED_ENGINE": "true",
    }
    env.update(settings)
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


Serve = Callable[..., tuple[subprocess.Popen[bytes], int]]


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Serve]:
    """Start `tuneplane-node serve` on a free loopback port; killed if a test leaves it."""
    started: list[subprocess.Popen[bytes]] = []
    log = (tmp_path / "serve.log").open("w")

    def start(**settings: str) -> tuple[subprocess.Popen[bytes], int]:
        port = free_port()
        argv = ["serve", "--host", "127.0.0.1", "--port", str(port)]
        process = subprocess.Popen(
            [sys.executable, "-m", "tuneplane_node", *argv],
            cwd=tmp_path,
            env=cli_env(tmp_path, **settings),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started.append(process)
        return process, port

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    log.close()


def get_json(port: int, path: str, headers: dict[str, str] | None = None) -> object:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def wait_for_healthz(
    process: subprocess.Popen[bytes], port: int, log: Path, timeout: float = 30
) -> object:
    deadline = time.monotonic() + timeout
    while True:
        assert process.poll() is None, f"serve exited early:\n{log.read_text()}"
        try:
            return get_json(port, "/healthz")
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, f"serve never answered:\n{log.read_text()}"
            time.sleep(0.2)
