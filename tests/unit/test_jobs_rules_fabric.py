"""The fabric network (``TUNEPLANE_FABRICS`` with an interface): its settings, which job
gets it, the addresses the node hands out (labels are the truth) and NCCL's environment,
on the fake engine and a fake sysfs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from ipaddress import IPv4Address
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE, fake_settings
from tests.fakes.runtime import FakeRuntime
from tests.unit.test_jobs_rules_network import make_service as make_network_service  # noqa: F401 (fixture)
from tuneplane_node.checks import FAIL, OK
from tuneplane_node.checks.gpus import check_fabric_network
from tuneplane_node.errors import ConfigError, FabricAddressesExhausted, InvalidField
from tuneplane_node.jobs import JobService, Node
from tuneplane_node.jobs.rules.fabric import FabricAddresses, addresses, gid_index
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import Fabric, load_settings
from tuneplane_node.wire.values import (
    LABEL_FABRIC_ADDRESS,
    LABEL_NETWORK,
    LABEL_RUN_ID,
    Launch,
    LaunchContainer,
)

MakeService = Callable[..., JobService]
MakeNode = Callable[..., Node]
FABRIC = {
    "name": "ib-a",
    "hcas": ["mlx5_0"],
    "interface": "ib0",
    "network": "ipvlan",
    "subnet": "10.9.0.0/16",
    "range": "10.9.1.0/30",
}


def fabric(**changes: Any) -> Fabric:
    return Fabric.model_validate({**FABRIC, **changes})


@pytest.fixture
def make_service(make_network_service: MakeNode) -> MakeService:  # noqa: F811 (the fixture)
    """A job service on the 4-card fake machine with a fabric network (changes to it
    as keyword arguments)."""
    return lambda **changes: make_network_service(fabrics=[fabric(**changes)]).jobs


def launch(run_id: str, gpus: int = 1, *, env: dict[str, str] | None = None) -> Launch:
    spec = ContainerSpec(
        name=f"tuneplane-{run_id}", image=IMAGE, labels={LABEL_RUN_ID: run_id}, env=env or {}
    )
    return Launch(run_id, gpus, spec)


def on(fake: FakeRuntime, run_id: str) -> ContainerSpec:
    return fake.containers[f"tuneplane-{run_id}"].spec


# --- settings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"range": "10.8.1.0/24"}, "range 10.8.1.0/24 is not inside subnet 10.9.0.0/16"),
        ({"range": None}, "needs interface, subnet and range (missing: range)"),
        ({"gateway": "10.9.1.1"}, "gateway 10.9.1.1 is inside range"),
        ({"gateway": "10.10.0.1"}, "gateway 10.10.0.1 is not inside subnet"),
        ({"interface": "ib0; rm -rf /"}, "interface"),
        ({"interface": "a-much-too-long-name"}, "interface"),
        ({"network": "bridge"}, "network"),
        ({"subnet": "10.9.0.0/33"}, "subnet"),
    ],
)
def test_a_wrong_fabric_network_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, changes: dict[str, Any], said: str
) -> None:
    import json

    monkeypatch.setenv("TUNEPLANE_FABRICS", json.dumps([{**FABRIC, **changes}]))
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "TUNEPLANE_FABRICS" in caught.value.message
    assert said in caught.value.message


def test_at_most_one_fabric_has_a_network(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    two = [FABRIC, {**FABRIC, "name": "ib-b", "hcas": ["mlx5_1"]}]
    monkeypatch.setenv("TUNEPLANE_FABRICS", json.dumps(two))
    with pytest.raises(ConfigError, match="TUNEPLANE_FABRICS: at most one fabric has a network"):
        load_settings()


def test_a_fabric_without_a_network_is_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEPLANE_FABRICS", '[{"name": "ib-a", "hcas": ["mlx5_0"]}]')
    assert load_settings().fabric_network is None


def test_the_addresses_handed_out_skip_the_subnets_own_and_the_gateway() -> None:
    # 10.9.0.0/30 holds the subnet's network address and, without a gateway, the first
    # address both engines keep as the network's gateway.
    assert list(addresses(fabric(range="10.9.0.0/30"))) == [IPv4Address("10.9.0.2"),
                                                            IPv4Address("10.9.0.3")]  # fmt: skip
    given = fabric(range="10.9.0.0/30", gateway="10.9.7.1")
    assert [str(a) for a in addresses(given)] == ["10.9.0.1", "10.9.0.2", "10.9.0.3"]
    top = fabric(range="10.9.255.252/30")
    assert [str(a) for a in addresses(top)] == ["10.9.255.252", "10.9.255.253", "10.9.255.254"]


# --- which job, which address -----------------------------------------------------------


async def test_a_host_request_not_given_the_host_goes_on_the_fabric_with_an_address(
    make_service: MakeService, fake: FakeRuntime
) -> None:
    service = make_service()
    await service.launch(launch("part", 1))
    spec = on(fake, "part")
    assert spec.network == "fabric"
    assert spec.labels[LABEL_NETWORK] == "fabric:ib-a"
    assert spec.labels[LABEL_FABRIC_ADDRESS] == "10.9.1.0"
    assert spec.env["NCCL_SOCKET_IFNAME"] == "eth0"


async def test_a_whole_machine_job_keeps_the_host_and_a_bridge_request_its_network(
    make_service: MakeService, fake: FakeRuntime
) -> None:
    service = make_service()
    await service.launch(launch("whole", 4))
    assert on(fake, "whole").network == "host"
    await service.remove("tuneplane-whole")
    bridge = launch("bridged", 0)
    await service.launch(Launch("bridged", 0, replace_network(bridge.container, "bridge")))
    assert on(fake, "bridged").network == "isolated"
    assert LABEL_FABRIC_ADDRESS not in on(fake, "bridged").labels


def replace_network(spec: LaunchContainer, network: str) -> LaunchContainer:
    from dataclasses import replace

    return replace(spec, network=network)


async def test_the_consoles_nccl_settings_are_kept(
    make_service: MakeService, fake: FakeRuntime
) -> None:
    await make_service().launch(launch("own", env={"NCCL_SOCKET_IFNAME": "net1"}))
    assert on(fake, "own").env["NCCL_SOCKET_IFNAME"] == "net1"


async def test_jobs_never_share_an_address_and_a_removed_job_gives_its_own_back(
    make_service: MakeService, fake: FakeRuntime
) -> None:
    service = make_service()
    await asyncio.gather(*(service.launch(launch(f"j{n}", 0)) for n in range(4)))
    held = sorted(on(fake, f"j{n}").labels[LABEL_FABRIC_ADDRESS] for n in range(4))
    assert held == ["10.9.1.0", "10.9.1.1", "10.9.1.2", "10.9.1.3"]

    fake.exit("tuneplane-j1", 0)  # an exited job's container still holds its address
    with pytest.raises(FabricAddressesExhausted) as caught:
        await service.launch(launch("more", 0))
    assert (caught.value.status, caught.value.code) == (409, "fabric_addresses_exhausted")
    assert "10.9.1.0/30" in caught.value.message
    assert "tuneplane-more" not in fake.containers

    freed = on(fake, "j1").labels[LABEL_FABRIC_ADDRESS]
    await service.remove("tuneplane-j1")
    await service.launch(launch("more", 0))
    assert on(fake, "more").labels[LABEL_FABRIC_ADDRESS] == freed


async def test_the_addresses_held_are_read_from_the_labels_after_a_restart(
    make_service: MakeService, fake: FakeRuntime
) -> None:
    await make_service().launch(launch("before", 0))
    await make_service().launch(launch("after", 0))  # a new service: nothing in memory
    assert on(fake, "before").labels[LABEL_FABRIC_ADDRESS] == "10.9.1.0"
    assert on(fake, "after").labels[LABEL_FABRIC_ADDRESS] == "10.9.1.1"


async def test_concurrent_claims_under_a_slow_engine_get_distinct_addresses(
    fake: FakeRuntime,
) -> None:
    pool = FabricAddresses(fabric(), fake)
    real_ps = fake.ps

    async def slow_ps() -> Any:
        await asyncio.sleep(0)
        return await real_ps()

    fake.ps = slow_ps  # type: ignore[method-assign]
    got = await asyncio.gather(*(pool.claim(f"r{n}") for n in range(3)))
    assert len(set(got)) == 3
    pool.release("r0")
    assert await pool.claim("r9") == got[0]


# --- NCCL_IB_GID_INDEX from sysfs --------------------------------------------------------


def port(root: Path, hca: str, *, link: str, gids: dict[int, tuple[str, str, str]]) -> None:
    """A fake /sys/class/infiniband/<hca>/ports/1: index -> (type, gid, netdev)."""
    base = root / hca / "ports" / "1"
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "link_layer").write_text(link + "\n")
    for index, (kind, gid, ndev) in gids.items():
        (base / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")
        (base / "gids" / str(index)).write_text(gid + "\n")
        (base / "gid_attrs" / "ndevs" / str(index)).write_text(ndev + "\n")


V4 = "0000:0000:0000:0000:0000:ffff:0a09:0102"
V6 = "fe80:0000:0000:0000:0000:0000:0000:0001"


def test_roce_gets_the_roce_v2_ipv4_gid_of_the_fabric_interface(tmp_path: Path) -> None:
    port(tmp_path, "mlx5_0", link="Ethernet", gids={
        0: ("IB/RoCE v1", V6, "ib0"), 1: ("RoCE v2", V6, "ib0"),
        2: ("IB/RoCE v1", V4, "ib0"), 3: ("RoCE v2", V4, "other"), 5: ("RoCE v2", V4, "ib0"),
    })  # fmt: skip
    assert gid_index(fabric(), sysfs=tmp_path) == 5


def test_no_gid_index_on_infiniband_nor_without_the_device(tmp_path: Path) -> None:
    assert gid_index(fabric(), sysfs=tmp_path) is None  # no device
    port(tmp_path, "mlx5_0", link="InfiniBand", gids={0: ("IB/RoCE v1", V6, "")})
    assert gid_index(fabric(), sysfs=tmp_path) is None


async def test_the_job_gets_the_gid_index_the_machine_has(
    make_service: MakeService, fake: FakeRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sysfs = tmp_path / "sys"
    port(sysfs, "mlx5_0", link="Ethernet", gids={3: ("RoCE v2", V4, "ib0")})
    monkeypatch.setattr("tuneplane_node.jobs.rules.fabric.IB_SYSFS", sysfs)
    service = make_service()
    await service.launch(launch("roce"))
    await service.launch(launch("told", env={"NCCL_IB_GID_INDEX": "7"}))
    assert on(fake, "roce").env["NCCL_IB_GID_INDEX"] == "3"
    assert on(fake, "told").env["NCCL_IB_GID_INDEX"] == "7"


# --- the operator's other rules, and check ---------------------------------------------------


async def test_under_bridge_a_host_request_goes_on_the_fabric_and_refuse_still_refuses(
    make_network_service: MakeNode,  # noqa: F811 (the fixture)
    fake: FakeRuntime,
) -> None:
    bridged = make_network_service(fabrics=[fabric()], job_host_network="bridge").jobs
    await bridged.launch(launch("b", 4))  # the whole machine: bridged anyway under bridge
    assert on(fake, "b").labels[LABEL_NETWORK] == "fabric:ib-a"
    refusing = make_network_service(fabrics=[fabric()], job_host_network="refuse").jobs
    with pytest.raises(InvalidField, match=r"container\.network"):
        await refusing.launch(launch("r", 0))


def test_check_names_the_fabric_network_and_fails_without_its_interface(
    tmp_path: Path,
) -> None:
    settings = fake_settings(tmp_path, fabrics=[fabric()])
    net = tmp_path / "net"
    net.mkdir()
    ((level, text),) = check_fabric_network(settings, net=net)
    assert (level, text) == (FAIL, f"fabric network ib-a: ipvlan on ib0: no interface ib0 "
                                     f"on this machine ({net})")  # fmt: skip
    (net / "ib0").mkdir()
    ((level, text),) = check_fabric_network(settings, net=net)
    assert level == OK
    assert "range 10.9.1.0/30 (4 addresses)" in text
    assert check_fabric_network(fake_settings(tmp_path), net=net) == []
