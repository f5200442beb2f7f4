"""``GET /metrics`` as Prometheus scrapes it, and the audit lines as an operator reads
them: in front of the in-memory engine (values after each verb), and on a real engine
(Prometheus' own ``promtool check metrics``, engine calls, a real pull)."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import IMAGE, MakeFakeNode
from tests.fakes.runtime import FakeRuntime
from tests.scrapes import parse, scrape, value
from tests.support.console import HEADERS, TOKEN, console_0315
from tuneplane_node import __version__
from tuneplane_node.daemon.metrics import Metrics
from tuneplane_node.daemon.state import NODE
from tuneplane_node.logformat import JsonFormatter
from tuneplane_node.runtime.facts import DeviceSupport
from tuneplane_node.runtime.pool import BlockingPool

# Slow: the metrics and audit lines end to end over a real socket.
pytestmark = pytest.mark.slow

MISSING = "registry.test/missing:1"
DASHBOARD = Path(__file__).resolve().parents[2] / "contrib/grafana/tuneplane-node.json"


def launch(run_id: str, gpus: int = 2, image: str = IMAGE) -> dict[str, Any]:
    return console_0315(run_id, gpus, image=image)


# --- in front of the in-memory engine ----------------------------------------------------


async def test_metrics_need_the_token_but_not_the_protocol(fake_node: MakeFakeNode) -> None:
    node = await fake_node()
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        async with node.client.get("/metrics", headers=headers) as response:
            assert response.status == 401
            assert await response.json() == {"detail": "invalid node token", "code": "unauthorized"}
    samples = await scrape(node)  # the token alone, no protocol header
    assert value(samples, "tuneplane_node_build_info", version=__version__) == 1


async def test_gpu_readiness_is_a_series(fake_node: MakeFakeNode, fake: FakeRuntime) -> None:
    """Issue 36, finding 3: a node whose every card launch was a 409 looked healthy on
    the board; 1 ready, 0 not, NaN without cards."""
    assert value(await scrape(await fake_node()), "tuneplane_node_gpu_ready") == 1
    assert math.isnan(
        value(await scrape(await fake_node(local_gpu_count=0)), "tuneplane_node_gpu_ready")
    )
    fake.support = DeviceSupport(runtimes=("runc",))
    assert value(await scrape(await fake_node()), "tuneplane_node_gpu_ready") == 0


async def test_public_metrics_need_no_token_and_the_api_still_does(
    fake_node: MakeFakeNode,
) -> None:
    node = await fake_node(metrics_public=True)
    assert value(await scrape(node, headers={}), "tuneplane_node_node_state", state="ready") == 1
    status, _ = await node.call("GET", "/node/v1/health", headers={})
    assert status == 401


async def test_the_series_follow_the_launches_cards_and_node_state(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    await node.ok("POST", "/node/v1/launch", json=launch("r-1", 2))
    await node.ok("POST", "/node/v1/launch", json=launch("r-1", 2))  # idempotent
    await node.ok("POST", "/node/v1/launch", json=launch("r-2", 1, image=MISSING))
    status, _ = await node.call("POST", "/node/v1/launch", json=launch("r-3", 4))
    assert status == 409  # no capacity
    await fake.pulling.wait()
    await node.ok("POST", "/node/v1/cordon", json={"reason": "fan"})

    samples = await scrape(node)
    cards = {kind: value(samples, "tuneplane_node_gpus", state=kind) for kind in
             ("free", "held", "reserved", "unhealthy", "external")}  # fmt: skip
    assert cards == {"free": 1, "held": 2, "reserved": 1, "unhealthy": 0, "external": 0}
    assert sum(cards.values()) == 4  # the card count
    assert value(samples, "tuneplane_node_jobs", status="running") == 1
    assert value(samples, "tuneplane_node_jobs", status="pulling") == 1
    assert value(samples, "tuneplane_node_jobs", status="exited") == 0
    for outcome, count in (("started", 1), ("running", 1), ("pulling", 1), ("refused", 1)):
        assert value(samples, "tuneplane_node_launches_total", outcome=outcome) == count
    assert value(samples, "tuneplane_node_pulls_in_flight") == 1
    assert value(samples, "tuneplane_node_node_state", state="cordoned") == 1
    assert value(samples, "tuneplane_node_node_state", state="ready") == 0
    assert value(samples, "tuneplane_node_state_cache_synced") == 1  # the fake has no cache

    fake.pull_of(MISSING).report(300, 300, 1, 1)
    fake.pull_of(MISSING).finish()
    await node.wait_for("tuneplane-r-2", "status", "running")
    samples = await scrape(node)
    assert value(samples, "tuneplane_node_pulls_in_flight") == 0
    assert value(samples, "tuneplane_node_pull_duration_seconds_count", outcome="ok") == 1
    assert value(samples, "tuneplane_node_pull_bytes_total") == 300
    assert value(samples, "tuneplane_node_jobs", status="running") == 2


async def test_http_series_name_the_route_never_the_ref_nor_a_made_up_method(
    fake_node: MakeFakeNode,
) -> None:
    node = await fake_node()
    await node.observe("tuneplane-secret-ref")
    await node.call("GET", "/node/v1/nonexistent/tuneplane-secret-ref")
    async with node.client.request("PROPFIND", "/node/v1/health", headers=HEADERS) as response:
        assert response.status == 405
    text = await (
        await node.client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    ).text()
    assert "tuneplane-secret-ref" not in text and "PROPFIND" not in text
    samples = parse(text)
    count = "tuneplane_node_http_request_duration_seconds_count"
    assert value(samples, count, route="/node/v1/observe", method="POST", status="200") == 1
    assert value(samples, count, route="unmatched", method="GET", status="404") == 1
    assert value(samples, count, route="unmatched", method="other", status="405") == 1


async def test_unknown_facts_are_no_series_not_zeros(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    fake.up = False  # from the start: the cache never synced
    node = await fake_node(local_gpu_count=None)  # no count, and the fake probe says none
    samples = await scrape(node)
    assert not [key for key in samples if key[0] in ("tuneplane_node_gpus", "tuneplane_node_jobs")]
    assert math.isnan(value(samples, "tuneplane_node_state_cache_age_seconds"))  # unknown


async def test_every_verb_that_changes_something_writes_an_audit_line(
    fake_node: MakeFakeNode, fake: FakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    node = await fake_node()
    caplog.set_level(logging.INFO, logger="tuneplane_node.audit")
    await node.ok("POST", "/node/v1/launch", json=launch("r-1", 2))
    await node.stop("tuneplane-r-1", timeout=1)
    await node.ok("POST", "/node/v1/cordon", json={"reason": "fan"})
    await node.call("POST", "/node/v1/launch", json=launch("r-2", 1))
    await node.ok("POST", "/node/v1/drain", json={"reason": "fan", "grace_s": 1})
    await node.ok("POST", "/node/v1/uncordon")
    await node.remove("tuneplane-r-1")
    await node.ok("POST", "/node/v1/reap", json={})

    records = [r for r in caplog.records if r.name == "tuneplane_node.audit"]
    actions = [(r.action, r.result) for r in records]  # type: ignore[attr-defined]
    assert actions == [
        ("launch", "started"),
        ("stop", "ok"),
        ("cordon", "cordoned"),
        ("launch", "refused"),
        ("drain", "draining"),
        ("uncordon", "ready"),
        ("remove", "ok"),
        ("reap", "removed 0"),
    ]
    first = json.loads(JsonFormatter().format(records[0]))
    assert first["run_id"] == "r-1" and first["ref"] == "tuneplane-r-1"
    assert first["image"] == IMAGE and first["gpus"] == [0, 1]
    assert first["client"] == "127.0.0.1" and first["action"] == "launch"
    refused = json.loads(JsonFormatter().format(records[3]))
    assert refused["status"] == 409 and "cordoned" in refused["reason"]
    assert TOKEN not in caplog.text


async def test_an_image_gc_run_counts_and_audits_each_image_it_removed(
    fake_node: MakeFakeNode, fake: FakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    fake.disk_total, fake.disk_other = 100 * 2**20, 90 * 2**20
    node = await fake_node(image_gc_min_age_s=0, image_pin_s=0)
    jobs = node.app[NODE]
    for name in ("registry.test/team/a:1", "registry.test/team/b:1"):
        fake.arrived(name, size=6 * 2**20)
        jobs.ledger.record_pull(name, fake.image_id(name), fake.clock.now(), prefetch=False)
        fake.clock.advance(60)
    caplog.set_level(logging.INFO, logger="tuneplane_node.audit")

    run = await node.ok("POST", "/node/v1/images/gc", json={})

    assert [r["image"] for r in run["removed"]] == [
        "registry.test/team/a:1",
        "registry.test/team/b:1",
    ]
    samples = await scrape(node)
    assert value(samples, "tuneplane_node_image_gc_runs_total") == 1
    assert value(samples, "tuneplane_node_image_gc_removed_total") == 2
    assert value(samples, "tuneplane_node_image_gc_freed_bytes_total") == 12 * 2**20
    assert value(samples, "tuneplane_node_image_store_total_bytes") == 100 * 2**20
    assert (
        value(samples, "tuneplane_node_image_store_free_bytes") == run["image_store"]["free_bytes"]
    )
    removals = [r for r in caplog.records if getattr(r, "result", "") == "removed"]
    line = json.loads(JsonFormatter().format(removals[0]))
    assert (line["action"], line["client"]) == ("image gc", "node")
    assert line["image"] == "registry.test/team/a:1" and line["size_bytes"] == 6 * 2**20
    assert line["image_id"] == fake.image_id("registry.test/team/a:1") and "disk" in line["why"]


async def test_an_unknown_image_store_is_nan_not_zero(fake_node: MakeFakeNode) -> None:
    samples = await scrape(await fake_node())  # the fake's data root is not measured
    assert math.isnan(value(samples, "tuneplane_node_image_store_free_bytes"))


async def test_every_metric_the_dashboard_queries_exists(fake_node: MakeFakeNode) -> None:
    """The Grafana dashboard in contrib/ is built on exactly the names the node serves."""
    node = await fake_node()
    async with node.client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}) as got:
        served = served_names(await got.text())
    dashboard = json.loads(DASHBOARD.read_text())
    wanted = set(re.findall(r"tuneplane_node_[a-z_]+", json.dumps(dashboard)))
    assert len(wanted) >= 10, wanted
    assert not wanted - served, (
        f"the dashboard queries what the node never serves: {wanted - served}"
    )


def served_names(text: str) -> set[str]:
    """Every series name a query may use, samples or not yet (a family with no child)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ()))
    return names


