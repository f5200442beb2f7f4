"""Answers a console's program can act on, over HTTP on the fake engine: each error's
``code`` and bad fields, the ref a launch made, unknown fields refused on every verb, and
the features and protocols the node says it has."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import IMAGE, MakeFakeNode
from tests.fakes.runtime import FakeRuntime
from tests.support.console import console_0315
from tuneplane_node.daemon.routes import OPERATIONS, document
from tuneplane_node.wire.values import container_name

# Slow: every verb's refusals end to end over a real socket.
pytestmark = pytest.mark.slow


async def test_a_bad_launch_lists_every_bad_field_beside_the_first_ones_detail(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    body = console_0315("r-1", image="UPPER/Case", cpu_limit=-1, env={"A=B": "x"})
    status, answer = await node.call("POST", "/node/v1/launch", json={**body, "priority": 9})
    assert (status, answer["code"]) == (422, "unknown_field")
    assert answer["detail"].startswith("priority: unknown field; known: run_id,")
    assert [(e["field"], e["code"]) for e in answer["errors"]] == [
        ("priority", "unknown_field"),
        ("container.image", "invalid_field"),
        ("container.env.A=B", "invalid_field"),
        ("container.cpu_limit", "out_of_range"),
    ]
    assert answer["errors"][1]["detail"] == (
        "container.image: must be an image reference like registry/name:tag (lower case)"
    )
    assert fake.calls["run"] == 0 and not fake.containers


async def test_a_refusal_by_the_service_carries_its_code_and_field(
    fake_node: MakeFakeNode,
) -> None:
    node = await fake_node()
    mounted = console_0315("r-2", mounts=[["/nonexistent/data", "/data", True]])
    status, answer = await node.call("POST", "/node/v1/launch", json=mounted)
    assert (status, answer["code"]) == (422, "invalid_field")
    assert [(e["field"], e["code"]) for e in answer["errors"]] == [
        ("container.mounts[0]", "invalid_field")
    ]
    status, answer = await node.call("POST", "/node/v1/signal", json={"ref": "nope", "signal": 10})
    assert (status, answer["code"]) == (409, "not_running")
    assert "errors" not in answer


async def test_every_launch_answer_names_the_ref_it_made(fake_node: MakeFakeNode) -> None:
    node = await fake_node()
    run_id = "team/42 #3"  # outside [a-zA-Z0-9_.-]: the name is hashed
    made = await node.ok("POST", "/node/v1/launch", json=console_0315(run_id))
    again = await node.ok("POST", "/node/v1/launch", json=console_0315(run_id))
    assert made["ref"] == again["ref"] == container_name(run_id) != f"tuneplane-{run_id}"
    assert (await node.state(made["ref"]))["labels"]["tuneplane.run-id"] == run_id
    await node.remove(made["ref"])


def typo_request(path: str, method: str) -> dict[str, Any]:
    if method == "get":  # the logs query needs its ref; the jobs query has none
        ref = {"ref": "tuneplane-x"} if path.endswith("/logs") else {}
        return {"params": {**ref, "timout": "600"}}
    return {"json": {"timout": 600}}


VERBS = sorted(
    (op.method, op.path) for op in OPERATIONS if op.body is not None or op.query is not None
)


@pytest.mark.parametrize(("method", "path"), VERBS)
async def test_every_verb_refuses_an_unknown_field_by_name(
    fake_node: MakeFakeNode, fake: FakeRuntime, method: str, path: str
) -> None:
    """``stop {"timout": 600}`` must not become a SIGKILL after 30 s."""
    node = await fake_node()
    status, answer = await node.call(method.upper(), path, **typo_request(path, method))
    assert (status, answer["code"]) == (422, "unknown_field")
    assert answer["errors"][0] == {
        "field": "timout",
        "code": "unknown_field",
        "detail": answer["detail"],
    }
    assert answer["detail"].startswith("timout: unknown field; known: ")
    assert fake.calls["run"] == 0


async def test_0315s_bodies_keep_working(fake_node: MakeFakeNode) -> None:
    node = await fake_node()
    ref, _ = await node.launch(image=IMAGE)
    assert await node.ok("POST", "/node/v1/observe", json={"refs": [ref]})
    assert await node.ok("POST", "/node/v1/stop", json={"ref": ref, "timeout": 5}) == {"ok": True}
    assert await node.ok("POST", "/node/v1/reap", json={"max_age_s": 3600}) == {"removed": 0}
    assert await node.ok("POST", "/node/v1/remove", json={"ref": ref}) == {"ok": True}
    assert await node.ok("GET", "/node/v1/logs", params={"ref": ref, "tail": "5"}) is not None


async def test_health_and_inventory_say_the_features_of_the_routes_and_the_protocols(
    fake_node: MakeFakeNode,
) -> None:
    node = await fake_node()
    served = {op.get("x-feature") for ops in document()["paths"].values() for op in ops.values()}
    health = await node.health()
    inventory = await node.ok("GET", "/node/v1/inventory")
    for answer in (health, inventory):
        assert answer["protocols"] == [1]
        assert set(answer["features"]) == served - {None}
        assert {"stats", "follow", "cordon", "signal"} <= set(answer["features"])
