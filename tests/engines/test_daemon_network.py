"""The network a job gets on the real engines, as the job itself sees it: under
``whole-node`` (the default) a 1-card job asking for ``host`` on a 2-card machine is in a
network namespace of its own, a 2-card job in the host's, and observe says which. The
development engines run ``--bridge=none``: docker's ``bridge`` there is a namespace with
loopback only, podman's its bridge; either way not the host's."""

from __future__ import annotations

import os

import pytest

from tests.conftest import MakeNode
from tests.support.console import Console

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]
PROBE = ["/bin/sh", "-c", "echo netns=$(readlink /proc/self/ns/net)"]
HOST_NETNS = os.readlink("/proc/self/ns/net")


async def netns_of(node: Console, gpus: int) -> tuple[str, str]:
    """The job's network namespace as it read it, and observe's ``network``."""
    ref, _ = await node.launch(PROBE, gpus=gpus, network="host")
    state = await node.wait_for(ref, "status", "exited", timeout=120)
    logs = await node.logs(ref)
    assert state["exit_code"] == 0, logs
    return logs.rsplit("netns=", 1)[1].strip(), state["network"]


@pytest.mark.parametrize("engine", ENGINES)
async def test_only_a_job_with_the_whole_machine_shares_the_hosts_network(
    make_node: MakeNode, engine: str
) -> None:
    node = await make_node(engine, local_gpu_count=2, port_held=True)

    part, got = await netns_of(node, 1)
    assert got == "bridge"
    assert part.startswith("net:[") and part != HOST_NETNS

    whole, got = await netns_of(node, 2)
    assert (whole, got) == (HOST_NETNS, "host")


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_whole_machine_job_on_a_plain_serve_is_bridged(
    make_node: MakeNode, engine: str
) -> None:
    """No socket unit, no TLS: a job could take the node's port during a restart."""
    node = await make_node(engine, local_gpu_count=2)
    netns, got = await netns_of(node, 2)
    assert got == "bridge" and netns != HOST_NETNS
