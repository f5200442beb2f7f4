"""The fabric network (``TUNEPLANE_FABRICS`` with an interface) on a real engine, as the
jobs see it. One end of a veth pair stands in for the fabric's netdev (this machine's
kernel has no ``dummy`` nor ``ipvlan`` link type; ``macvlan`` on a veth works). Docker's
engine is one of the test's own in a network namespace of its own (`ThrowawayDocker`
``netns=True``), where the pair is made, so the machine's interfaces are never touched.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import podman
import pytest

from tests.conftest import MakeNode
from tests.support.console import Console
from tests.support.engines import engine_missing, podman_url
from tests.support.throwaway import ThrowawayDocker
from tuneplane_node import fabrics
from tuneplane_node.runtime.engines.networks.jobnetwork import LABEL_NODE_NETWORK
from tuneplane_node.wire.values import LABEL_FABRIC_ADDRESS

pytestmark = pytest.mark.engine
FABRIC_IF = "fab0"
SUBNET, RANGE = "10.77.0.0/16", "10.77.3.0/30"  # 10.77.3.0 to .3: four addresses
SAY = ["/bin/sh", "-c", "echo if=$NCCL_SOCKET_IFNAME; ip -4 -o addr show; sleep 600"]


def fabric(**changes: Any) -> list[dict[str, Any]]:
    entry = {"name": "ib-t", "hcas": ["mlx5_0"], "interface": FABRIC_IF, "network": "macvlan"}
    return [{**entry, "subnet": SUBNET, "range": RANGE, **changes}]


@pytest.fixture(autouse=True)
def an_hca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fabric's HCA, which the daemon checks at start, in a sysfs of the test's own:
    this machine has none (the fabric network needs no HCA, only its interface)."""
    (tmp_path / "ib" / "mlx5_0").mkdir(parents=True)
    check = functools.partial(fabrics.check_fabrics, sysfs=tmp_path / "ib")
    monkeypatch.setattr(fabrics, "check_fabrics", check)


@pytest.fixture
def fabric_docker(netns_docker: ThrowawayDocker) -> ThrowawayDocker:
    """A Docker engine in a network namespace of its own, with a veth 'fabric' there (the
    namespace, and the pair in it, go with the engine)."""
    for command in (
        ["ip", "-n", netns_docker.namespace, "link", "add", FABRIC_IF, "type", "veth",
         "peer", "name", f"{FABRIC_IF}p"],
        ["ip", "-n", netns_docker.namespace, "link", "set", FABRIC_IF, "up"],
        ["ip", "-n", netns_docker.namespace, "link", "set", f"{FABRIC_IF}p", "up"],
    ):  # fmt: skip
        subprocess.run(command, check=True, capture_output=True)
    return netns_docker


async def seen(node: Console, ref: str) -> tuple[str, str]:
    """The job's NCCL_SOCKET_IFNAME, and its address on that interface, from inside it."""
    for _ in range(100):
        logs = await node.logs(ref)
        interface = re.search(r" if=(\S+)", logs)
        found = interface and re.search(rf"\d+: {interface.group(1)}\S*\s+inet (\S+)/", logs)
        if interface is not None and found:  # the lines arrive one by one: wait for both
            return interface.group(1), found.group(1)
        await asyncio.sleep(0.2)
    raise AssertionError(f"{ref} said nothing: {await node.logs(ref)}")


async def fabric_jobs_keep_their_own_addresses(
    make_node: MakeNode, engine: str, fabric_name: str, **settings: Any
) -> tuple[str, str]:
    """Two jobs asking for host (as 0.3.15) with 0 of 4 cards, a daemon with nothing in
    memory, a third: distinct addresses from the range, seen inside as on eth0, kept.
    The first job and its address."""
    node = await make_node(engine, **settings)
    first, _ = await node.launch(SAY)
    second, _ = await node.launch(SAY)
    state = await node.wait_for(first, "status", "running")

    assert state["network"] == f"fabric:{fabric_name}"
    one, two = await seen(node, first), await seen(node, second)
    assert one[0] == two[0] == "eth0"
    assert one[1] != two[1]
    assert {one[1], two[1]} <= {"10.77.3.0", "10.77.3.1", "10.77.3.2", "10.77.3.3"}
    assert state["labels"][LABEL_FABRIC_ADDRESS] == one[1]

    # A daemon with nothing in memory: the addresses are read from the containers.
    again = await make_node(engine, **settings)
    assert (await again.state(first))["labels"][LABEL_FABRIC_ADDRESS] == one[1]
    third, _ = await again.launch(SAY)
    assert (await seen(again, third))[1] not in {one[1], two[1]}
    assert (await seen(again, first))[1] == one[1]
    return first, one[1]


