"""``GET /metrics`` as Prometheus scrapes it, and the audit lines as an operator reads
them: in front of the in-memory engine (values after each verb), and on a real engine
(Prometheus' own ``promtool check metrics``, engine calls, a real pull).

This module holds the ones that need an engine; tests/http/test_daemon_metrics.py has the rest."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeNode
from tests.scrapes import parse, scrape, value
from tests.support.console import TOKEN, Console
from tests.support.engines import engine_settings, under_ci
from tests.support.nodes import storage_root
from tuneplane_node.daemon.app import create_node_app

# Slow: the metrics and audit lines end to end over a real socket.
pytestmark = pytest.mark.slow


# --- on a real engine --------------------------------------------------------------------


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if under_ci():
            pytest.fail("promtool is missing (Debian package prometheus; engines.sh installs it)")
        pytest.skip("promtool is missing (apt-get install prometheus)")
    return path


@pytest.mark.engine
async def test_a_scrape_on_a_real_engine_passes_promtool(make_node: MakeNode) -> None:
    node = await make_node()
    ref, _ = await node.launch(gpus=1)
    async with node.client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}) as got:
        text = await got.text()
    checked = subprocess.run(
        [promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    samples = parse(text)
    assert value(samples, "tuneplane_node_gpus", state="held") == 1
    assert value(samples, "tuneplane_node_launches_total", outcome="started") == 1
    assert value(samples, "tuneplane_node_state_cache_synced") == 1
    assert 0 <= value(samples, "tuneplane_node_state_cache_age_seconds") < 60
    assert value(samples, "tuneplane_node_event_loop_lag_seconds") >= 0
    running = value(samples, "tuneplane_node_jobs", status="running")
    assert running >= 1  # the shared engine may hold other nodes' jobs too
    assert value(samples, "tuneplane_node_image_store_total_bytes") > 0
    assert value(samples, "tuneplane_node_image_store_free_bytes") > 0
    assert value(samples, "tuneplane_node_image_gc_runs_total") >= 0
    await node.stop(ref, timeout=0)


@pytest.mark.engine
async def test_the_daemon_times_its_engine_calls(aiohttp_client: Any, tmp_path: Path) -> None:
    """As `serve` builds it: the runtime made by the daemon reports every engine call."""
    settings = engine_settings(
        "docker",
        node_token=TOKEN,
        local_gpu_passthrough=False,
        local_gpu_count=2,
        storage_root=storage_root(tmp_path),
        node_state_dir=tmp_path / "state",
    )
    node = Console(await aiohttp_client(create_node_app(settings, sweep=False)))
    ref, _ = await node.launch(["/bin/sh", "-c", "exit 0"])
    try:
        samples = await scrape(node)
    finally:
        await node.remove(ref)
    calls = {
        dict(labels)["call"]: count
        for (name, labels), count in samples.items()
        if name == "tuneplane_node_engine_call_duration_seconds_count"
    }
    assert calls.get("run") == 1 and calls.get("inspect_image", 0) >= 1, calls  # create+start
