"""The command line as an operator runs it: real processes, a controlled environment.
Verbs that stop before any engine or socket run in this process (``run_main``).

Every run gets ``cwd=tmp_path`` (no stray `.env`), a HOME and state dir under it, and
PYTHONPATH pointing at this checkout, so the code under test is this tree's.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from tests.helpers import (
    INVENTORY_KEYS,
    docker_host,
    engine_missing,
    engine_settings,
    podman_url,
    python_path,
    storage_root,
)
from tuneplane_node.cli import main
from tuneplane_node.runtime.engines.docker import DockerRuntime

# Slow: the daemon's command line end to end.
pytestmark = pytest.mark.slow


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


def run_cli(
    tmp_path: Path,
    *args: str,
    timeout: float = 60,
    settings_of: Mapping[str, str] | None = None,
    **settings: str,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuneplane_node", *args],
        cwd=tmp_path,
        env=cli_env(tmp_path, **{**(settings_of or {}), **settings}),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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


@pytest.fixture
def docker_settings() -> dict[str, str]:
    """Settings that point the CLI at the test Docker engine; skip or fail when it is down."""

    async def ask() -> tuple[bool, str | None]:
        runtime = DockerRuntime(engine_settings("docker"))
        try:
            health = await runtime.health()
        finally:
            await runtime.close()
        return health.ok, health.error

    ok, error = asyncio.run(ask())
    if not ok:
        engine_missing("docker", error or "no answer")
    host = docker_host()
    settings = {"TUNEPLANE_LOCAL_RUNTIME": "docker"}
    if host:
        settings["TUNEPLANE_DOCKER_HOST"] = host
    return settings


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


@pytest.mark.engine
def test_a_wrong_docker_address_never_becomes_podman(tmp_path: Path) -> None:
    """The podman service answers, and still the node refuses: jobs run on docker."""
    result = run_cli(
        tmp_path,
        "check",
        TUNEPLANE_NODE_TOKEN="t0ken-0123456789abcdef",
        TUNEPLANE_DOCKER_HOST="unix:///nonexistent.sock",
        TUNEPLANE_PODMAN_URL=podman_url(),
    )
    assert result.returncode == 1, result.stdout
    assert (
        "FAIL engine: TUNEPLANE_DOCKER_HOST=unix:///nonexistent.sock: docker did not answer"
        in result.stdout
    )
    assert "engine: podman" not in result.stdout and "podman at" not in result.stdout


# --- against the Docker engine -------------------------------------------------------


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


@pytest.mark.engine
def test_serve_answers_healthz_and_exits_0_on_sigterm(
    tmp_path: Path, serve: Serve, docker_settings: dict[str, str]
) -> None:
    process, port = serve(TUNEPLANE_NODE_TOKEN="t0ken-0123456789abcdef", **docker_settings)
    assert wait_for_healthz(process, port, tmp_path / "serve.log") == {"ok": True}
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0
    said = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in said
    assert "SIGTERM: stopping (requests in flight finish first)" in said  # when, if it hangs
    assert said.rstrip().endswith("stopped")


@pytest.mark.engine
def test_the_readme_quick_start_serves_the_api_with_auto_runtime(
    tmp_path: Path, serve: Serve, docker_settings: dict[str, str]
) -> None:
    """Token and docker host only, as the README's quick start runs it."""
    settings = {k: v for k, v in docker_settings.items() if k != "TUNEPLANE_LOCAL_RUNTIME"}
    process, port = serve(TUNEPLANE_NODE_TOKEN="change-me-to-a-long-secret", **settings)
    assert wait_for_healthz(process, port, tmp_path / "serve.log") == {"ok": True}
    headers = {"Authorization": "Bearer change-me-to-a-long-secret"}
    headers["X-TunePlane-Node-Protocol"] = "1"
    health = get_json(port, "/node/v1/health", headers)
    assert isinstance(health, dict)
    assert health["ok"] is True, health
    assert health["runtime"]["name"] == "docker"
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == 0


@pytest.mark.engine
def test_check_reports_the_engine(tmp_path: Path, docker_settings: dict[str, str]) -> None:
    port = str(free_port())
    result = run_cli(
        tmp_path,
        "check",
        settings_of=docker_settings,
        TUNEPLANE_NODE_TOKEN="t0ken-0123456789abcdef",
        TUNEPLANE_NODE_PORT=port,
        TUNEPLANE_LOCAL_GPU_COUNT="0",  # no cards here, by design (else: the count unknown)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok   engine: docker " in result.stdout


@pytest.mark.engine
def test_inventory_prints_the_console_fields_as_json(
    tmp_path: Path, docker_settings: dict[str, str]
) -> None:
    settings = {
        **docker_settings,
        "TUNEPLANE_STORAGE_ROOT": str(storage_root(tmp_path)),
        "TUNEPLANE_LOCAL_GPU_COUNT": "2",
        "TUNEPLANE_CLUSTER_PROFILE": "H100-Lab",
    }
    result = run_cli(tmp_path, "inventory", settings_of=settings)
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    assert list(facts) == INVENTORY_KEYS
    assert facts["runtime"].startswith("docker://")
    assert facts["accelerator_series"] == "h100-lab"
    assert facts["accelerator_count"] == 2
    assert facts["storage_root_visible"] is True
    assert facts["disk_free_bytes"] > 0
    assert facts["cpu_count"] >= 1
    assert facts["memory_bytes"] > 0
    uuid.UUID(facts["node_id"])
    again = json.loads(run_cli(tmp_path, "inventory", settings_of=settings).stdout)
    assert again["node_id"] == facts["node_id"]  # minted once, kept in the state dir


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
