"""`ctl` in this process and `serve` daemons for it to talk to: what tests/http/test_ctl.py and
tests/engines/test_ctl_engines.py share."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.console import HEADERS, TOKEN
from tests.support.daemons import free_port, spawn_daemon
from tuneplane_node.cli import main

Ctl = Callable[..., tuple[int, str, str]]


@pytest.fixture
def ctl(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Ctl:
    """``tuneplane-node ctl ARGS`` in this process: (exit code, stdout, stderr). The
    token is the suite's unless ``token`` says otherwise (None: no token at all)."""
    for name in list(os.environ):
        if name.startswith("TUNEPLANE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "200")  # rich draws tables to fit; keep rows whole

    def run(*args: str, token: str | None = TOKEN, url: str | None = None) -> tuple[int, str, str]:
        for name, value in (("TUNEPLANE_NODE_TOKEN", token), ("TUNEPLANE_CTL_URL", url)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        try:
            code = main(["ctl", *args])
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return code, out, err

    return run


# --- daemons ------------------------------------------------------------------------------


@dataclass
class Node:
    url: str
    process: subprocess.Popen[bytes]
    made: list[str] = field(default_factory=list)  # container names to remove at the end


def wait_for_port(node: Node, port: int, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert node.process.poll() is None, f"serve exited early:\n{log.read_text()}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"serve never listened:\n{log.read_text()}"
            time.sleep(0.1)


StartNode = Callable[..., Node]


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[StartNode]:
    """`tuneplane-node serve` on a free loopback port with these settings."""
    started: list[Node] = []

    def start(scheme: str = "http", **settings: str) -> Node:
        port = free_port()
        node = Node(
            f"{scheme}://127.0.0.1:{port}", spawn_daemon(tmp_path, port, settings_of=settings)
        )
        started.append(node)
        wait_for_port(node, port, tmp_path / "serve.log")
        return node

    yield start
    for node in started:
        node.process.kill()
        node.process.wait(timeout=10)


def api(node: Node, path: str) -> Any:
    """The API's own answer, without ctl."""
    request = urllib.request.Request(node.url + path, headers=HEADERS)
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())
