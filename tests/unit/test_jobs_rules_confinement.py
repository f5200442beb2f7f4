"""The operator's rules for every job, applied whatever the console asked."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE, MakeFakeNode, fake_settings
from tests.fakes.runtime import FakeRuntime
from tests.support.console import console_0315
from tuneplane_node.errors import ConfigError, InvalidField
from tuneplane_node.jobs import Node
from tuneplane_node.jobs.rules.confinement import JobRules, job_tmpfs
from tuneplane_node.runtime.spec import KEPT_CAPABILITIES, ContainerSpec, Tmpfs
from tuneplane_node.settings import load_settings
from tuneplane_node.wire.values import LABEL_NETWORK, LABEL_RUN_ID, Launch, Mount

GIB = 2**30
SPEC = ContainerSpec(name="tuneplane-r1", image=IMAGE, labels={LABEL_RUN_ID: "r1"})


def rules(tmp_path: Path, machine: int = 32 * GIB, **settings: Any) -> JobRules:
    return JobRules(fake_settings(tmp_path, **settings), machine_bytes=machine)


@pytest.mark.parametrize(
    ("machine", "settings", "limit"),
    [
        (32 * GIB, {}, 32 * GIB - 32 * GIB // 20),  # 5%
        (8 * GIB, {}, 7 * GIB),  # 5% is less than 1 GiB
        (32 * GIB, {"system_reserved_memory": "4g"}, 28 * GIB),
        (32 * GIB, {"system_reserved_memory": str(2 * GIB)}, 30 * GIB),
        (32 * GIB, {"system_reserved_memory": 0}, 32 * GIB),
    ],
)
def test_a_job_without_a_memory_limit_gets_the_machine_less_the_reserve(
    tmp_path: Path, machine: int, settings: dict[str, Any], limit: int
) -> None:
    assert rules(tmp_path, machine, **settings).apply(SPEC).memory_limit == str(limit)


def test_a_consoles_own_memory_limit_is_kept(tmp_path: Path) -> None:
    spec = replace(SPEC, memory_limit="64g")
    assert rules(tmp_path, 32 * GIB).apply(spec).memory_limit == "64g"


def test_a_reserve_that_leaves_jobs_nothing_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^TUNEPLANE_SYSTEM_RESERVED_MEMORY: reserving 40g"):
        rules(tmp_path, 32 * GIB, system_reserved_memory="40g")


@pytest.mark.parametrize("size", ["lots", "-1", "4 g", "1e9"])
def test_a_reserve_that_is_not_a_size_is_a_config_error(size: str) -> None:
    with pytest.raises(ConfigError, match=r"TUNEPLANE_SYSTEM_RESERVED_MEMORY: must be a size"):
        load_settings(node_token="t", system_reserved_memory=size)


def test_the_default_confinement_keeps_what_a_trainer_needs(tmp_path: Path) -> None:
    confined = rules(tmp_path).apply(SPEC).confinement
    assert confined.capabilities == KEPT_CAPABILITIES
    assert not {"NET_RAW", "NET_BIND_SERVICE", "MKNOD", "AUDIT_WRITE", "SETFCAP"} & set(
        confined.capabilities
    )
    assert (confined.no_new_privileges, confined.pids_limit, confined.oom_score_adj) == (
        True, 16384, 500,
    )  # fmt: skip
    assert (confined.log_max_bytes, confined.log_max_files) == (10 * 2**20, 5)


def test_the_operator_sets_every_bound(tmp_path: Path) -> None:
    confined = (
        rules(
            tmp_path,
            job_capabilities="restricted",
            job_no_new_privileges=False,
            job_pids_limit=200,
            job_log_max_bytes=2**20,
            job_log_max_files=2,
            job_oom_score_adj=900,
        )
        .apply(SPEC)
        .confinement
    )
    assert confined.capabilities == ()
    assert (confined.no_new_privileges, confined.pids_limit, confined.oom_score_adj) == (
        False, 200, 900,
    )  # fmt: skip
    assert confined.log_budget == 2 * 2**20


@pytest.mark.parametrize("network", ["host", "bridge", "none"])
def test_host_networking_is_allowed_when_the_operator_says_so(tmp_path: Path, network: str) -> None:
    spec = rules(tmp_path, job_host_network="allow").apply(replace(SPEC, network=network))
    assert spec.network == network and LABEL_NETWORK not in spec.labels  # written when placed


def test_host_networking_runs_on_the_bridge_when_the_operator_says_so(tmp_path: Path) -> None:
    spec = rules(tmp_path, job_host_network="bridge").apply(replace(SPEC, network="host"))
    assert spec.network == "isolated"  # the node's job network (TUNEPLANE_JOB_NETWORK)
    assert spec.labels == {LABEL_RUN_ID: "r1", LABEL_NETWORK: "isolated"}  # observe shows it


def test_host_networking_is_refused_when_the_operator_says_so(tmp_path: Path) -> None:
    host_rules = rules(tmp_path, job_host_network="refuse")
    with pytest.raises(InvalidField) as refused:
        host_rules.apply(replace(SPEC, network="host"))
    assert refused.value.field == "container.network"
    assert "TUNEPLANE_JOB_HOST_NETWORK=refuse" in refused.value.reason
    assert host_rules.apply(replace(SPEC, network="none")).network == "none"


async def test_every_launch_reaches_the_engine_confined(
    tmp_path: Path, fake: FakeRuntime, node: Node
) -> None:
    """The console's spec carries no confinement of its own: the node's replaces it."""
    loose = replace(SPEC.confinement, capabilities=("SYS_ADMIN",), pids_limit=10**9)
    request = Launch("r1", 0, replace(SPEC, confinement=loose))

    await node.jobs.launch(request)

    made = fake.containers["tuneplane-r1"].spec
    assert made.confinement == node.rules.confinement
    assert made.confinement.capabilities == KEPT_CAPABILITIES
    assert made.memory_limit == str(node.rules.memory_limit)


# --- through the API, as a console sees it ---------------------------------------------------


async def test_a_0315_launch_on_a_bridging_node_runs_on_the_bridge_and_says_so(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node(job_host_network="bridge", job_network="bridge")
    answer = await node.ok("POST", "/node/v1/launch", json=console_0315("r1", 0, image=IMAGE))

    assert answer["phase"] == "running"
    assert fake.containers["tuneplane-r1"].spec.network == "bridge"
    assert (await node.state("tuneplane-r1"))["labels"][LABEL_NETWORK] == "bridge"


@pytest.mark.parametrize("kind", ["isolated", "sealed"])
async def test_a_bridged_job_runs_on_the_nodes_job_network_and_observe_says_which(
    fake_node: MakeFakeNode, fake: FakeRuntime, kind: str
) -> None:
    node = await fake_node(job_host_network="bridge", job_network=kind)
    await node.ok("POST", "/node/v1/launch", json=console_0315("r1", 0, image=IMAGE))

    assert fake.containers["tuneplane-r1"].spec.network == kind
    state = await node.state("tuneplane-r1")
    assert (state["network"], state["labels"][LABEL_NETWORK]) == (kind, kind)


async def test_a_host_network_launch_on_a_refusing_node_is_a_422_and_makes_nothing(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node(job_host_network="refuse", local_gpu_count=2)
    status, body = await node.call(
        "POST", "/node/v1/launch", json=console_0315("r1", 1, image=IMAGE)
    )

    assert status == 422
    assert body["detail"].startswith("container.network: host networking is refused on this node")
    assert not fake.containers and (await node.health())["gpus_free"] == 2


async def test_an_engine_namespace_label_is_a_422_naming_it(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    labels = {"io.containers.autoupdate": "registry"}
    launch = console_0315("r1", 0, image=IMAGE, labels=labels)
    status, body = await node.call("POST", "/node/v1/launch", json=launch)

    assert status == 422
    assert body["detail"] == "container.labels.io.containers.autoupdate: the engines' own namespace"
    assert not fake.containers


# --- a read-only root and its tmpfs ------------------------------------------------------------

MIB = 2**20


def tmpfs_of(spec: ContainerSpec) -> dict[str, int]:
    return {each.path: each.size_bytes for each in spec.tmpfs}


def test_by_default_the_root_is_writable_and_has_no_tmpfs_of_the_nodes(tmp_path: Path) -> None:
    spec = rules(tmp_path).apply(SPEC)
    assert (spec.read_only_root, spec.tmpfs) == (False, ())


@pytest.mark.parametrize(
    ("operator", "asked"), [(False, True), (True, None), (True, False), (True, True)]
)
def test_the_root_is_read_only_when_the_launch_asks_or_the_operator_says(
    tmp_path: Path, operator: bool, asked: bool | None
) -> None:
    """A launch's false is not asked: it never undoes the operator's true."""
    spec = rules(tmp_path, job_read_only_root=operator).apply(replace(SPEC, read_only_root=asked))
    assert spec.read_only_root is True
    assert tmpfs_of(spec) == {"/tmp": GIB, "/run": 64 * MIB}  # 32 GiB machine: the setting


@pytest.mark.parametrize(
    ("memory_limit", "setting", "tmp", "run"),
    [
        ("512m", "1g", 256 * MIB, 64 * MIB),  # half the job's memory
        ("64m", "1g", 32 * MIB, 32 * MIB),
        ("64g", "2g", 2 * GIB, 64 * MIB),  # the setting
        (None, "8m", 8 * MIB, 8 * MIB),  # the machine's memory less the reserve: the setting
    ],
)
def test_tmp_takes_at_most_the_setting_and_half_the_jobs_memory(
    tmp_path: Path, memory_limit: str | None, setting: str, tmp: int, run: int
) -> None:
    spec = replace(SPEC, read_only_root=True, memory_limit=memory_limit)
    confined = rules(tmp_path, job_tmpfs_size=setting).apply(spec)
    assert tmpfs_of(confined) == {"/tmp": tmp, "/run": run}


def test_a_job_without_any_memory_limit_is_held_by_the_tmpfs_size_alone() -> None:
    """Only where the machine's memory cannot be read (no default limit either)."""
    assert job_tmpfs(2 * GIB, None) == (Tmpfs("/tmp", 2 * GIB), Tmpfs("/run", 64 * MIB))


