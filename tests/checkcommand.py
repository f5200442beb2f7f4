"""`check` run in-process with only the settings a test gives: the `check` fixture of
tests/http/test_check.py and tests/engines/test_check_engines.py."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.daemons import free_port
from tests.support.nodes import storage_root
from tuneplane_node.cli import main

Check = Callable[..., tuple[int, dict[str, str], str]]


@pytest.fixture
def check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Check:
    """``check`` with only the given settings (plus a token, a free port, the process
    runtime, a storage root and state dir under tmp_path), ``argv`` after ``check``;
    returns the exit code, each line keyed by its subject ("engine", "tls", ...) and
    the whole output."""
    for name in list(os.environ):
        if name.startswith(("TUNEPLANE_", "DOCKER_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)

    def run(*argv: str, **settings: str) -> tuple[int, dict[str, str], str]:
        base = {
            "TUNEPLANE_NODE_TOKEN": "s3cret-t0ken-0123456789",
            "TUNEPLANE_NODE_PORT": str(free_port()),
            "TUNEPLANE_LOCAL_RUNTIME": "process",
            "TUNEPLANE_STORAGE_ROOT": str(storage_root(tmp_path)),
            "TUNEPLANE_NODE_STATE_DIR": str(tmp_path / "state"),
            "TUNEPLANE_LOCAL_GPU_COUNT": "0",  # a machine without cards, by design
        }
        for name, value in {**base, **settings}.items():
            monkeypatch.setenv(name, value)
        code = main(["check", *argv])
        out = capsys.readouterr().out
        lines = {}
        for line in out.splitlines():
            level, text = line.split(None, 1)
            assert level in ("ok", "warn", "FAIL"), line
            lines[text.split(":", 1)[0]] = f"{level} {text}"
        return code, lines, out

    return run
