"""The egress rule (``TUNEPLANE_JOB_EGRESS_*``) on real engines, as the jobs see it.

Each engine runs in network namespaces of its own (`ThrowawayDocker` ``netns=True``,
`ThrowawayPodman`), whose default route leads to "the outside world": a namespace that
holds a cloud's metadata address (`Namespaces.METADATA`, its HTTP port and a name server's)
and two machines of a LAN (`Namespaces.LAN`, `Namespaces.MIRROR`), each answering with
the address it was reached at. The machine's own firewall is never touched.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from tests.checkcommand import Check
from tests.conftest import MakeNode, podman_in_namespaces
from tests.support.console import Console
from tests.support.images import IMAGE
from tests.support.namespaces import Namespaces
from tests.support.throwaway import ThrowawayDocker, ThrowawayPodman
from tuneplane_node.runtime.engines.networks.egress import cgroup2_root, chain_name, jumps
from tuneplane_node.runtime.engines.networks.jobnetwork import own_network

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


async def reached(node: Console, places: dict[str, str], network: str = "bridge") -> dict[str, str]:
    ref, _ = await node.launch(tries(places), network=network)
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
    """A node on ``engine``, the egress rule on (the default) unless ``settings`` say."""
    settings = {"job_egress_rule": True, **settings}  # the suite's engines have it off
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


# --- another engine's containers on the same machine -------------------------------------

PEER_PORT = 9000
SERVE = ["/bin/sh", "-c", f"while true; do echo job | nc -l -p {PEER_PORT}; done"]
GATEWAY = r"$(ip route | sed -n 's/^default via \([0-9.]*\).*/\1/p')"
"""The job's gateway, in its shell: an address of the machine it runs on."""
PUBLISHED = {"docker": 7100, "podman": 7200}
"""The port each engine's other container (not the node's) publishes on the machine."""


@pytest.fixture
async def two_engines(
    netns_docker: ThrowawayDocker,
) -> AsyncIterator[tuple[ThrowawayDocker, ThrowawayPodman]]:
    """Docker and podman in one network namespace, as on a machine that runs both, each
    with a container of someone else's publishing a port (`PUBLISHED`)."""
    podman = await asyncio.to_thread(podman_in_namespaces, netns_docker)
    try:
        serve = ["--entrypoint", "/bin/nc"]
        answer = ["-ll", "-p", str(PEER_PORT), "-e", "/bin/echo", "other"]
        for engine, run, image in (
            ("docker", netns_docker.docker, IMAGE),
            ("podman", podman.podman, f"docker.io/{IMAGE}"),
        ):
            published = f"{PUBLISHED[engine]}:{PEER_PORT}"
            run(
                "run", "-d", "--name", f"tp-{engine}-other", "-p", published, *serve, image, *answer
            )
        yield netns_docker, podman
    finally:
        await asyncio.to_thread(podman.close)


def job_address(inspected: bytes) -> str:
    """A job's one address, from ``docker inspect`` or ``podman inspect``."""
    networks = json.loads(inspected)[0]["NetworkSettings"]["Networks"]
    (address,) = [net["IPAddress"] for net in networks.values() if net["IPAddress"]]
    return str(address)


@pytest.mark.parametrize("rule", [True, False])
async def test_a_job_reaches_no_container_of_the_other_engine_on_the_machine(
    two_engines: tuple[ThrowawayDocker, ThrowawayPodman], make_node: MakeNode, rule: bool
) -> None:
    """A podman job and a docker job on one machine: neither opens the other's port, by
    its address on the other engine's bridge or by a port the other engine publishes;
    both reach the outside world. Without the rule the podman job reaches the docker
    job, and the docker job both of podman's (issue 51's finding)."""
    docker, podman = two_engines
    settings = {"job_network": "isolated", "job_egress_rule": rule}
    on_docker = await make_node("docker", docker_host=docker.host, **settings)
    on_podman = await make_node("podman", podman_url=podman.host, **settings)
    servers = {}
    for name, node in (("docker", on_docker), ("podman", on_podman)):
        servers[name], _ = await node.launch(SERVE, network="bridge")
        await node.wait_for(servers[name], "status", "running")
    docker_job = job_address(docker.docker("inspect", servers["docker"]).stdout)
    podman_job = job_address(podman.podman("inspect", servers["podman"]).stdout)
    out = f"{Namespaces.OUTSIDE} {Namespaces.OUTSIDE_PORT}"

    from_podman = await reached(on_podman, {
        "job": f"{docker_job} {PEER_PORT}", "published": f"{GATEWAY} {PUBLISHED['docker']}",
        "out": out,
    })  # fmt: skip
    from_docker = await reached(on_docker, {
        "job": f"{podman_job} {PEER_PORT}", "published": f"{GATEWAY} {PUBLISHED['podman']}",
        "out": out,
    })  # fmt: skip

    assert from_podman["out"] == from_docker["out"] == "outside"
    if rule:
        for said in (from_podman, from_docker):
            assert refused_by_the_rule(said["job"]), said
            assert said["published"] not in ("job", "other"), said
    else:
        assert (from_podman["job"], from_docker["job"]) == ("job", "job")
        assert from_docker["published"] == "other"


# --- swept at start ------------------------------------------------------------------------


def our_jumps(engine: Engine) -> list[str]:
    """The bridges of the egress rule's jumps to this engine's chain (one per jump)."""
    chain = chain_name(engine.host)
    return [name for name, to, _ in jumps(engine.net.rules()) if to == chain]