async def test_an_engine_call_that_raises_counts_as_an_error_under_its_name() -> None:
    metrics = Metrics()
    pool = BlockingPool(1, name="metrics-test", telemetry=metrics)

    def _remove_container() -> None:
        raise OSError("engine went away")

    with pytest.raises(OSError):
        await pool.call(_remove_container)
    await pool.call_as("_ps", lambda: None)
    assert await pool.call(dict, name="job") == {"name": "job"}  # an SDK's own name= passes
    pool.close()
    samples = parse(generate_latest(metrics.registry).decode())
    assert value(samples, "tuneplane_node_engine_errors_total", call="remove_container") == 1
    count = "tuneplane_node_engine_call_duration_seconds_count"
    assert value(samples, count, call="remove_container") == 1
    assert value(samples, count, call="ps") == 1
    assert ("tuneplane_node_engine_errors_total", (("call", "ps"),)) not in samples


async def test_card_series_carry_dcgm_exporters_labels(
    fake_node: MakeFakeNode, tmp_path: Path
) -> None:
    """Issue 25, finding 7: the node's view of a card joins DCGM's on gpu, UUID, modelName."""
    cards = [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-4cf8db2d-06c0-7d70",
         "memory_used_mib": 1024, "temperature_c": 41, "utilization_pct": 50},
        {"index": 1, "memory_used_mib": 0},  # the driver named nothing: "" labels
    ]  # fmt: skip
    simulation = tmp_path / "gpus.json"
    simulation.write_text(json.dumps({"driver": "580.1", "cards": cards}))
    node = await fake_node(gpu_simulation_file=simulation, local_gpu_count=None)
    samples = await scrape(node)
    first = {"gpu": "0", "UUID": "GPU-4cf8db2d-06c0-7d70", "modelName": "NVIDIA H100 80GB HBM3"}
    assert value(samples, "tuneplane_node_gpu_memory_used_bytes", **first) == 1024 * 2**20
    assert value(samples, "tuneplane_node_gpu_temperature_celsius", **first) == 41
    assert value(samples, "tuneplane_node_gpu_utilization_ratio", **first) == 0.5
    second = {"gpu": "1", "UUID": "", "modelName": ""}
    assert value(samples, "tuneplane_node_gpu_memory_used_bytes", **second) == 0
