"""RDMA for multi-node jobs: which jobs get the machine's InfiniBand devices, decided by
the operator's rule and a launch's opt-out, never by a console naming devices. The
devices are test nodes made with mknod (clones of /dev/null): no InfiniBand here."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE, MakeFakeNode, fake_settings
from tests.fakes.runtime import FakeRuntime
from tuneplane_node import fabrics
from tuneplane_node.errors import NoRdma
from tuneplane_node.jobs.rules.confinement import JobRules
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import Fabric
from tuneplane_node.wire.values import LABEL_RUN_ID

SPEC = ContainerSpec(name="tuneplane-r1", image=IMAGE, labels={LABEL_RUN_ID: "r1"})
NULL = os.stat("/dev/null").st_rdev


def rdma_dir(root: Path) -> Path:
    """uverbs0, uverbs1 and rdma_cm as character devices; umad0 (a management tool's),
    and a plain file and a symlink of a device's name, which a job must not get."""
    directory = root / "infiniband"
    directory.mkdir()
    for name in ("uverbs0", "uverbs1", "rdma_cm", "umad0"):
        os.mknod(directory / name, stat.S_IFCHR | 0o666, NULL)
    (directory / "uverbs9").write_text("not a device")
    (directory / "uverbs7").symlink_to("/dev/null")
    return directory


def rules(tmp_path: Path, **settings: Any) -> JobRules:
    return JobRules(fake_settings(tmp_path, **settings), machine_bytes=32 * 2**30)


def test_only_the_verbs_and_cm_character_devices_are_found(tmp_path: Path) -> None:
    found = fabrics.rdma_devices(rdma_dir(tmp_path))
    assert [path.name for path in found] == ["rdma_cm", "uverbs0", "uverbs1"]
    assert fabrics.rdma_devices(tmp_path / "none") == ()


@pytest.mark.parametrize(
    ("rule", "asked", "cards", "given"),
    [
        ("auto", None, 1, True),
        ("auto", None, 0, False),  # no card: no NCCL across machines to speak of
        ("auto", False, 4, False),  # the launch opts out
        ("auto", True, 0, True),  # the launch needs them
        ("all", None, 0, True),
        ("off", None, 4, False),
    ],
)
def test_the_rule_and_the_launch_decide_which_jobs_get_the_devices(
    tmp_path: Path, rule: str, asked: bool | None, cards: int, given: bool
) -> None:
    directory = rdma_dir(tmp_path)
    fabrics = [Fabric(name="ib", hcas=["mlx5_0", "mlx5_1"])]
    spec = rules(tmp_path, rdma=rule, rdma_device_dir=directory, fabrics=fabrics).apply(
        replace(SPEC, rdma=asked), cards=cards
    )
    devices = [str(directory / name) for name in ("rdma_cm", "uverbs0", "uverbs1")]
    assert spec.rdma_devices == (tuple(devices) if given else ())
    assert spec.env.get("NCCL_IB_HCA") == ("mlx5_0,mlx5_1" if given else None)
    if given:
        assert spec.rdma_mappings()[0] == f"{devices[0]}:/dev/infiniband/rdma_cm:rwm"


def test_the_consoles_nccl_ib_hca_wins(tmp_path: Path) -> None:
    fabrics = [Fabric(name="ib", hcas=["mlx5_0"])]
    asked = replace(SPEC, env={"NCCL_IB_HCA": "=mlx5_3:1"})
    spec = rules(tmp_path, rdma_device_dir=rdma_dir(tmp_path), fabrics=fabrics).apply(
        asked, cards=1
    )
    assert spec.env["NCCL_IB_HCA"] == "=mlx5_3:1" and spec.rdma_devices


@pytest.mark.parametrize(("rule", "said"), [("off", "TUNEPLANE_RDMA=off"), ("auto", "none under")])
def test_a_launch_needing_rdma_on_a_node_without_is_a_409(
    tmp_path: Path, rule: str, said: str
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NoRdma) as refused:
        rules(tmp_path, rdma=rule, rdma_device_dir=empty).apply(replace(SPEC, rdma=True))
    assert refused.value.status == 409 and said in refused.value.message


async def test_over_http_rdma_is_a_boolean_and_a_refusal_creates_nothing(
    fake_node: MakeFakeNode, fake: FakeRuntime, tmp_path: Path
) -> None:
    node = await fake_node(rdma_device_dir=tmp_path / "none")
    _, answer = await node.launch(image=IMAGE, run_id="r1", rdma="yes", expect=422)
    assert answer["detail"].startswith("container.rdma: must be true or false")
    _, answer = await node.launch(image=IMAGE, run_id="r2", rdma=True, expect=409)
    assert "hands jobs no RDMA devices" in answer["detail"]
    assert fake.containers == {}
    ref, _ = await node.launch(image=IMAGE, run_id="r3", rdma="", gpus=1)  # 0.3.15's empty
    assert fake.containers[ref].spec.rdma_devices == ()
    inventory_answer = await node.ok("GET", "/node/v1/inventory")
    assert all(not fabric["rdma_to_jobs"] for fabric in inventory_answer["fabrics"])
