"""The command line as an operator runs it: real processes, a controlled environment.
Verbs that stop before any engine or socket run in this process (``run_main``).

Every run gets ``cwd=tmp_path`` (no stray `.env`), a HOME and state dir under it, and
PYTHONPATH pointing at this checkout, so the code under test is this tree's."""

from __future__ import annotations

import json
import os
import signal
import socket
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.servecommand import Serve, cli_env, free_port, wait_for_healthz
from tests.support.nodes import storage_root
from tuneplane_node.cli import main

# Slow: the daemon's command line end to end.
pytestmark = pytest.mark.slow


@pytest.fixture
def run_main(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str, str]]:
    """``cli.main`` in this process, for the verbs that never reach an engine or a socket:
    the same controlled environment as ``run_cli`` without a second interpreter's start."""
    for name in list(os.environ):
        if name.startswith(("TUNEPLANE_", "DOCKER_", "CONTAINER_")):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)

    def run(*args: str, **settings: str) -> tuple[int, str, str]:
        for name, value in cli_env(tmp_path, **settings).items():
            if name.startswith("TUNEPLANE_"):
                monkeypatch.setenv(name, value)
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's --help and usage errors
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return run


# --- no engine needed ----------------------------------------------------------------


def test_help_lists_the_commands(run_main: Callable[..., tuple[int, str, str]]) -> None:
    code, out, err = run_main("--help")
    assert code == 0, err
    for verb in ("serve", "inventory", "check"):
        assert verb in out


def test_serve_without_a_token_refuses_to_start(
    run_main: Callable[..., tuple[int, str, str]],
) -> None:
    code, _, err = run_main("serve", "--port", str(free_port()))
    assert code != 0
    assert "TUNEPLANE_NODE_TOKEN" in err
    assert "Traceback" not in err


def test_a_bad_setting_is_named_without_a_traceback(
    run_main: Callable[..., tuple[int, str, str]],
) -> None:
    code, _, err = run_main(
        "serve", TUNEPLANE_NODE_TOKEN="t0ken-0123456789abcdef", TUNEPLANE_NODE_PORT="notaport"
    )
    assert code != 0
    assert "TUNEPLANE_NODE_PORT" in err
    assert "notaport" in err
    assert "Traceback" not in err


def test_auto_with_a_docker_address_that_does_not_answer_is_a_fail_naming_it(
    run_main: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    docker_sock, podman_sock = tmp_path / "no-docker.sock", tmp_path / "no-podman.sock"
    code, out, _ = run_main(
        "check",
        TUNEPLANE_NODE_TOKEN="t0ken-0123456789abcdef",
        TUNEPLANE_LOCAL_RUNTIME="auto",
        TUNEPLANE_DOCKER_HOST=f"unix://{docker_sock}",
        TUNEPLANE_PODMAN_URL=f"unix://{podman_sock}",
    )
    assert code == 1
    line = next(line for line in out.splitlines() if line.startswith("FAIL engine:"))
    assert f"TUNEPLANE_DOCKER_HOST=unix://{docker_sock}: docker did not answer" in line
    assert "does not fall back to podman" in line
    assert "podman at" not in out and "Traceback" not in out


# --- log level and format -----------------------------------------------------------------


def test_an_unknown_log_level_flag_is_a_usage_error(
    run_main: Callable[..., tuple[int, str, str]],
) -> None:
    code, _, err = run_main("--log-level", "verbose", "check")
    assert code == 2
    assert "--log-level: invalid choice: 'VERBOSE'" in err and "Traceback" not in err


def test_check_tries_the_port_on_both_families_as_serve_binds(
    run_main: Callable[..., tuple[int, str, str]], tmp_path: Path
) -> None:
    """0.0.0.0 is served on IPv6 too: a job holding [::] is a FAIL, not an ok."""
    port = free_port()
    settings = {"TUNEPLANE_NODE_TOKEN": "t0ken-0123456789abcdef"}
    settings |= {"TUNEPLANE_LOCAL_RUNTIME": "process"}
    settings |= {"TUNEPLANE_NODE_PORT": str(port)}
    settings |= {"TUNEPLANE_STORAGE_ROOT": str(storage_root(tmp_path))}
    with socket.socket(socket.AF_INET6) as job:
        job.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        try:
            job.bind(("::", port))
        except OSError as exc:
            pytest.skip(f"no IPv6 on this machine ({exc.strerror}): nothing to hold [::]")
        job.listen()
        code, out, _ = run_main("check", **settings)
    assert code == 1, out
    assert f"FAIL port: [::]:{port}: Address already in use (a node already serving?)" in out
    code, out, _ = run_main("check", **settings)  # let go: both halves free
    assert f"ok   port: 0.0.0.0:{port} and [::]:{port} free" in out.splitlines()


def test_an_unknown_log_level_setting_is_named(
    run_main: Callable[..., tuple[int, str, str]],
) -> None:
    code, _, err = run_main(
        "check", TUNEPLANE_NODE_TOKEN="t-0123456789abcdef", TUNEPLANE_LOG_LEVEL="loud"
    )
    assert code == 2
    assert "TUNEPLANE_LOG_LEVEL" in err and "'LOUD'" in err and "Traceback" not in err


def test_json_log_lines_parse_and_carry_the_job(tmp_path: Path, serve: Serve) -> None:
    """TUNEPLANE_LOG_FORMAT=json: every line the daemon writes is one JSON object."""
    process, port = serve(
        TUNEPLANE_NODE_TOKEN="t0ken-0123456789abcdef",
        TUNEPLANE_LOCAL_RUNTIME="process",
        TUNEPLANE_LOG_FORMAT="json",
        TUNEPLANE_LOG_LEVEL="debug",
    )
    wait_for_healthz(process, port, tmp_path / "serve.log")
    launch = {"run_id": "json-1", "container": {"name": "tuneplane-json-1", "image": "x",
              "command": ["/bin/true"]}}  # fmt: skip
    headers = {"Authorization": "Bearer t0ken-0123456789abcdef", "X-TunePlane-Node-Protocol": "1"}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/node/v1/launch",
        data=json.dumps(launch).encode(),
        headers={**headers, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        assert json.loads(reply.read())["phase"] == "running"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    lines = [json.loads(line) for line in (tmp_path / "serve.log").read_text().splitlines()]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines)
    assert any(line["message"].startswith("listening on http://127.0.0.1:") for line in lines)
    audit = [line for line in lines if line["logger"] == "tuneplane_node.audit"]
    assert [(a["action"], a["run_id"], a["ref"], a["result"]) for a in audit] == [
        ("launch", "json-1", "tuneplane-json-1", "started")
    ]
    access = [line for line in lines if line["logger"] == "tuneplane_node.access"]
    assert any(line["message"].startswith("POST /node/v1/launch 200") for line in access)
    assert "t0ken-0123456789abcdef" not in (tmp_path / "serve.log").read_text()
