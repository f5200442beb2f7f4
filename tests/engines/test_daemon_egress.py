"""The egress rule (``TUNEPLANE_JOB_EGRESS_*``) on real engines, as the jobs see it.

Each engine runs in network namespaces of its own (`ThrowawayDocker` ``netns=True``,
`ThrowawayPodman`), whose default route leads to "the outside world": a namespace that
holds a cloud's metadata address (`Namespaces.METADATA`, its HTTP port and a name server's)
and two machines of a LAN (`Namespaces.LAN`, `Namespaces.MIRROR`), each answering with
the address it was reached at. The machine's own firewall is never touched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import MakeNode, podman_in_namespaces
from tests.helpers import (
    Console,
    Namespaces,
    ThrowawayDocker,
    ThrowawayPodman,
)

pytestmark = [pytest.mark.engine, pytest.mark.own_engines]  # engines in namespaces of their own
LAN_NET = "203.0.113.0/24"
"""The operator's denied LAN, which holds `Namespaces.MIRROR`, the operator's allowed one."""
RULES = {"job_egress_deny": [LAN_NET], "job_egress_allow": [f"{Namespaces.MIRROR}/32"]}
PLACES = {
    "meta": f"{Namespaces.METADATA} 80",
    "dns": f"{Namespaces.METADATA} 53",
    "lan": f"{Namespaces.LAN} 80",
    "mirror": f"{Namespaces.MIRROR} 80",
    "out": f"{Namespaces.OUTSIDE} {Namespaces.OUTSIDE_PORT}",
}
ANSWERS = {
    "meta": Namespaces.METADATA,
    "dns": Namespaces.METADATA,
    "lan": Namespaces.LAN,
    "mirror": Namespaces.MIRROR,
    "out": "outside",
}


def tries(places: dict[str, str]) -> list[str]:
    """A job that opens each place ("address port") and prints, by its word, what it
    read or why it could not."""
    script = "; ".join(
        f"echo {word}=$(nc -w 3 {where} </dev/null 2>&1)" for word, where in places.items()
    )
    return ["/bin/sh", "-c", script]


def answered(logs: str) -> dict[str, str]:
    """Each word's line of a `tries` job's log (after the engine's timestamp)."""
    lines = (line.split(" ", 1)[-1].partition("=") for line in logs.splitlines())
    return {word: said.strip() for word, _, said in lines if said}


async def reached(node: Console, places: dict[str, str], **launch: Any) -> dict[str, str]:
    ref, _ = await node.launch(tries(places), network="bridge", **launch)
    state = await node.wait_for(ref, "status", "exited", timeout=90)
    logs = await node.logs(ref)
    assert state["exit_code"] == 0, logs
    return answered(logs)


def refused_by_the_rule(said: str) -> bool:
    """The rule's own refusal: ICMP administratively prohibited, at once."""
    return "No route to host" in said


@pytest.fixture(scope="module")
def netns_podman() -> Iterator[ThrowawayPodman]:
    engine = podman_in_namespaces()
    yield engine
    engine.close()


async def engine_node(make_node: MakeNode, engine: Engine, **settings: Any) -> Console:
    if isinstance(engine, ThrowawayDocker):
        return await make_node("docker", docker_host=engine.host, **settings)
    return await make_node("podman", podman_url=engine.host, **settings)


Engine = ThrowawayDocker | ThrowawayPodman


@pytest.fixture(params=["docker", "podman"])
def engine(request: pytest.FixtureRequest) -> Engine:
    found: Engine = request.getfixturevalue(f"netns_{request.param}")
    return found


@pytest.mark.parametrize("kind", ["isolated", "sealed"])
async def test_an_isolated_job_reaches_neither_the_metadata_service_nor_a_denied_address(
    engine: Engine, make_node: MakeNode, kind: str
) -> None:
    """The metadata address (through the default gateway, as on a cloud) and the denied
    LAN are refused by the rule; a name server there, the allowed mirror inside the
    denied LAN, and the outside world answer (sealed: nothing outside answers)."""
    node = await engine_node(make_node, engine, job_network=kind, **RULES)
    said = await reached(node, PLACES)

    isolated = kind == "isolated"
    for word in ("meta", "lan"):  # sealed: no route out, the rule or not
        assert refused_by_the_rule(said[word]) if isolated else said[word] != ANSWERS[word], said
    for word in ("dns", "mirror", "out"):
        assert (said[word] == ANSWERS[word]) is isolated, said


async def test_with_the_rule_off_every_place_answers(engine: Engine, make_node: MakeNode) -> None:
    """The measure can fail: the cloud's metadata service answers a job without it."""
    node = await engine_node(
        make_node, engine, job_network="isolated", job_egress_rule=False, **RULES
    )
    assert await reached(node, PLACES) == ANSWERS