@pytest.mark.own_engines
async def test_docker_fabric_jobs_get_their_own_addresses_kept_across_a_restart(
    fabric_docker: ThrowawayDocker, make_node: MakeNode
) -> None:
    settings = {"docker_host": fabric_docker.host, "fabrics": fabric()}
    first = await fabric_jobs_keep_their_own_addresses(make_node, "docker", "ib-t", **settings)
    now = fabric_docker.docker("exec", first[0], "ip", "-4", "-o", "addr", "show", "eth0")
    assert f"inet {first[1]}/16" in now.stdout.decode()  # asked of the job now, after the restart
    network = json.loads(fabric_docker.docker("network", "inspect", "tuneplane-fabric-ib-t").stdout)
    assert network[0]["Labels"] == {LABEL_NODE_NETWORK: "fabric"}
    assert network[0]["Driver"] == "macvlan"
    assert network[0]["Options"]["parent"] == FABRIC_IF


@pytest.mark.own_engines
async def test_docker_a_full_range_is_a_409_of_its_own(
    fabric_docker: ThrowawayDocker, make_node: MakeNode
) -> None:
    small = fabric(range="10.77.3.4/31")  # two addresses
    node = await make_node("docker", docker_host=fabric_docker.host, fabrics=small)
    await node.launch()
    await node.launch()
    _, answer = await node.launch(expect=409)
    assert answer["code"] == "fabric_addresses_exhausted"
    assert "10.77.3.4/31" in answer["detail"]


@pytest.fixture
async def podman_fabric() -> AsyncIterator[dict[str, Any]]:
    """A veth 'fabric' of a unique name in the machine's namespace (where the suite's
    podman service runs) and a fabric of a unique name (podman services share the CNI
    configuration); its network and the pair are removed at teardown, after the jobs."""
    tag = uuid.uuid4().hex[:6]
    interface, name = f"tpf{tag}", f"ib-{tag}"
    made = [
        ["ip", "link", "add", interface, "type", "veth", "peer", "name", f"{interface}p"],
        ["ip", "link", "set", interface, "up"],
        ["ip", "link", "set", f"{interface}p", "up"],
    ]
    try:
        for command in made:
            subprocess.run(command, check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        engine_missing("a veth interface for podman's fabric network", str(exc))
    try:
        yield {"fabric_name": name, "fabrics": fabric(name=name, interface=interface)}
    finally:
        with podman.PodmanClient(base_url=podman_url()) as client:
            if client.networks.exists(f"tuneplane-fabric-{name}"):
                client.networks.get(f"tuneplane-fabric-{name}").remove(force=True)
        subprocess.run(["ip", "link", "del", interface], check=False, capture_output=True)


async def test_podman_fabric_jobs_get_their_own_addresses_kept_across_a_restart(
    podman_fabric: dict[str, Any], make_node: MakeNode
) -> None:
    await fabric_jobs_keep_their_own_addresses(make_node, "podman", **podman_fabric)


@pytest.mark.own_engines
async def test_docker_a_foreign_network_of_the_fabrics_name_is_refused_never_used(
    fabric_docker: ThrowawayDocker, make_node: MakeNode
) -> None:
    fabric_docker.docker("network", "create", "--subnet", SUBNET, "tuneplane-fabric-ib-t")
    node = await make_node("docker", docker_host=fabric_docker.host, fabrics=fabric())
    _, answer = await node.launch(expect=502)

    assert answer["code"] == "engine_refused"
    assert "network tuneplane-fabric-ib-t exists and it is not the node's" in answer["detail"]
    assert fabric_docker.docker("ps", "-aq").stdout.split() == []  # nothing made on it