async def test_the_rule_off_removes_the_nodes_chain_and_jumps_at_the_daemons_start(
    engine: Engine, make_node: MakeNode
) -> None:
    node = await engine_node(make_node, engine, job_network="isolated")
    ref, _ = await node.launch(SERVE, network="bridge")
    await node.wait_for(ref, "status", "running")
    assert our_jumps(engine) and f"-N {chain_name(engine.host)}\n" in engine.net.rules()

    await engine_node(make_node, engine, job_network="isolated", job_egress_rule=False)
    assert our_jumps(engine) == []
    assert chain_name(engine.host) not in engine.net.rules()


async def test_a_killed_daemons_jump_is_swept_at_start_a_live_jobs_kept(
    netns_podman: ThrowawayPodman, make_node: MakeNode
) -> None:
    first = await engine_node(make_node, netns_podman, job_network="isolated")
    kept, _ = await first.launch(SERVE, network="bridge")
    doomed, _ = await first.launch(SERVE, network="bridge")
    for ref in (kept, doomed):
        await first.wait_for(ref, "status", "running")
    bridges = {
        ref: json.loads(netns_podman.podman("network", "inspect", own_network(ref)).stdout)[0]
        for ref in (kept, doomed)
    }
    live, gone = (bridges[ref]["network_interface"] for ref in (kept, doomed))
    netns_podman.remove_by_hand(doomed)  # the daemon killed, its job removed meanwhile
    assert {live, gone} <= set(our_jumps(netns_podman))

    await engine_node(make_node, netns_podman, job_network="isolated")  # the daemon's start
    assert gone not in our_jumps(netns_podman)
    assert our_jumps(netns_podman).count(live) == 1


# --- host-network jobs ---------------------------------------------------------------------


@pytest.mark.parametrize("rule", [True, False])
async def test_a_host_network_job_is_held_to_the_addresses_where_the_kernel_can_match_it(
    engine: Engine, make_node: MakeNode, rule: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A job on the engine's own network (the machine's): the metadata service and the
    denied LAN refused by a cgroup match on the jobs' parent, where the machine has a
    cgroup v2 tree (this one's is a hybrid's); where it has none the launch's log says
    the job reaches the metadata service, and it does."""
    node = await engine_node(
        make_node, engine, job_host_network="allow", job_egress_rule=rule, **RULES
    )
    places = {word: PLACES[word] for word in ("meta", "lan", "mirror", "out")}
    said = await reached(node, places, network="host")
    held = rule and cgroup2_root() is not None

    for word in ("meta", "lan"):
        assert refused_by_the_rule(said[word]) if held else said[word] == ANSWERS[word], said
    assert (said["mirror"], said["out"]) == (Namespaces.MIRROR, "outside")
    if rule and not held:
        assert "a host-network job reaches the cloud's metadata service" in caplog.text


# --- check proves it -----------------------------------------------------------------------


def check_settings(engine: Engine, **settings: str) -> dict[str, str]:
    """``check``'s variables for a node on ``engine``, its throwaway job the test image."""
    if isinstance(engine, ThrowawayDocker):
        where = {"TUNEPLANE_LOCAL_RUNTIME": "docker", "TUNEPLANE_DOCKER_HOST": engine.host}
        image = IMAGE
    else:
        where = {"TUNEPLANE_LOCAL_RUNTIME": "podman", "TUNEPLANE_PODMAN_URL": engine.host}
        image = f"docker.io/{IMAGE}"
    return {**where, "TUNEPLANE_CHECK_IMAGE": image, **settings}


@pytest.mark.parametrize("rule", ["true", "false"])
def test_check_fails_where_the_metadata_service_answers_a_job(
    engine: Engine, check: Check, rule: str
) -> None:
    denied = json.dumps([f"{Namespaces.LAN}/32"])
    settings = {"TUNEPLANE_JOB_EGRESS_RULE": rule, "TUNEPLANE_JOB_EGRESS_DENY": denied}
    code, _, out = check(**check_settings(engine, **settings))
    (probe,) = [line for line in out.splitlines() if "egress: a job on the isolated" in line]

    if rule == "true":
        assert probe == (
            "ok   egress: a job on the isolated network reaches none of the cloud's metadata "
            "service (169.254.169.254:80): refused; TUNEPLANE_JOB_EGRESS_DENY "
            f"{Namespaces.LAN}/32 ({Namespaces.LAN}:80): refused"
        ), out
        assert "ok   egress: host-network jobs: the same addresses refused" in out
    else:
        assert probe.startswith(
            "FAIL egress: a job on the isolated network reaches the cloud's metadata service "
            "(169.254.169.254:80): open; TUNEPLANE_JOB_EGRESS_DENY"
        ), out
        assert code == 1


def test_check_says_isolation_is_off_on_docker_without_its_firewall(
    throwaway_docker: ThrowawayDocker, netns_docker: ThrowawayDocker, check: Check
) -> None:
    """``--iptables=false`` (the throwaway engine's, in the machine's namespace): no rule
    of docker's nor of the node's holds; with its firewall, jobs run isolated."""
    _, _, out = check(**check_settings(throwaway_docker, TUNEPLANE_CHECK_IMAGE="absent:1"))
    assert "warn jobs: isolation is off: a bridged job runs isolated in name only" in out
    assert "(--iptables=false)" in out
    assert "warn egress: not proven: absent:1 is not on the docker engine" in out
    _, _, out = check(**check_settings(netns_docker))
    assert "ok   jobs: a bridged job runs isolated: it cannot reach another job" in out
