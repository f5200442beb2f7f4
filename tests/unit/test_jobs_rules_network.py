"""Which network a job asking for ``host`` gets (`TUNEPLANE_JOB_HOST_NETWORK`), on the fake
engine: under ``whole-node`` (the default) the host's only with every card of the machine
and no other job, where the node's port is held across restarts or the API is TLS."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE, MakeFakeNode, fake_settings
from tests.fakes.clock import FakeClock
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tests.support.console import console_0315
from tests.support.nodes import fake_node_of
from tests.support.waiting import wait_until
from tuneplane_node.errors import InvalidField
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.jobs import Node
from tuneplane_node.jobs.rules.network import (
    PORT_NOT_HELD,
    PORT_UNSAFE,
    Neighbours,
    NetworkRule,
)
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import LABEL_NETWORK, LABEL_RUN_ID, Launch

MakeService = Callable[..., Node]


@pytest.fixture
async def make_service(
    fake: FakeRuntime, probe: FakeProbe, clock: FakeClock, tmp_path: Path
) -> AsyncIterator[MakeService]:
    """A job service on the 4-card fake machine; ``port_held`` as `serve` under systemd."""
    made: list[Node] = []

    def make(*, port_held: bool = True, **overrides: Any) -> Node:
        settings = fake_settings(tmp_path, **overrides)
        allocator = GpuAllocator(fake, settings, probe=probe)
        made.append(
            fake_node_of(fake, settings, allocator=allocator, clock=clock, port_held=port_held)
        )
        return made[-1]

    yield make
    for node in made:
        await node.close()


def launch(run_id: str, gpus: int, network: str = "host") -> Launch:
    spec = ContainerSpec(
        name=f"tuneplane-{run_id}", image=IMAGE, labels={LABEL_RUN_ID: run_id}, network=network
    )
    return Launch(run_id, gpus, spec)


def network_of(fake: FakeRuntime, run_id: str) -> tuple[str, str | None]:
    """The network the engine was asked for, and the label that says it."""
    spec = fake.containers[f"tuneplane-{run_id}"].spec
    return spec.network, spec.labels.get(LABEL_NETWORK)


async def test_a_job_with_every_card_and_alone_gets_the_host_network(
    make_service: MakeService, fake: FakeRuntime
) -> None:
    await make_service().jobs.launch(launch("whole", 4))
    assert network_of(fake, "whole") == ("host", "host")


async def test_a_job_on_some_of_the_cards_is_bridged(
    make_service: MakeService, fake: FakeRuntime
) -> None:
    await make_service().jobs.launch(launch("part", 3))
    assert network_of(fake, "part") == ("isolated", "isolated")


async def test_a_job_beside_a_host_network_job_is_bridged_whatever_it_asks(
    make_service: MakeService, fake: FakeRuntime
) -> None:
    node = make_service()
    await node.jobs.launch(launch("whole", 4))
    await node.jobs.launch(launch("beside", 0))
    await node.jobs.launch(launch("none", 0, network="none"))

    assert network_of(fake, "whole") == ("host", "host")
    assert network_of(fake, "beside") == ("isolated", "isolated")
    assert network_of(fake, "none") == ("none", "none")  # what it asked, written


async def test_a_whole_machine_job_beside_another_job_is_bridged_until_it_is_gone(
    make_service: MakeService, fake: FakeRuntime
) -> None:
    node = make_service()
    await node.jobs.launch(launch("small", 0, network="bridge"))
    await node.jobs.launch(launch("whole", 4))
    assert network_of(fake, "whole") == ("isolated", "isolated")

    await node.jobs.remove("tuneplane-small")
    await node.jobs.remove("tuneplane-whole")
    await node.jobs.launch(launch("again", 4))
    assert network_of(fake, "again") == ("host", "host")


async def test_a_cpu_launch_still_pulling_is_a_neighbour(
    make_service: MakeService, fake: FakeRuntime
) -> None:
    """Issue 52: a launch holding no card, its image still pulling, has no container and
    no claim; left out of the neighbours, the whole-machine job got the host network
    beside it, and no test failed."""
    node = make_service()
    cpu = launch("cpu", 0, network="bridge")
    await node.jobs.launch(
        replace(cpu, container=replace(cpu.container, image="registry.test/pulled:1"))
    )
    await fake.pulling.wait()
    await node.jobs.launch(launch("whole", 4))
    assert network_of(fake, "whole") == ("isolated", "isolated")
    fake.pull_of("registry.test/pulled:1").finish()
    await wait_until(lambda: "tuneplane-cpu" in fake.containers)


async def test_an_exited_job_is_no_neighbour(make_service: MakeService, fake: FakeRuntime) -> None:
    node = make_service()
    await node.jobs.launch(launch("done", 0, network="bridge"))
    fake.exit("tuneplane-done", 0)
    await node.jobs.launch(launch("whole", 4))
    assert network_of(fake, "whole") == ("host", "host")


async def test_without_the_port_held_nor_tls_every_host_job_is_bridged_said_once(
    make_service: MakeService, fake: FakeRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tuneplane_node.jobs.rules.network")
    node = make_service(port_held=False)
    await node.jobs.launch(launch("one", 4))
    assert network_of(fake, "one") == ("isolated", "isolated")
    await node.jobs.remove("tuneplane-one")
    await node.jobs.launch(launch("two", 4))

    assert network_of(fake, "two") == ("isolated", "isolated")
    said = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.INFO and r.name == "tuneplane_node.jobs.rules.network"
    ]
    assert len(said) == 1, said
    assert "socket unit or set TUNEPLANE_TLS_CERT_FILE" in said[0]


async def test_an_api_over_tls_is_as_safe_as_a_held_port(
    make_service: MakeService, fake: FakeRuntime, tmp_path: Path
) -> None:
    for name in ("cert.pem", "key.pem"):  # never read: the rule asks only whether TLS is set
        (tmp_path / name).write_text("")
    node = make_service(
        port_held=False, tls_cert_file=tmp_path / "cert.pem", tls_key_file=tmp_path / "key.pem"
    )
    await node.jobs.launch(launch("whole", 4))
    assert network_of(fake, "whole") == ("host", "host")


async def test_a_machine_whose_cards_are_unknown_bridges_host_jobs(
    make_service: MakeService, fake: FakeRuntime, probe: FakeProbe
) -> None:
    probe.ok = False
    await make_service(local_gpu_count=None).jobs.launch(launch("blind", 0))
    assert network_of(fake, "blind") == ("isolated", "isolated")


async def test_a_machine_known_to_have_no_cards_bridges_host_jobs(
    make_service: MakeService, fake: FakeRuntime
) -> None:
    """No job holds the whole of a machine without cards, alone or not (issue 52: a rule
    reading 0 cards as "every card held" gave a lone CPU job the host network, and no
    test failed)."""
    await make_service(local_gpu_count=0).jobs.launch(launch("cpu", 0))
    assert network_of(fake, "cpu") == ("isolated", "isolated")


async def test_allow_keeps_0315s_behaviour(make_service: MakeService, fake: FakeRuntime) -> None:
    node = make_service(port_held=False, job_host_network="allow")
    await node.jobs.launch(launch("part", 1))
    await node.jobs.launch(launch("beside", 0))
    assert network_of(fake, "part") == ("host", "host")
    assert network_of(fake, "beside") == ("host", "host")


# --- through the API, as a 0.3.15 console sees it ---------------------------------------------


@pytest.mark.parametrize(
    ("setting", "gpus", "got"),
    [
        ({}, 1, "isolated"),  # the default, whole-node: 1 of 2 cards
        ({}, 2, "host"),
        ({"job_host_network": "allow"}, 1, "host"),
        ({"job_host_network": "bridge"}, 2, "isolated"),
        ({"job_host_network": "bridge", "job_network": "sealed"}, 2, "sealed"),
        ({"job_host_network": "bridge", "job_network": "bridge"}, 2, "bridge"),
    ],
)
async def test_a_0315_launch_runs_under_every_setting_but_refuse_and_observe_says_where(
    fake_node: MakeFakeNode, fake: FakeRuntime, setting: dict[str, str], gpus: int, got: str
) -> None:
    node = await fake_node(port_held=True, local_gpu_count=2, **setting)
    answer = await node.ok("POST", "/node/v1/launch", json=console_0315("r1", gpus, image=IMAGE))

    assert answer["phase"] == "running"
    state = await node.state("tuneplane-r1")
    assert state["network"] == got
    assert state["labels"][LABEL_NETWORK] == got
    assert fake.containers["tuneplane-r1"].spec.network == got


async def test_a_pending_launch_has_no_network_yet(fake_node: MakeFakeNode) -> None:
    node = await fake_node(port_held=True)
    answer = await node.ok(
        "POST", "/node/v1/launch", json=console_0315("r1", 0, image="registry/absent:1")
    )
    assert answer["phase"] == "pulling"
    assert (await node.state("tuneplane-r1"))["network"] is None


def test_the_default_is_whole_node(tmp_path: Path) -> None:
    settings = fake_settings(tmp_path)
    assert settings.job_host_network == "whole-node"


# --- the rule alone: what each setting makes of a host request, and what it says ---------------

HOST_SPEC = ContainerSpec(
    name="tuneplane-r1", image=IMAGE, labels={LABEL_RUN_ID: "r1"}, network="host"
)
RULE_LOG = "tuneplane_node.jobs.rules.network"
NO_CARDS = "the machine's cards are unknown or none: no job holds the whole machine"


def rule(tmp_path: Path, *, port_held: bool = False, **settings: Any) -> NetworkRule:
    return NetworkRule(fake_settings(tmp_path, **settings), port_held=port_held)


def test_refuse_is_a_422_naming_the_field_and_the_setting(tmp_path: Path) -> None:
    refusing = rule(tmp_path, job_host_network="refuse")
    with pytest.raises(InvalidField) as refused:
        refusing.vetted(HOST_SPEC)
    assert refused.value.field == "container.network"
    assert refused.value.reason == (
        "host networking is refused on this node (TUNEPLANE_JOB_HOST_NETWORK=refuse): "
        "use bridge or none"
    )
    bridged = replace(HOST_SPEC, network="bridge")
    assert refusing.vetted(bridged) is bridged  # no host request: nothing to refuse


def test_allow_and_whole_node_leave_a_host_request_to_the_placement(tmp_path: Path) -> None:
    for mode in ("allow", "whole-node"):
        assert rule(tmp_path, job_host_network=mode).vetted(HOST_SPEC) is HOST_SPEC
    assert rule(tmp_path, job_host_network="whole-node").needs_neighbours(HOST_SPEC)
    assert not rule(tmp_path, job_host_network="allow").needs_neighbours(HOST_SPEC)
    assert not rule(tmp_path).needs_neighbours(replace(HOST_SPEC, network="bridge"))


def test_bridge_runs_a_host_request_on_the_job_network_and_logs_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=RULE_LOG)
    got = rule(tmp_path, job_host_network="bridge", job_network="sealed").vetted(HOST_SPEC)
    assert (got.network, got.labels[LABEL_NETWORK]) == ("sealed", "sealed")
    (line,) = [r for r in caplog.records if r.name == RULE_LOG]
    assert line.levelno == logging.INFO
    assert line.getMessage() == (
        "launch tuneplane-r1: host network asked, run on the bridge "
        "(TUNEPLANE_JOB_HOST_NETWORK: TUNEPLANE_JOB_HOST_NETWORK=bridge)"
    )
    assert (line.ref, line.run_id, line.image) == ("tuneplane-r1", "r1", IMAGE)  # type: ignore[attr-defined]


def test_a_port_not_held_bridges_every_host_job_saying_so_once_then_quietly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=RULE_LOG)
    unsafe = rule(tmp_path)
    assert not unsafe.port_safe and rule(tmp_path, port_held=True).port_safe
    assert not NetworkRule(fake_settings(tmp_path)).port_safe  # held only where said
    for _ in range(2):
        got = unsafe.placed(HOST_SPEC, Neighbours(cards=4, others=0))
        assert (got.network, got.labels[LABEL_NETWORK]) == ("isolated", "isolated")
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == RULE_LOG]
    assert said[0] == (logging.WARNING, f"host-network jobs run on the bridge: {PORT_NOT_HELD}")
    assert [level for level, _ in said[1:]] == [logging.DEBUG, logging.DEBUG]  # each launch's
    assert all(PORT_UNSAFE in text for _, text in said[1:])


def test_a_whole_machine_alone_on_a_safe_port_keeps_the_host(tmp_path: Path) -> None:
    safe = rule(tmp_path, port_held=True)
    asked = safe.placed(HOST_SPEC)  # no machine read: labelled as asked, decided by none
    assert (asked.network, asked.labels[LABEL_NETWORK]) == ("host", "host")
    whole = replace(HOST_SPEC, gpus=(0, 1, 2, 3))
    kept = safe.placed(whole, Neighbours(cards=4, others=0))
    assert (kept.network, kept.labels[LABEL_NETWORK]) == ("host", "host")
    cases = [
        (whole, Neighbours(4, 0), None),
        (HOST_SPEC, Neighbours(4, 0), "it holds 0 of the machine's 4 cards"),
        (whole, Neighbours(4, 1), "1 other job(s) of the node run on this machine"),
        (
            whole,
            Neighbours(None, 0),
            "the machine's cards are unknown or none: no job holds the whole machine",
        ),
        (
            HOST_SPEC,
            Neighbours(0, 0),
            "the machine's cards are unknown or none: no job holds the whole machine",
        ),
    ]
    for spec, around, why in cases:
        assert safe._not_whole(spec, around) == why, (spec.gpus, around)
