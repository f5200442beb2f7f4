"""The image verbs over a real socket, in front of the in-memory engine: a prefetch and
its sharing with launches, GET /node/v1/images, cordon, the refusals. No engine needed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import IMAGE, MakeFakeNode
from tests.fakes.clock import FakeClock
from tests.fakes.runtime import FakeRuntime
from tests.support.console import HEADERS, Console, console_0315
from tests.support.waiting import settle
from tuneplane_node.daemon.state import NODE
from tuneplane_node.jobs.images.keeper import PrivateImage
from tuneplane_node.jobs.words import FAILED_RECORD_TTL_S, WINDOW_S
from tuneplane_node.references import ImageName

# Slow: prefetch and the image list end to end over a real socket.
pytestmark = pytest.mark.slow

BIG = "registry.test/big:1"
PULL = "/node/v1/images/pull"
PULL_KEYS = {
    "image",
    "phase",
    "bytes_done",
    "bytes_total",
    "layers_done",
    "layers_total",
    "rate_bytes_per_s",
    "eta_s",
    "started_at",
    "waiting",
    "error",
}


async def images(node: Console) -> Any:
    return await node.ok("GET", "/node/v1/images")


async def prefetch(node: Console, image: str = BIG, **fields: Any) -> tuple[int, Any]:
    return await node.call("POST", PULL, json={"image": image, **fields})


async def test_a_prefetch_shows_its_rate_and_a_launch_meanwhile_shares_its_download(
    fake_node: MakeFakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await fake_node()

    assert await prefetch(node) == (202, {"image": BIG, "phase": "pulling"})
    await fake.pulling.wait()
    [pull] = (await images(node))["pulls"]
    assert set(pull) == PULL_KEYS
    assert (pull["phase"], pull["rate_bytes_per_s"], pull["eta_s"]) == ("pulling", None, None)

    clock.advance(4)
    fake.pull_of(BIG).report(4_000_000, 10_000_000, 1, 3)
    name = "tuneplane-r-1"
    launched = await node.ok("POST", "/node/v1/launch", json=console_0315("r-1", image=BIG))
    assert launched["phase"] == "pulling"
    [pull] = (await images(node))["pulls"]
    assert (pull["bytes_done"], pull["bytes_total"], pull["layers_total"]) == (4e6, 1e7, 3)
    assert pull["rate_bytes_per_s"] == 1_000_000.0  # 4 MB in 4 s
    assert pull["eta_s"] == 6.0  # 6 MB to come at that rate
    assert pull["waiting"] == [name]
    state = await node.state(name)
    assert (state["pending_rate_bytes_per_s"], state["pending_eta_s"]) == (1e6, 6.0)
    assert (await prefetch(node))[0] == 202  # again: the same pull, not a second

    fake.pull_of(BIG).finish()
    await node.wait_for(name, "status", "running")

    assert fake.calls["pull"] == 1  # one download for the prefetch and the launch
    listed = await images(node)
    assert listed["pulls"] == []
    [image] = [i for i in listed["images"] if i["image"] == BIG]
    assert image["id"] == fake.image_id(BIG) and image["size_bytes"] == 1000
    assert image["in_use_by"] == [name] and image["private"] is False
    assert image["pulled_at"] and image["last_used_at"]
    assert await prefetch(node) == (200, {"image": BIG, "phase": "present"})


async def test_the_rate_is_over_a_sliding_window_and_falls_when_the_pull_stalls(
    fake_node: MakeFakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await fake_node()
    await prefetch(node)
    await fake.pulling.wait()
    clock.advance(2)
    fake.pull_of(BIG).report(2_000_000, 10_000_000)
    clock.advance(WINDOW_S * 2)  # nothing more: a stalled pull

    [pull] = (await images(node))["pulls"]
    assert pull["rate_bytes_per_s"] == 0 and pull["eta_s"] is None
    fake.pull_of(BIG).finish()
    await settle()


async def test_only_the_nodes_images_are_listed(fake_node: MakeFakeNode, fake: FakeRuntime) -> None:
    node = await fake_node()
    fake.images.add("registry.test/operators-own:1")
    assert (await images(node))["images"] == []

    await node.ok("POST", "/node/v1/launch", json=console_0315("r-2", image=IMAGE))
    [image] = (await images(node))["images"]
    assert (image["image"], image["pulled_at"]) == (IMAGE, None)  # here before: not pulled
    assert image["in_use_by"] == ["tuneplane-r-2"] and image["last_used_at"]


async def test_cordon_does_not_refuse_a_prefetch(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    await node.ok("POST", "/node/v1/cordon", json={"reason": "maintenance"})

    assert await prefetch(node) == (202, {"image": BIG, "phase": "pulling"})
    await fake.pulling.wait()
    fake.pull_of(BIG).finish()
    await settle()
    assert await prefetch(node) == (200, {"image": BIG, "phase": "present"})


async def test_a_failed_prefetch_keeps_its_error_as_long_as_a_failed_launch(
    fake_node: MakeFakeNode, fake: FakeRuntime, clock: FakeClock
) -> None:
    node = await fake_node()
    await prefetch(node)
    await node.ok("POST", "/node/v1/launch", json=console_0315("r-3", image=BIG))
    await fake.pulling.wait()
    fake.pull_of(BIG).fail("denied: requested access to the resource is denied")

    failed = await node.failed("tuneplane-r-3")
    [pull] = (await images(node))["pulls"]
    assert pull["phase"] == "failed" and pull["error"] == failed["pending_error"]
    assert "denied" in pull["error"]

    clock.advance(FAILED_RECORD_TTL_S + 1)
    assert (await images(node))["pulls"] == []
    assert (await node.state("tuneplane-r-3"))["exists"] is False  # both expired alike
    assert (await prefetch(node))[0] == 202  # a retry pulls again


async def test_pull_policy_always_pulls_a_present_image_again(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    assert (await prefetch(node, IMAGE))[1]["phase"] == "present"
    assert (await prefetch(node, IMAGE, pull_policy=""))[1]["phase"] == "present"

    assert await prefetch(node, IMAGE, pull_policy="always") == (
        202,
        {"image": IMAGE, "phase": "pulling"},
    )
    await fake.pulling.wait()
    fake.pull_of(IMAGE).finish()
    await settle()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "image"),
        ({"image": "UPPER/Case"}, "image"),
        ({"image": BIG, "tag": "x"}, "tag"),
        ({"image": BIG, "registry_auth": {"username": "u"}}, "registry_auth"),
        ({"image": BIG, "registry_auth": {"identity_token": ""}}, "registry_auth.identity_token"),
        ({"image": BIG, "pull_policy": "never"}, "pull_policy"),
    ],
)
async def test_a_bad_prefetch_is_a_422_naming_its_field(
    fake_node: MakeFakeNode, fake: FakeRuntime, body: dict[str, Any], field: str
) -> None:
    node = await fake_node()

    status, answer = await node.call("POST", PULL, json=body)

    assert status == 422 and answer["detail"].startswith(f"{field}: "), answer
    assert fake.calls["pull"] == 0


async def test_a_prefetch_pull_is_counted_in_the_metrics(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    await prefetch(node)
    await fake.pulling.wait()
    fake.pull_of(BIG).report(300, 300, 1, 1)
    fake.pull_of(BIG).finish()
    await settle()

    async with node.client.get("/metrics", headers=HEADERS) as response:
        text = await response.text()
    assert 'tuneplane_node_image_pulls_total{result="ok"} 1.0' in text
    assert "tuneplane_node_pull_bytes_total 300.0" in text


async def test_a_present_private_image_is_no_free_pass_for_a_prefetch_either(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    keeper = node.app[NODE].images
    keeper.record.images[ImageName.parse(IMAGE).repository] = PrivateImage("registry.test")

    status, answer = await prefetch(node, IMAGE)

    assert status == 403 and IMAGE in answer["detail"]
    assert fake.calls["pull"] == 0
    assert (await images(node))["images"] == []  # neither pulled nor used by the node


async def test_what_the_node_pulled_is_known_after_a_restart(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    await prefetch(node)
    await fake.pulling.wait()
    fake.pull_of(BIG).finish()
    await settle()
    [before] = (await images(node))["images"]
    await node.app[NODE].ledger.flush()

    again = await fake_node()  # a second daemon on the same state directory

    assert (await images(again))["images"] == [before]
    assert before["pulled_at"] is not None
