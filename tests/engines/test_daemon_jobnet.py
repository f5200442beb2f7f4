"""The node's job network (``TUNEPLANE_JOB_NETWORK``) on real engines, as the jobs see it.

Docker's isolation is its firewall rules, which the development engines run without
(``--bridge=none --iptables=false``): its tests get an engine of their own with its
bridge and rules, in a network namespace of its own (`ThrowawayDocker` ``netns=True``),
whose veth peer stands for the outside world. Podman's per-job networks, and the rules the
node keeps for them in the engine's namespace, are made on a podman service of the
module's own in such a namespace (`ThrowawayPodman`): the suite's service runs in the
machine's, whose firewall no test touches.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeNode, podman_in_namespaces
from tests.support.console import Console
from tests.support.engines import engine_settings
from tests.support.images import IMAGE
from tests.support.jobs import job, unique
from tests.support.throwaway import ThrowawayDocker, ThrowawayPodman
from tuneplane_node.errors import EngineError
from tuneplane_node.runtime.engines.networks.hostguard import (
    GUARD_PREFIX,
    guarded_bridges,
    guarded_rules,
    podman_rules,
)
from tuneplane_node.runtime.engines.networks.jobnetwork import (
    LABEL_NETWORK_OF,
    LABEL_NETWORK_STORE,
    LABEL_NODE_NETWORK,
    own_network,
)
from tuneplane_node.runtime.engines.podman import PodmanRuntime
from tuneplane_node.wire.values import Mount

pytestmark = [pytest.mark.engine, pytest.mark.own_engines]  # engines in namespaces of their own
PEER_PORT = 9000
SERVE = ["/bin/sh", "-c", f"while true; do echo secret | nc -l -p {PEER_PORT}; done"]


GATEWAY = r"$(ip route | sed -n 's/^default via \([0-9.]*\).*/\1/p')"
"""The job's gateway, in its shell: an address of the machine it runs on."""


def reach(peer: str, **also: str) -> list[str]:
    """A job that tries the peer's port, the outside world and a port its machine serves
    on all its addresses (through its gateway), and says what it read; ``also``: more
    places ("address port") by the word it prints before each answer."""
    tries = {
        "peer": f"{peer} {PEER_PORT}",
        "out": f"{ThrowawayDocker.OUTSIDE} {ThrowawayDocker.OUTSIDE_PORT}",
        "host": f"{GATEWAY} {ThrowawayDocker.HOST_PORT}",
        **also,
    }
    script = "; ".join(
        f"echo {word}=$(nc -w 3 {where} </dev/null 2>&1)" for word, where in tries.items()
    )
    return ["/bin/sh", "-c", script]


def address_of(engine: ThrowawayDocker, ref: str) -> str:
    inspected = json.loads(engine.docker("inspect", ref).stdout)[0]
    networks = inspected["NetworkSettings"]["Networks"]
    (address,) = [net["IPAddress"] for net in networks.values() if net["IPAddress"]]
    return str(address)


async def peer_and_reach(node: Console, engine: ThrowawayDocker) -> str:
    """One job listening, another trying it and the outside: the second's log."""
    server, _ = await node.launch(SERVE, network="bridge")
    await node.wait_for(server, "status", "running")
    peer = address_of(engine, server)
    client, _ = await node.launch(reach(peer), network="bridge")
    state = await node.wait_for(client, "status", "exited", timeout=60)
    assert state["exit_code"] == 0
    return await node.logs(client)


@pytest.mark.parametrize(
    ("kind", "peer", "outside", "host"),
    [
        ("isolated", False, True, False),
        ("sealed", False, False, False),
        ("bridge", True, True, True),  # 0.3.15's: the engine's shared bridge
    ],
)
async def test_docker_jobs_reach_what_their_network_allows(
    netns_docker: ThrowawayDocker,
    make_node: MakeNode,
    kind: str,
    peer: bool,
    outside: bool,
    host: bool,
) -> None:
    """Another job's port, the outside world, and a port of the machine served on all its
    addresses (the node's API on 0.0.0.0 stands for it), each from inside a job."""
    node = await make_node("docker", docker_host=netns_docker.host, job_network=kind)
    logs = await peer_and_reach(node, netns_docker)

    assert ("peer=secret" in logs) is peer, logs
    assert ("out=outside" in logs) is outside, logs
    assert ("host=host" in logs) is host, logs
    ref = node.made[-1] if node.made else ""
    assert (await node.state(ref))["network"] == kind