def test_a_consoles_own_mount_on_tmp_is_where_the_job_writes_there(tmp_path: Path) -> None:
    spec = replace(SPEC, read_only_root=True, mounts=(Mount(str(tmp_path), "/tmp/", False),))
    assert tmpfs_of(rules(tmp_path).apply(spec)) == {"/run": 64 * MIB}


@pytest.mark.parametrize("size", ["lots", "512k", "0", "2p"])
def test_a_tmpfs_size_that_is_not_one_is_a_config_error(size: str) -> None:
    with pytest.raises(ConfigError, match=r"TUNEPLANE_JOB_TMPFS_SIZE: must be a size"):
        load_settings(node_token="t", job_tmpfs_size=size)


def test_a_pids_reserve_that_leaves_jobs_nothing_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^TUNEPLANE_SYSTEM_RESERVED_PIDS: reserving"):
        rules(tmp_path, system_reserved_pids=4194304)


async def test_a_read_only_launch_reaches_the_engine_with_its_tmpfs(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    node = await fake_node()
    launch = console_0315("r1", 0, image=IMAGE, read_only_root=True, memory_limit="1g")
    await node.ok("POST", "/node/v1/launch", json=launch)

    made = fake.containers["tuneplane-r1"].spec
    assert made.read_only_root is True
    assert tmpfs_of(made) == {"/tmp": 512 * MIB, "/run": 64 * MIB}
    assert (await node.state("tuneplane-r1"))["read_only_root"] is True  # observe says it


@pytest.mark.parametrize("value", ["yes", 1, "true", []])
async def test_read_only_root_that_is_not_a_boolean_is_a_422_naming_it(
    fake_node: MakeFakeNode, fake: FakeRuntime, value: object
) -> None:
    node = await fake_node()
    launch = console_0315("r1", 0, image=IMAGE, read_only_root=value)
    status, body = await node.call("POST", "/node/v1/launch", json=launch)

    assert status == 422
    assert body["detail"] == "container.read_only_root: must be true or false"
    assert not fake.containers
