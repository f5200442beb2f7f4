"""The daemon over a real socket, in front of the in-memory engine: the guard, the error
shapes, and every verb as the console calls it. No engine needed."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.conftest import IMAGE, MakeFakeNode, fake_settings
from tests.fakes.runtime import FakeRuntime
from tests.support import console
from tests.support.console import HEADERS, TOKEN
from tests.support.nodes import storage_root
from tests.support.waiting import settle, wait_until
from tuneplane_node.daemon.app import create_node_app
from tuneplane_node.daemon.routes import features
from tuneplane_node.daemon.state import HEALTH_STATUS, MEMOS, NODE
from tuneplane_node.errors import ConfigError
from tuneplane_node.settings import load_settings
from tuneplane_node.wire import PROTOCOL_HEADER

# Slow: the daemon end to end over a real socket.
pytestmark = pytest.mark.slow

MISSING = "registry.test/missing:1"

# --- the guard -------------------------------------------------------------------------------


def test_the_daemon_refuses_to_start_without_a_token(tmp_path: Any) -> None:
    for token in (None, ""):
        with pytest.raises(ConfigError, match="TUNEPLANE_NODE_TOKEN"):
            create_node_app(fake_settings(tmp_path, node_token=token))
    for token in ("   ", "change-me ", "tab\there"):  # HTTP would strip or split it
        with pytest.raises(ConfigError, match="TUNEPLANE_NODE_TOKEN: must be printable ASCII"):
            load_settings(node_token=token, storage_root=tmp_path)


async def test_healthz_needs_no_token_and_says_nothing_else(fake_node: MakeFakeNode) -> None:
    node = await fake_node()
    assert await node.call("GET", "/healthz", headers={}) == (200, {"ok": True})


@pytest.mark.parametrize(
    ("headers", "status", "detail", "code"),
    [
        ({PROTOCOL_HEADER: "1"}, 401, "invalid node token", "unauthorized"),
        (
            {"Authorization": "Bearer wrong", PROTOCOL_HEADER: "1"},
            401,
            "invalid node token",
            "unauthorized",
        ),
        ({"Authorization": TOKEN, PROTOCOL_HEADER: "1"}, 401, "invalid node token", "unauthorized"),
        (
            {"Authorization": f"Bearer {TOKEN}"},
            400,
            f"missing {PROTOCOL_HEADER} header; this node speaks protocol 1",
            "missing_protocol",
        ),
        (
            {"Authorization": f"Bearer {TOKEN}", PROTOCOL_HEADER: "2"},
            409,
            "wire protocol mismatch: console=2, node=1",
            "protocol_mismatch",
        ),
    ],
)
async def test_every_api_path_needs_the_token_and_the_protocol(
    fake_node: MakeFakeNode,
    fake: FakeRuntime,
    headers: dict[str, str],
    status: int,
    detail: str,
    code: str,
) -> None:
    node = await fake_node()
    for method, path in (
        ("GET", "/node/v1/health"),
        ("POST", "/node/v1/observe"),
        ("POST", "/node/v1/launch"),
        ("GET", "/node/v1/nonexistent"),
    ):
        got = await node.call(method, path, headers=headers, json={"refs": []})
        assert got == (status, {"detail": detail, "code": code})
    assert fake.calls["run"] == 0


@pytest.mark.parametrize(
    ("payload", "status", "detail", "code"),
    [
        (b"{not json", 400, "request body is not valid JSON", "bad_request"),
        (b"[1, 2]", 400, "request body must be a JSON object", "bad_request"),
        (b"\xff\xfe", 400, "request body is not valid JSON", "bad_request"),
        (
            b'{"container": {"image": "x"}}',
            422,
            "run_id: required, a non-empty string",
            "invalid_field",
        ),
        (b'{"run_id": "a"}', 422, "container: required, an object", "invalid_field"),
        (
            b'{"run_id": "a", "container": {"image": "x", "command": "rm -rf /"}}',
            422,
            "container.command",
            "invalid_field",
        ),
        (
            b'{"run_id": "a", "container": {"image": "x", "cpu_limit": "lots"}}',
            422,
            "container.cpu_limit",
            "invalid_field",
        ),
        (
            b'{"run_id": "a", "container": {"image": "x", "comand": ["/bin/true"]}}',
            422,
            "container.comand: unknown field",
            "unknown_field",
        ),
    ],
)
async def test_a_bad_launch_body_gets_a_clear_4xx_and_starts_nothing(
    fake_node: MakeFakeNode,
    fake: FakeRuntime,
    payload: bytes,
    status: int,
    detail: str,
    code: str,
) -> None:
    node = await fake_node()
    got, body = await node.call("POST", "/node/v1/launch", data=payload, headers=HEADERS)
    assert got == status
    assert body["detail"].startswith(detail) and body["code"] == code
    assert sorted(body) == (["code", "detail", "errors"] if got == 422 else ["code", "detail"])
    assert fake.calls["run"] == 0 and not fake.containers


async def test_a_body_over_one_mib_is_refused(fake_node: MakeFakeNode) -> None:
    node = await fake_node()
    payload = b'{"refs": ["' + b"x" * (1024 * 1024) + b'"]}'
    got = await node.call("POST", "/node/v1/observe", data=payload, headers=HEADERS)
    assert got == (
        413,
        {"detail": "request body is larger than 1048576 bytes", "code": "payload_too_large"},
    )


async def test_unknown_paths_and_methods_are_json_errors(fake_node: MakeFakeNode) -> None:
    node = await fake_node()
    assert await node.call("GET", "/node/v1/exec") == (
        404,
        {"detail": "Not Found", "code": "not_found"},
    )
    assert await node.call("GET", "/node/v1/launch") == (
        405,
        {"detail": "Method Not Allowed", "code": "method_not_allowed"},
    )
    # RFC 9110: a 405 names the methods the path has (schemathesis found none, issue 52)
    for method, path, allowed in [
        ("GET", "/node/v1/launch", "POST"),
        ("DELETE", "/node/v1/jobs", "GET,HEAD"),
        ("PUT", "/healthz", "GET,HEAD"),
        ("PATCH", "/metrics", "GET,HEAD"),
    ]:
        async with node.client.request(method, path, headers=HEADERS) as response:
            assert (response.status, response.headers.get("Allow")) == (405, allowed), path


async def test_a_bug_is_a_500_naming_only_its_type(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    ref, _ = await node.launch(image=IMAGE)
    fake.faults["logs"] = KeyError("secret-detail")
    got = await node.call("GET", "/node/v1/logs", params={"ref": ref})
    assert got == (500, {"detail": "internal error: KeyError", "code": "internal"})


async def test_an_engine_that_is_down_is_a_503_and_health_says_so(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    fake.up = False  # its event stream breaks: the node's cache knows nothing now
    status, body = await node.call("POST", "/node/v1/observe", json={"refs": ["tuneplane-a"]})
    assert status == 503 and body["detail"].startswith("engine unreachable: fake: ")
    _, body = await node.launch(["/bin/true"], image=IMAGE, expect=503)
    assert body["detail"].startswith("engine unreachable: fake: ")
    health = await node.health()
    assert health["ok"] is False and health["error"].startswith("event stream broken: ")
    assert health["state_cache"]["synced"] is False
    assert health["free_gpus"] is None  # unknown, not "none free"


# --- the verbs, as a console calls them -------------------------------------------------------


def console_0315(run_id: str, gpus: int = 2, **container: Any) -> dict[str, Any]:
    return console.console_0315(run_id, requested=gpus, **{"image": IMAGE, **container})


async def test_a_0315_console_launches_observes_stops_and_removes(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()

    status, answer = await node.call("POST", "/node/v1/launch", json=console_0315("r-1"))
    assert status == 200, answer
    assert answer == {
        "phase": "running",
        "container_id": fake.containers["tuneplane-r-1"].id[:12],
        "gpus": [0, 1],
        "ref": "tuneplane-r-1",
    }
    again = await node.ok("POST", "/node/v1/launch", json=console_0315("r-1"))
    assert again == {"phase": "running", "idempotent": True, "gpus": [0, 1], "ref": "tuneplane-r-1"}

    state = await node.state("tuneplane-r-1")
    assert (state["exists"], state["status"], state["exit_code"]) == (True, "running", None)
    # Its 2 cards of 4 are not the whole node: under the default (`whole-node`) its
    # `network: host` is the node's job network (`isolated`), which the label says.
    labels = {"tuneplane.run-id": "r-1", "tuneplane.gpus": "0,1", "tuneplane.network": "isolated"}
    assert (state["labels"], state["network"]) == (labels, "isolated")

    assert await node.stop("tuneplane-r-1", timeout=5) == {"ok": True}
    assert fake.signals == [("tuneplane-r-1", "SIGTERM")]
    state = await node.state("tuneplane-r-1")
    assert (state["status"], state["exit_code"]) == ("exited", 143)
    assert await node.remove("tuneplane-r-1") == {"ok": True}
    assert (await node.state("tuneplane-r-1"))["exists"] is False


async def test_a_retry_with_another_spec_is_a_409_naming_the_fields_that_differ(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    """Issue 36, finding 4: a launch of the run with another spec while it ran was
    answered ``idempotent: true`` with the old job. The same spec, in 0.3.15's spelling
    or without its empty fields, stays idempotent."""
    node = await fake_node()
    first = console_0315("r-1", gpus=1, env={"A": "1", "B": "2"})
    await node.ok("POST", "/node/v1/launch", json=first)
    same = {**first, "container": {"image": IMAGE, "command": ["python", "-m", "train"],
                                   "env": {"B": "2", "A": "1"}}}  # fmt: skip
    assert (await node.ok("POST", "/node/v1/launch", json=same))["idempotent"] is True
    other = console_0315("r-1", gpus=2, command=["python", "-m", "eval"])
    status, body = await node.call("POST", "/node/v1/launch", json=other)
    assert (status, body["code"]) == (409, "run_conflict"), body
    assert "(requested_gpus, container.command, container.env differ)" in body["detail"]
    state = await node.state("tuneplane-r-1")
    assert (state["status"], fake.calls["run"]) == ("running", 1)  # nothing done
    pending = console_0315("r-2", image=MISSING)  # a pending launch holds its spec too
    await node.ok("POST", "/node/v1/launch", json=pending)
    pending["container"]["workdir"] = "/work"
    status, body = await node.call("POST", "/node/v1/launch", json=pending)
    assert (status, body["code"]) == (409, "run_conflict")
    assert "(container.workdir differ)" in body["detail"]


async def test_relaunch_false_answers_an_exited_job_as_it_is(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    """Issue 36, finding 4: a retry after the job exited removed its container, exit code
    and logs, and ran it again. ``relaunch: false`` asks for at most once."""
    node = await fake_node()
    launch = console_0315("r-1", gpus=0)
    await node.ok("POST", "/node/v1/launch", json=launch)
    fake.exit("tuneplane-r-1", 3)
    again = await node.ok("POST", "/node/v1/launch", json={**launch, "relaunch": False})
    assert again == {"phase": "exited", "idempotent": True, "exit_code": 3, "ref": "tuneplane-r-1"}
    assert (await node.state("tuneplane-r-1"))["exit_code"] == 3  # nothing removed
    assert fake.calls["run"] == 1
    status, body = await node.call("POST", "/node/v1/launch", json={**launch, "relaunch": 1})
    assert (status, body["errors"][0]["field"]) == (422, "relaunch")
    again = await node.ok("POST", "/node/v1/launch", json={**launch, "relaunch": ""})
    assert again["phase"] == "running" and "idempotent" not in again  # 0.3.15's: launched again
    assert (await node.state("tuneplane-r-1"))["exit_code"] is None


async def test_a_pull_is_followed_through_observe_and_health(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    body = console_0315("r-2", image=MISSING)

    answer = await node.ok("POST", "/node/v1/launch", json=body)
    assert answer == {
        "phase": "pulling",
        "image": MISSING,
        "requested_gpus": 2,
        "ref": "tuneplane-r-2",
    }
    await fake.pulling.wait()
    fake.pull_of(MISSING).report(100, 400)
    state = await node.state("tuneplane-r-2")
    assert (state["status"], state["pending_phase"], state["pending_bytes_done"]) == (
        "created",
        "pulling",
        100,
    )
    health = await node.health()
    assert (health["gpus_reserved"], health["gpus_free"]) == (2, 2)
    assert health["pending_pulls"] == {
        "tuneplane-r-2": {"image": MISSING, "phase": "pulling", "error": None}
    }
    assert await node.logs("tuneplane-r-2") == f"no logs yet: tuneplane-r-2 is pulling ({MISSING})"

    fake.pull_of(MISSING).finish()
    await settle()
    state = await node.state("tuneplane-r-2")
    assert state["status"] == "running" and "pending_phase" not in state
    assert (await node.health())["pending_pulls"] == {}


async def test_logs_tail_through_the_api(fake_node: MakeFakeNode, fake: FakeRuntime) -> None:
    node = await fake_node()
    await node.ok("POST", "/node/v1/launch", json=console_0315("r-3", gpus=0))
    fake.containers["tuneplane-r-3"].output = ["n1", "n2", "n3", "n4"]

    lines = (await node.logs("tuneplane-r-3", tail=2)).splitlines()

    assert [line.split(" ", 1)[1] for line in lines] == ["n3", "n4"]
    assert await node.logs("tuneplane-none") == "no logs: container tuneplane-none does not exist"
    for tail in ("0", "100001", "ten", "²"):
        got, body = await node.call(
            "GET", "/node/v1/logs", params={"ref": "tuneplane-r-3", "tail": tail}
        )
        assert got == 422 and body["detail"].startswith("tail: ")


async def test_a_followed_log_streams_as_text_until_the_job_exits(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    await node.ok("POST", "/node/v1/launch", json=console_0315("r-3", gpus=0))
    job = fake.containers["tuneplane-r-3"]
    job.output = ["n1", "n2", "n3"]
    params = {"ref": "tuneplane-r-3", "follow": "true", "tail": "2"}
    async with node.client.get("/node/v1/logs", params=params, headers=HEADERS) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
        first = await response.content.readuntil(b" n3\n")
        job.output.append("n4")
        second = await response.content.readuntil(b" n4\n")
        fake.exit("tuneplane-r-3", 0)
        assert await response.content.read() == b""  # a clean end

    assert [line.split(b" ", 1)[1] for line in first.splitlines()] == [b"n2", b"n3"]
    assert second.count(b"\n") == 1
    assert await node.follow("tuneplane-none") == "no logs: container tuneplane-none does not exist"
    for follow in ("yes", "2", "on"):
        got, body = await node.call(
            "GET", "/node/v1/logs", params={"ref": "tuneplane-r-3", "follow": follow}
        )
        assert got == 422 and body["detail"].startswith("follow: ")
    assert "logs" in await node.ok("GET", "/node/v1/logs", params={**params, "follow": "0"})


async def test_a_follow_the_engine_ends_while_the_job_runs_is_cut_not_ended(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    """A clean end of a followed log means the job stopped; an engine that ends the
    stream of a running job makes the answer break off, so no client takes it for the
    exit (it checks observe and follows again)."""
    node = await fake_node()
    node.app[NODE].reader.end_grace_s = 0.2
    await node.ok("POST", "/node/v1/launch", json=console_0315("r-5", gpus=0))
    fake.containers["tuneplane-r-5"].output = ["n1"]
    fake.end_follows_early = True
    params = {"ref": "tuneplane-r-5", "follow": "1"}
    async with node.client.get("/node/v1/logs", params=params, headers=HEADERS) as response:
        assert response.status == 200
        assert (await response.content.readuntil(b" n1\n")).endswith(b" n1\n")
        await fake.clock.sleeping(0.2)  # the end's grace for the exit to be known
        fake.clock.advance(0.2)
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.content.read()
    assert (await node.state("tuneplane-r-5"))["status"] == "running"


async def test_clients_that_go_away_free_their_follows(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node(runtime_threads=4)  # one follow at a time
    await node.ok("POST", "/node/v1/launch", json=console_0315("r-3", gpus=0))
    fake.containers["tuneplane-r-3"].output = ["n1"]
    params = {"ref": "tuneplane-r-3", "follow": "1"}
    for _ in range(3):
        response = await node.client.get("/node/v1/logs", params=params, headers=HEADERS)
        assert response.status == 200
        await response.content.readuntil(b"n1\n")
        got, body = await node.call("GET", "/node/v1/logs", params=params)
        assert got == 429 and "already following 1 log," in body["detail"]
        response.close()  # the client goes; the job writes nothing more
        await wait_until(lambda: fake.following == 0, timeout=5)


async def test_reap_through_the_api(fake_node: MakeFakeNode, fake: FakeRuntime) -> None:
    node = await fake_node()
    await node.ok("POST", "/node/v1/launch", json=console_0315("r-4", gpus=0))
    fake.exit("tuneplane-r-4", 0)
    fake.clock.advance(10)

    assert await node.ok("POST", "/node/v1/reap", json={}) == {"removed": 0}  # a day by default
    assert await node.ok("POST", "/node/v1/reap", json={"max_age_s": 5}) == {"removed": 1}
    got, body = await node.call("POST", "/node/v1/reap", json={"max_age_s": 10**401})
    assert got == 422 and body["detail"].startswith("max_age_s: ")


async def test_capacity_and_name_refusals_are_409s_with_the_reason(
    fake_node: MakeFakeNode,
) -> None:
    node = await fake_node(local_gpu_count=2)
    got, body = await node.call("POST", "/node/v1/launch", json=console_0315("r-5", gpus=3))
    assert (got, body) == (
        409,
        {
            "detail": "not enough GPUs: asked for 3; 2 free [0, 1], 0 held by jobs",
            "code": "no_capacity",
        },
    )
    await node.ok("POST", "/node/v1/launch", json=console_0315("r-6", name="tuneplane-shared"))
    got, body = await node.call(
        "POST", "/node/v1/launch", json=console_0315("r-7", name="tuneplane-shared")
    )
    assert (got, body) == (
        409,
        {"detail": "the container name tuneplane-shared is held by run r-6", "code": "name_held"},
    )


async def test_health_and_inventory_shapes(fake_node: MakeFakeNode, tmp_path: Any) -> None:
    node = await fake_node(cluster_profile="H100-SXM")

    health = await node.health()
    assert health["ok"] is True and health["protocol"] == 1
    assert health["runtime"] == {"name": "fake", "version": "1.0-fake"}
    assert health["series"] == "h100-sxm"
    assert health["disk"]["path"] == str(storage_root(tmp_path).resolve())
    assert health["state_cache"]["synced"] is True  # the node's cache over the fake engine
    assert health["state_cache"]["containers"] == 0
    assert (health["external"], health["external_pids"]) == ([], {})

    inventory = await node.ok("GET", "/node/v1/inventory")
    assert inventory["runtime"] == "fake://1.0-fake"
    assert inventory["accelerator_series"] == "h100-sxm"
    assert inventory["accelerator_count"] == 4
    assert len(inventory["gpus"]) == 4


# --- private images --------------------------------------------------------------------------


def test_a_malformed_registry_auth_file_stops_the_daemon(tmp_path: Any) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match=r"^TUNEPLANE_REGISTRY_AUTH_FILE: .*is not JSON"):
        create_node_app(fake_settings(tmp_path, registry_auth_file=bad))


async def test_a_private_image_without_credentials_is_a_403_naming_it(
    fake_node: MakeFakeNode, tmp_path: Any
) -> None:
    record = {
        "salt": "00" * 32,
        "images": {"registry.test/trainer": {"registry": "registry.test", "credentials": ["0"]}},
    }
    (tmp_path / "state").mkdir(exist_ok=True)
    (tmp_path / "state" / "private-images.json").write_text(json.dumps(record))
    node = await fake_node()
    ref, answer = await node.launch(image=IMAGE, expect=403)
    assert answer["detail"].startswith(f"no access to the private image {IMAGE}: ")
    assert (await node.state(ref))["exists"] is False


# --- the app's own state -------------------------------------------------------------------


async def test_two_apps_of_one_process_keep_their_own_encoded_answers(
    fake_node: MakeFakeNode,
) -> None:
    """The encoded list and health are an app's own (`MEMOS`): two daemons of one
    process (the tests, an embedder) never answer from, nor evict, the other's."""
    first, second = await fake_node(), await fake_node()
    await first.launch()
    memos = first.app[MEMOS]
    assert memos is not second.app[MEMOS]
    listing = await first.app[NODE].changes.list()
    status = await first.app[HEALTH_STATUS].get()
    kept_list = memos.jobs.jobs(listing, watched=False)
    kept_health = memos.health.encode(status, features=features())
    assert (await second.jobs())["index"] != str(listing.index)  # another list, answered
    await second.ok("GET", "/node/v1/health")
    assert memos.jobs.jobs(listing, watched=False) is kept_list  # still the first's
    assert memos.health.encode(status, features=features()) is kept_health
    assert json.loads(kept_list)["index"] == (await first.jobs())["index"]