async def test_docker_makes_its_network_once_labelled_with_no_inter_container_traffic(
    netns_docker: ThrowawayDocker, make_node: MakeNode
) -> None:
    node = await make_node("docker", docker_host=netns_docker.host, job_network="isolated")
    await node.launch(network="bridge")
    await node.launch(network="bridge")

    listed = netns_docker.docker("network", "ls", "-q", "--filter", "name=tuneplane-jobs")
    assert len(listed.stdout.split()) == 1
    network = json.loads(netns_docker.docker("network", "inspect", "tuneplane-jobs").stdout)[0]
    assert network["Labels"] == {LABEL_NODE_NETWORK: "isolated"}
    assert network["Options"]["com.docker.network.bridge.enable_icc"] == "false"
    assert network["Internal"] is False


async def test_a_foreign_network_of_the_nodes_name_is_refused_never_used(
    throwaway_docker: ThrowawayDocker, make_node: MakeNode
) -> None:
    throwaway_docker.docker("network", "create", "tuneplane-jobs")
    node = await make_node("docker", docker_host=throwaway_docker.host, job_network="isolated")
    _, answer = await node.launch(network="bridge", expect=502)

    assert answer["code"] == "engine_refused"
    assert "network tuneplane-jobs exists" in answer["detail"], answer
    listed = throwaway_docker.docker("ps", "-aq").stdout.split()
    assert listed == []  # nothing made on it


# --- podman: a network of each job's own, kept off the host's ports -----------------------


PUBLISHED = 7000
"""The port of the engine's other container (not the node's), published on the host."""


@pytest.fixture(scope="module")
def netns_podman() -> Iterator[ThrowawayPodman]:
    """A podman service in namespaces of its own, for the module's podman tests, with a
    container of someone else's on its default network, publishing `PUBLISHED`."""
    engine = podman_in_namespaces()
    try:
        engine.podman(
            "run", "-d", "--name", "tp-other", "-p", f"{PUBLISHED}:{PUBLISHED}",
            # -ll: a server that answers every connection, never between two (a loop of
            # nc -l refuses the one that comes while it starts again)
            "--entrypoint", "/bin/nc", f"docker.io/{IMAGE}",
            "-ll", "-p", str(PUBLISHED), "-e", "/bin/echo", "other",
        )  # fmt: skip
        yield engine
    finally:
        engine.close()


@pytest.fixture
async def podman(netns_podman: ThrowawayPodman) -> AsyncIterator[PodmanRuntime]:
    runtime = PodmanRuntime(engine_settings("podman", podman_url=netns_podman.host))
    yield runtime
    await runtime.close()


async def make_podman_node(make_node: MakeNode, engine: ThrowawayPodman, kind: str) -> Console:
    return await make_node("podman", podman_url=engine.host, job_network=kind)


async def networks(podman: PodmanRuntime) -> dict[str, dict[str, Any]]:
    def listed() -> Any:
        response = podman.api.get("/networks/json")
        response.raise_for_status()
        return response.json()

    return {net["name"]: net for net in await asyncio.to_thread(listed)}


def host_input() -> str:
    """The machine's own INPUT chain, where no rule of a test's may land."""
    listed = subprocess.run(["iptables", "-w", "5", "-S", "INPUT"], capture_output=True, text=True)
    return listed.stdout


