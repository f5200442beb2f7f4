"""The job API over HTTP, as a console uses it, against the real Docker engine (and podman)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.conftest import TrackingRuntime, engine_settings
from tests.console import HEADERS, TOKEN, Console
from tests.engines import IMAGE, REGISTRY, unique
from tests.proxy import ThrottlingProxy
from tests.test_runtime import forget_image
from tuneplane_node.daemon.app import create_node_app
from tuneplane_node.daemon.state import LAUNCHES, RUNTIME
from tuneplane_node.errors import ConfigError
from tuneplane_node.runtime.base import LABEL_RUN_ID, ContainerSpec, container_name
from tuneplane_node.runtime.docker import DockerRuntime
from tuneplane_node.wire import PROTOCOL_HEADER

Make = Any  # the make_node fixture's factory


# --- the server's guard ------------------------------------------------------------


def test_the_daemon_refuses_to_start_without_a_token() -> None:
    with pytest.raises(ConfigError, match="TUNEPLANE_NODE_TOKEN"):
        create_node_app(engine_settings("docker", node_token=None))


async def test_healthz_needs_no_token_and_says_nothing_else(make_node: Make) -> None:
    node = await make_node()
    status, body = await node.call("GET", "/healthz", headers={})
    assert (status, body) == (200, {"ok": True})


@pytest.mark.parametrize(
    ("headers", "status", "detail"),
    [
        ({PROTOCOL_HEADER: "1"}, 401, "invalid node token"),
        ({"Authorization": "Bearer wrong", PROTOCOL_HEADER: "1"}, 401, "invalid node token"),
        ({"Authorization": f"Bearer {TOKEN}"}, 400, f"missing {PROTOCOL_HEADER} header"),
        (
            {"Authorization": f"Bearer {TOKEN}", PROTOCOL_HEADER: "2"},
            409,
            "wire protocol mismatch: console=2, node=1",
        ),
    ],
)
async def test_api_needs_token_and_protocol(
    make_node: Make, headers: dict[str, str], status: int, detail: str
) -> None:
    node = await make_node()
    for method, path in (("GET", "/node/v1/health"), ("POST", "/node/v1/observe")):
        got, body = await node.call(method, path, headers=headers, json={"refs": []})
        assert got == status
        assert detail in body["detail"]
    if status == 400:
        assert "protocol 1" in body["detail"]


@pytest.mark.parametrize(
    ("payload", "status", "field"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b'{"container": {"image": "x"}}', 422, "run_id"),
        (b'{"run_id": "a"}', 422, "container"),
        (b'{"run_id": "a", "container": {}}', 422, "container.image"),
        (b'{"run_id": "a", "container": {"image": "x", "command": "rm -rf /"}}', 422, "command"),
        (
            b'{"run_id": "a", "requested_gpus": -1, "container": {"image": "x"}}',
            422,
            "requested_gpus",
        ),
        (
            b'{"run_id": "a", "container": {"image": "x", "mounts": [["rel", "/x", true]]}}',
            422,
            "mounts[0]",
        ),
        (
            b'{"run_id": "a", "container": {"image": "x", "labels": {"tuneplane.gpus": "0"}}}',
            422,
            "labels",
        ),
        (
            b'{"run_id": "a", "container": {"image": "x", "memory_limit": "lots"}}',
            422,
            "memory_limit",
        ),
    ],
)
async def test_bad_launch_bodies_get_a_clear_4xx(
    make_node: Make, payload: bytes, status: int, field: str
) -> None:
    node = await make_node()
    got, body = await node.call("POST", "/node/v1/launch", data=payload, headers=HEADERS)
    assert got == status
    assert field in body["detail"]


async def test_a_body_over_one_mib_is_refused(make_node: Make) -> None:
    node = await make_node()
    payload = b'{"refs": ["' + b"x" * (1024 * 1024) + b'"]}'
    status, body = await node.call("POST", "/node/v1/observe", data=payload, headers=HEADERS)
    assert status == 413
    assert "larger than" in body["detail"]


async def test_logs_tail_is_bounded(make_node: Make) -> None:
    node = await make_node()
    for tail in ("0", "100001", "ten"):
        status, body = await node.call(
            "GET", "/node/v1/logs", params={"ref": "tuneplane-x", "tail": tail}
        )
        assert status == 422
        assert "tail" in body["detail"]


async def test_unknown_path_is_a_json_404(make_node: Make) -> None:
    node = await make_node()
    status, body = await node.call("GET", "/node/v1/exec")
    assert status == 404
    assert "detail" in body


# --- launch, observe, stop, remove, logs ---------------------------------------------


@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_launch_observe_logs_stop(make_node: Make, engine: str) -> None:
    node = await make_node(engine)
    ref, answer = await node.launch(
        ["/bin/sh", "-c", "echo hello-$WHO; trap 'exit 0' TERM; while true; do sleep 0.1; done"],
        gpus=2,
        env={"WHO": "console"},
    )
    assert answer["phase"] == "running"
    assert len(answer["container_id"]) == 12
    assert answer["gpus"] == [0, 1]

    state = await node.state(ref)
    assert state["exists"] and state["status"] == "running"
    assert state["exit_code"] is None
    assert state["labels"]["tuneplane.gpus"] == "0,1"
    await asyncio.sleep(0.5)
    assert "hello-console" in await node.logs(ref)

    assert await node.stop(ref, timeout=5) == {"ok": True}
    state = await node.state(ref)
    assert state["status"] == "exited"
    assert state["exit_code"] == 0
    assert (await node.health())["gpus_free"] == 4

    assert await node.remove(ref) == {"ok": True}
    assert (await node.state(ref))["exists"] is False


async def test_launch_is_idempotent(make_node: Make) -> None:
    node = await make_node()
    run_id = unique("idem")
    ref, first = await node.launch(gpus=1, run_id=run_id)
    _, again = await node.launch(gpus=1, run_id=run_id)

    assert again == {"phase": "running", "idempotent": True, "gpus": first["gpus"]}
    assert (await node.health())["gpus_free"] == 3
    assert (await node.state(ref))["status"] == "running"


async def test_relaunch_after_exit_starts_a_new_container(make_node: Make) -> None:
    node = await make_node()
    run_id = unique("again")
    ref, first = await node.launch(["/bin/sh", "-c", "exit 0"], run_id=run_id)
    await node.wait_for(ref, "status", "exited")

    _, second = await node.launch(["/bin/sleep", "300"], run_id=run_id)

    assert second["phase"] == "running"
    assert second["container_id"] != first["container_id"]
    assert (await node.state(ref))["status"] == "running"


async def test_exit_code_is_reported(make_node: Make) -> None:
    node = await make_node()
    ref, _ = await node.launch(["/bin/sh", "-c", "exit 3"])
    state = await node.wait_for(ref, "status", "exited")
    assert state["exit_code"] == 3
    assert state["oom_killed"] is False
    assert state["finished_at"] and state["started_at"]


async def test_a_job_over_its_memory_limit_reads_oom_killed(make_node: Make) -> None:
    node = await make_node()
    hog = 'a=$(dd if=/dev/zero bs=1M count=64 2>/dev/null | tr "\\0" x); echo ${#a}'
    ref, _ = await node.launch(["/bin/sh", "-c", hog], memory_limit="16m")
    state = await node.wait_for(ref, "status", "exited")
    assert state["oom_killed"] is True
    assert state["exit_code"] == 137


async def test_observe_of_an_unknown_ref_and_foreign_container(
    make_node: Make, docker_runtime: TrackingRuntime
) -> None:
    node = await make_node()
    foreign = unique("foreign")
    await docker_runtime.run(
        ContainerSpec(name=foreign, image=IMAGE, command=("/bin/sleep", "300"))
    )

    states = await node.observe("tuneplane-never-launched", foreign)

    assert states["tuneplane-never-launched"]["exists"] is False
    assert states[foreign]["exists"] is False  # not the node's: it knows nothing of it
    await node.stop(foreign, timeout=0)
    await node.remove(foreign)
    assert (await docker_runtime.inspect(foreign)).status == "running"  # untouched


async def test_stop_and_remove_of_unknown_refs_succeed(make_node: Make) -> None:
    node = await make_node()
    assert await node.stop("tuneplane-gone") == {"ok": True}
    assert await node.remove("tuneplane-gone") == {"ok": True}


async def test_capacity_refusal_says_why(make_node: Make) -> None:
    node = await make_node(local_gpu_count=2)
    _, body = await node.launch(gpus=3, expect=409)
    assert "asked for 3" in body["detail"]

    await node.launch(gpus=2)
    _, body = await node.launch(gpus=1, expect=409)
    assert "0 free" in body["detail"] and "2 held" in body["detail"]


# --- reap ----------------------------------------------------------------------------


async def test_reap_removes_exited_and_never_started_leaving_running(
    make_node: Make, docker_runtime: TrackingRuntime
) -> None:
    node = await make_node()
    done, _ = await node.launch(["/bin/sh", "-c", "exit 0"])
    running, _ = await node.launch(["/bin/sleep", "300"])
    await node.wait_for(done, "status", "exited")
    never = container_name(unique("never"))
    inner = docker_runtime.inner
    assert isinstance(inner, DockerRuntime)
    docker_runtime.made.append(never)
    options = inner.create_options(
        ContainerSpec(name=never, image=IMAGE, command=("/bin/true",), labels={LABEL_RUN_ID: "n"})
    )
    await inner.pool.call(inner.client.containers.create, **options)

    kept = await node.ok("POST", "/node/v1/reap", json={})  # default TTL: a day
    assert kept == {"removed": 0}
    await asyncio.sleep(1.1)
    reaped = await node.ok("POST", "/node/v1/reap", json={"max_age_s": 1})

    assert reaped["removed"] >= 2
    states = await node.observe(done, running, never)
    assert states[done]["exists"] is False
    assert states[never]["exists"] is False
    assert states[running]["status"] == "running"


# --- restart and engine failure ------------------------------------------------------


async def test_a_restarted_daemon_finds_its_jobs_and_cards_from_labels(make_node: Make) -> None:
    first = await make_node()
    ref, answer = await first.launch(gpus=2)
    runtime = first.app[RUNTIME]
    await first.client.close()

    second = await make_node(runtime=runtime)
    health = await second.health()

    assert health["by_job"] == {
        str(card): ref.removeprefix("tuneplane-") for card in answer["gpus"]
    }
    assert health["gpus_free"] == 2
    assert (await second.state(ref))["status"] == "running"


async def test_engine_unreachable_is_503_and_health_says_so(make_node: Make, tmp_path: Any) -> None:
    settings = engine_settings("docker", docker_host=f"unix://{tmp_path}/none.sock")
    runtime = TrackingRuntime(DockerRuntime(settings))
    node = await make_node(runtime=runtime)
    try:
        status, body = await node.call("POST", "/node/v1/observe", json={"refs": ["tuneplane-a"]})
        assert status == 503 and "unreachable" in body["detail"]
        _, body = await node.launch(expect=503)
        assert "unreachable" in body["detail"]
        health = await node.health()
        assert health["ok"] is False
        assert "unreachable" in health["error"]
        assert health["free_gpus"] is None  # unknown, not "none free"
    finally:
        await runtime.inner.close()


# --- the pull path -------------------------------------------------------------------


async def slow_image(runtime: TrackingRuntime, proxy: ThrottlingProxy, rate: int) -> str:
    proxy.rate = rate
    image = f"{proxy.address()}/tuneplane-test/big:1"
    await forget_image(runtime, image)
    return image


async def wait_until(predicate: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.05)


async def test_pull_reserves_cards_reports_progress_then_runs(
    make_node: Make, docker_runtime: TrackingRuntime, proxy: ThrottlingProxy
) -> None:
    image = await slow_image(docker_runtime, proxy, rate=2_000_000)
    node = await make_node(runtime=docker_runtime)

    ref, answer = await node.launch(gpus=3, image=image)
    assert answer == {"phase": "pulling", "image": image, "requested_gpus": 3}
    health = await node.health()
    assert health["gpus_reserved"] == 3 and health["gpus_free"] == 1
    assert health["pending_pulls"][ref] == {"image": image, "phase": "pulling", "error": None}
    _, body = await node.launch(gpus=2, expect=409)  # the reservation holds
    assert "reserved" in body["detail"]

    seen = []
    while (state := await node.state(ref))["status"] == "created":
        assert state["pending_phase"] in ("pulling", "starting")
        assert state["pending_image"] == image and state["pending_gpus"] == 3
        seen.append(state["pending_bytes_done"])
        await asyncio.sleep(0.2)

    assert state["status"] == "running"
    assert "pending_phase" not in state
    assert len(set(seen)) >= 3, seen  # the bytes moved while we watched
    health = await node.health()
    assert health["gpus_reserved"] == 0 and health["pending_pulls"] == {}
    assert sorted(health["by_job"]) == ["0", "1", "2"]
    await forget_image(docker_runtime, image)


async def test_a_failed_pull_leaves_a_failed_record_and_frees_the_cards(make_node: Make) -> None:
    node = await make_node()
    image = f"{REGISTRY}/tuneplane-test/none:{unique('tag')}"
    ref, answer = await node.launch(gpus=2, image=image)
    assert answer["phase"] == "pulling"

    state = await node.wait_for(ref, "status", "dead")

    assert state["pending_phase"] == "failed"
    assert "manifest unknown" in state["pending_error"]
    health = await node.health()
    assert health["gpus_free"] == 4
    assert health["pending_pulls"][ref]["phase"] == "failed"
    assert "manifest unknown" in health["pending_pulls"][ref]["error"]


async def test_two_launches_of_one_image_share_one_pull(
    make_node: Make, docker_runtime: TrackingRuntime, proxy: ThrottlingProxy
) -> None:
    image = await slow_image(docker_runtime, proxy, rate=3_000_000)
    node = await make_node(runtime=docker_runtime)
    first, _ = await node.launch(gpus=1, image=image)
    second, _ = await node.launch(gpus=1, image=image)

    assert len(node.app[LAUNCHES].pulls) == 1
    assert (await node.health())["gpus_reserved"] == 2
    await node.wait_for(first, "status", "running")
    await node.wait_for(second, "status", "running")
    assert (await node.health())["gpus_free"] == 2
    await forget_image(docker_runtime, image)


async def test_a_pending_launch_is_idempotent(
    make_node: Make, docker_runtime: TrackingRuntime, proxy: ThrottlingProxy
) -> None:
    image = await slow_image(docker_runtime, proxy, rate=100_000)
    node = await make_node(runtime=docker_runtime)
    run_id = unique("pend")
    ref, _ = await node.launch(gpus=1, image=image, run_id=run_id)
    _, again = await node.launch(gpus=1, image=image, run_id=run_id)

    assert again == {"phase": "pulling", "idempotent": True, "image": image}
    assert (await node.health())["gpus_reserved"] == 1
    await node.stop(ref)


# --- stop at every moment of a pending launch -----------------------------------------


async def assert_nothing_left(node: Console, runtime: TrackingRuntime, ref: str) -> None:
    assert not (await runtime.inspect(ref)).exists
    assert (await node.state(ref))["exists"] is False
    health = await node.health()
    assert health["gpus_free"] == 4 and health["gpus_reserved"] == 0
    assert ref not in health["pending_pulls"]
    assert len(node.app[LAUNCHES].locks) == 0


async def test_stop_before_the_pull_task_first_runs(
    make_node: Make, docker_runtime: TrackingRuntime, proxy: ThrottlingProxy
) -> None:
    from tuneplane_node.wire import parse_launch

    image = await slow_image(docker_runtime, proxy, rate=100_000)
    node = await make_node(runtime=docker_runtime)
    launches = node.app[LAUNCHES]
    run_id = unique("early")
    request = parse_launch({"run_id": run_id, "requested_gpus": 2, "container": {"image": image}})

    await launches.launch(request)
    task = launches.records[request.ref].task
    await launches.stop(request.ref, 1)  # no await in between has let the task run

    assert task is not None and task.cancelled()
    assert proxy.connections == 0  # the pull never began
    await assert_nothing_left(node, docker_runtime, request.ref)


async def test_stop_during_the_pull(
    make_node: Make, docker_runtime: TrackingRuntime, proxy: ThrottlingProxy
) -> None:
    image = await slow_image(docker_runtime, proxy, rate=100_000)
    node = await make_node(runtime=docker_runtime)
    ref, _ = await node.launch(gpus=2, image=image)
    await wait_until(lambda: proxy.bytes_sent > 100_000)

    await node.stop(ref)

    await assert_nothing_left(node, docker_runtime, ref)
    assert node.app[LAUNCHES].pulls == {}
    await wait_until(lambda: proxy.open_connections == 0, timeout=10)  # download abandoned
    assert not await docker_runtime.image_exists(image)


class SlowStartRuntime(TrackingRuntime):
    """Holds a container start open for a while, so a stop can land in the middle."""

    def __init__(self, runtime: TrackingRuntime) -> None:
        super().__init__(runtime.inner)
        self.made = runtime.made
        self.creating = asyncio.Event()

    async def run(self, spec):  # type: ignore[no-untyped-def]
        self.creating.set()
        container_id = await super().run(spec)
        await asyncio.sleep(1.0)  # the engine has made it; the launch has not heard yet
        return container_id


async def test_stop_while_the_container_is_being_created(
    make_node: Make, docker_runtime: TrackingRuntime, proxy: ThrottlingProxy
) -> None:
    image = await slow_image(docker_runtime, proxy, rate=5_000_000)
    runtime = SlowStartRuntime(docker_runtime)
    node = await make_node(runtime=runtime)
    ref, _ = await node.launch(gpus=2, image=image)
    await asyncio.wait_for(runtime.creating.wait(), timeout=60)
    await asyncio.sleep(0.3)
    assert (await docker_runtime.inspect(ref)).exists  # it is there, mid-launch

    await node.stop(ref)

    await assert_nothing_left(node, docker_runtime, ref)
    await forget_image(docker_runtime, image)


async def test_stop_after_the_pulled_job_started(
    make_node: Make, docker_runtime: TrackingRuntime, proxy: ThrottlingProxy
) -> None:
    image = await slow_image(docker_runtime, proxy, rate=5_000_000)
    node = await make_node(runtime=docker_runtime)
    ref, _ = await node.launch(gpus=2, image=image)
    await node.wait_for(ref, "status", "running")

    await node.stop(ref, timeout=1)

    state = await node.state(ref)
    assert state["status"] == "exited"
    health = await node.health()
    assert health["gpus_free"] == 4 and health["by_job"] == {}
    await forget_image(docker_runtime, image)


async def test_control_locks_do_not_accumulate(make_node: Make) -> None:
    node = await make_node()
    refs = [(await node.launch(["/bin/true"]))[0] for _ in range(5)]
    for ref in refs:
        await node.remove(ref)
    assert len(node.app[LAUNCHES].locks) == 0


async def test_logs_of_a_missing_job_is_a_sentence(make_node: Make) -> None:
    node = await make_node()
    assert "does not exist" in await node.logs("tuneplane-nothing")


@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_logs_tail_through_the_api(make_node: Make, engine: str) -> None:
    node = await make_node(engine)
    ref, _ = await node.launch(["/bin/sh", "-c", "for i in 1 2 3 4; do echo n$i; done"])
    await node.wait_for(ref, "status", "exited")
    lines = (await node.logs(ref, tail=2)).splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["n3", "n4"]


async def test_a_failed_record_is_dropped_after_half_an_hour(make_node: Make) -> None:
    node = await make_node()
    ref, _ = await node.launch(image=f"{REGISTRY}/tuneplane-test/none:{unique('tag')}")
    await node.wait_for(ref, "status", "dead")
    launches = node.app[LAUNCHES]
    now = time.monotonic()

    launches.clock = lambda: now + 1700
    assert (await node.state(ref))["status"] == "dead"  # still there for the console
    launches.clock = lambda: now + 1801

    assert (await node.state(ref))["exists"] is False
    assert ref not in (await node.health())["pending_pulls"]


async def test_the_process_runtime_serves_the_same_api(aiohttp_client: Any, tmp_path: Any) -> None:
    from tuneplane_node.gpu.allocator import GpuAllocator
    from tuneplane_node.gpu.probe import NoDriverProbe
    from tuneplane_node.runtime.process import ProcessRuntime

    settings = engine_settings(
        "process", node_token=TOKEN, local_gpu_count=2, node_state_dir=tmp_path
    )
    runtime = ProcessRuntime(settings)
    allocator = GpuAllocator(runtime, settings, probe=NoDriverProbe("test"))
    node = Console(
        await aiohttp_client(create_node_app(settings, runtime=runtime, allocator=allocator))
    )
    try:
        ref, answer = await node.launch(
            ["/bin/sh", "-c", 'echo "cards=$CUDA_VISIBLE_DEVICES"; sleep 30'], gpus=1
        )
        assert answer["phase"] == "running" and answer["gpus"] == [0]
        assert (await node.state(ref))["status"] == "running"
        assert (await node.health())["by_job"] == {"0": ref.removeprefix("tuneplane-")}
        await asyncio.sleep(0.5)
        assert "cards=0" in await node.logs(ref)

        await node.stop(ref, timeout=2)
        assert (await node.state(ref))["status"] == "exited"
        await node.remove(ref)
        assert (await node.state(ref))["exists"] is False
    finally:
        await runtime.close()


async def test_a_launch_over_a_foreign_container_is_a_409(
    make_node: Make, docker_runtime: TrackingRuntime
) -> None:
    node = await make_node(runtime=docker_runtime)
    foreign = unique("foreign")
    await docker_runtime.run(
        ContainerSpec(name=foreign, image=IMAGE, command=("/bin/sleep", "300"))
    )

    _, body = await node.launch(run_id="hijack", name=foreign, expect=409)

    assert "already in use" in body["detail"]
    assert (await docker_runtime.inspect(foreign)).run_id is None  # untouched


async def test_an_engine_refusal_is_a_502_with_its_words_and_frees_the_cards(
    make_node: Make,
) -> None:
    node = await make_node()
    ref, body = await node.launch(
        gpus=2, mounts=[["/nonexistent/tuneplane-data", "/data", True]], expect=502
    )
    assert "docker refused to run" in body["detail"]
    assert "/nonexistent/tuneplane-data" in body["detail"]
    assert (await node.state(ref))["exists"] is False
    assert (await node.health())["gpus_free"] == 4


async def test_health_reports_the_storage_root_disk_and_the_cache(
    make_node: Make, tmp_path: Any
) -> None:
    node = await make_node()
    health = await node.health()

    assert health["ok"] is True and health["protocol"] == 1
    assert health["runtime"]["name"] == "docker" and health["runtime"]["version"]
    assert health["disk"]["path"] == str(tmp_path.resolve())
    assert health["disk"]["free_gib"] > 0 and 0 <= health["disk"]["used_pct"] <= 100
    assert health["state_cache"]["synced"] is True
    assert health["gpu_probe"] == {"source": "none", "ok": False, "error": "test"}
