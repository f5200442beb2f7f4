"""The command line as an operator runs it: real processes, a controlled environment.
Verbs that stop before any engine or socket run in this process (``run_main``).

This module holds the ones that need an engine; tests/http/test_cli.py has the rest."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.servecommand import Serve, cli_env, free_port, get_json, wait_for_healthz
from tests.support.console import INVENTORY_KEYS
from tests.support.engines import docker_host, engine_missing, engine_settings, suite_podman
from tests.support.nodes import storage_root
from tuneplane_node.runtime.engines.docker import DockerRuntime

# Slow: the daemon's command line end to end.
pytestmark = pytest.mark.slow


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


@pytest.mark.engine
def test_a_wrong_docker_address_never_becomes_podman(tmp_path: Path) -> None:
    """The podman service answers, and still the node refuses: jobs run on docker."""
    result = run_cli(
        tmp_path,
        "check",
        TUNEPLANE_NODE_TOKEN="t0ken-0123456789abcdef",
        TUNEPLANE_DOCKER_HOST="unix:///nonexistent.sock",
        TUNEPLANE_PODMAN_URL=suite_podman(),
    )
    assert result.returncode == 1, result.stdout
    assert (
        "FAIL engine: TUNEPLANE_DOCKER_HOST=unix:///nonexistent.sock: docker did not answer"
        in result.stdout
    )
    assert "engine: podman" not in result.stdout and "podman at" not in result.stdout


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