@pytest.mark.parametrize(
    ("kind", "peer", "outside", "host", "other"),
    [
        ("isolated", False, True, False, False),
        ("sealed", False, False, False, False),
        ("bridge", True, True, True, True),  # 0.3.15's: the engine's default network
    ],
)
async def test_podman_jobs_reach_what_their_network_allows(
    netns_podman: ThrowawayPodman,
    make_node: MakeNode,
    podman: PodmanRuntime,
    kind: str,
    peer: bool,
    outside: bool,
    host: bool,
    other: bool,
) -> None:
    """Another job's port, the outside world, a port of the engine's machine served on
    all its addresses (the node's API on 0.0.0.0 stands for it), and the engine's other
    container by its address and by the port it publishes, each from inside a job."""
    node = await make_podman_node(make_node, netns_podman, kind)
    server, _ = await node.launch(SERVE, network="bridge")
    await node.wait_for(server, "status", "running")
    others = {
        "direct": f"{await address(podman, 'tp-other')} {PUBLISHED}",
        "published": f"{GATEWAY} {PUBLISHED}",
    }
    serving = await address(podman, server)
    client, _ = await node.launch(reach(serving, **others), network="bridge")
    state = await node.wait_for(client, "status", "exited", timeout=60)
    logs = await node.logs(client)

    assert state["exit_code"] == 0, logs
    assert ("peer=secret" in logs) is peer, logs
    assert ("out=outside" in logs) is outside, logs
    assert ("host=host" in logs) is host, logs
    assert ("direct=other" in logs) is other, logs
    assert ("published=other" in logs) is other, logs
    assert (await node.state(client))["network"] == kind


async def address(podman: PodmanRuntime, ref: str) -> str:
    inspected = await asyncio.to_thread(lambda: podman.client.containers.get(ref).attrs)
    networks = inspected["NetworkSettings"]["Networks"]
    (found,) = [net["IPAddress"] for net in networks.values() if net["IPAddress"]]
    return str(found)


@pytest.mark.parametrize("kind", ["isolated", "sealed"])
async def test_podman_gives_each_job_a_network_of_its_own_removed_with_it_and_its_rule(
    netns_podman: ThrowawayPodman, make_node: MakeNode, podman: PodmanRuntime, kind: str
) -> None:
    node = await make_podman_node(make_node, netns_podman, kind)
    server, _ = await node.launch(SERVE, network="bridge")
    await node.wait_for(server, "status", "running")
    assert (await node.state(server))["network"] == kind

    made = (await networks(podman))[own_network(server)]
    assert made["labels"][LABEL_NETWORK_OF] == server
    assert made["labels"][LABEL_NODE_NETWORK] == kind
    assert made["options"] == {"isolate": "true"}
    assert made["internal"] is (kind == "sealed")
    assert made["dns_enabled"] is False  # no name server on the gateway to keep open
    bridge = made["network_interface"]
    assert bridge in guarded_bridges(netns_podman.rules())
    assert GUARD_PREFIX not in host_input()  # the engine's namespace, not the machine's

    await node.ok("POST", "/node/v1/remove", json={"ref": server})
    assert own_network(server) not in await networks(podman)
    assert bridge not in guarded_bridges(netns_podman.rules())


async def leftover(podman: PodmanRuntime, owner: str) -> str:
    """A job network whose container is gone, as a killed daemon leaves it; its bridge."""
    body = {
        "name": own_network(owner),
        "driver": "bridge",
        "labels": {
            LABEL_NODE_NETWORK: "isolated",
            LABEL_NETWORK_OF: owner,
            LABEL_NETWORK_STORE: await asyncio.to_thread(podman._data_root),
        },
    }
    created = await asyncio.to_thread(
        lambda: podman.api.post("/networks/create", data=json.dumps(body))
    )
    created.raise_for_status()
    return str(created.json()["network_interface"])


def leave_rules(engine: ThrowawayPodman, bridge: str) -> None:
    """The node's rules for ``bridge``, as a daemon killed before its job's removal left
    them."""
    for rule in podman_rules(bridge):
        subprocess.run([*engine.net.enter(), "iptables", "-w", "5", "-I", *rule], check=True)


async def test_a_killed_daemons_network_and_rules_are_swept_at_start_a_live_jobs_kept(
    netns_podman: ThrowawayPodman, make_node: MakeNode, podman: PodmanRuntime
) -> None:
    first = await make_podman_node(make_node, netns_podman, "isolated")
    kept, _ = await first.launch(SERVE, network="bridge")
    doomed, _ = await first.launch(SERVE, network="bridge")
    for ref in (kept, doomed):
        await first.wait_for(ref, "status", "running")
    made = await networks(podman)
    live, gone = (made[own_network(ref)]["network_interface"] for ref in (kept, doomed))
    # The daemon killed, and the job's container removed meanwhile: its network and its
    # rules are left as the node made them.
    netns_podman.remove_by_hand(doomed)
    assert {live, gone} <= set(guarded_bridges(netns_podman.rules()))

    await make_podman_node(make_node, netns_podman, "isolated")  # the daemon's start
    assert own_network(doomed) not in await networks(podman)
    rules = [bridge for bridge, _ in guarded_rules(netns_podman.rules())]
    assert gone not in rules
    assert rules.count(live) == len(podman_rules(live))  # the live job's, each once


async def test_a_rule_whose_bridge_is_no_networks_is_swept_at_start(
    netns_podman: ThrowawayPodman, make_node: MakeNode
) -> None:
    leave_rules(netns_podman, "cni-podman99")  # its network removed by hand meanwhile
    await make_podman_node(make_node, netns_podman, "isolated")
    assert "cni-podman99" not in guarded_bridges(netns_podman.rules())


PRUNED_WITHIN_S = 10.0


@pytest.fixture
async def leftovers(podman: PodmanRuntime) -> AsyncIterator[list[str]]:
    """The leftover networks a test made: removed at its end if the node did not."""
    made: list[str] = []
    yield made
    for name in made:
        await asyncio.to_thread(podman.api.delete, f"/networks/{name}")


async def test_a_podman_network_whose_job_is_gone_is_pruned_at_the_next_launch(
    netns_podman: ThrowawayPodman,
    make_node: MakeNode,
    podman: PodmanRuntime,
    leftovers: list[str],
) -> None:
    node = await make_podman_node(make_node, netns_podman, "isolated")
    owner = unique("tuneplane-gone")
    leftovers.append(own_network(owner))
    await leftover(podman, owner)
    await node.launch(network="bridge")
    # Pruned after the launch, off its path (issue 56): three engine calls (tens of ms),
    # with a margin for a busy machine.
    deadline = time.monotonic() + PRUNED_WITHIN_S
    while leftovers[0] in await networks(podman):
        assert time.monotonic() < deadline, "the leftover network was not pruned"
        await asyncio.sleep(0.05)


async def test_a_podman_network_of_another_store_is_never_pruned(
    netns_podman: ThrowawayPodman,
    make_node: MakeNode,
    podman: PodmanRuntime,
    leftovers: list[str],
) -> None:
    """Podman services on one machine share the CNI configuration: another service's job
    network is not this one's to judge."""
    name = own_network(unique("tuneplane-elsewhere"))
    body = {
        "name": name,
        "driver": "bridge",
        "labels": {LABEL_NETWORK_OF: "tuneplane-elsewhere", LABEL_NETWORK_STORE: "/else"},
    }
    created = await asyncio.to_thread(
        lambda: podman.api.post("/networks/create", data=json.dumps(body))
    )
    created.raise_for_status()
    leftovers.append(name)
    node = await make_podman_node(make_node, netns_podman, "isolated")
    await node.launch(network="bridge")
    assert name in await networks(podman)


async def test_a_podman_job_whose_container_cannot_be_made_leaves_no_network_nor_rule(
    netns_podman: ThrowawayPodman, podman: PodmanRuntime, tmp_path: Path
) -> None:
    missing = Mount(host=str(tmp_path / "absent"), container="/data", read_only=True)
    spec = job(["/bin/true"], network="isolated", mounts=(missing,))
    rules = guarded_bridges(netns_podman.rules())
    try:
        with pytest.raises(EngineError):
            await podman.run(spec)
        assert own_network(spec.name) not in await networks(podman)
        assert guarded_bridges(netns_podman.rules()) == rules
    finally:
        await podman.remove(spec.name)  # the container, had it been made, and its network
