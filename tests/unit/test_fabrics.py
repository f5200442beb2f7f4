"""The fabrics from sysfs: each fabric's slowest active port, a configured HCA the
machine lacks refused (the RDMA devices': test_jobs_rules_confinement_rdma.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuneplane_node.errors import ConfigError
from tuneplane_node.fabrics import FabricFacts, check_fabrics, fabrics
from tuneplane_node.settings import Fabric


def add_port(sysfs: Path, hca: str, port: int, state: str, rate: str) -> None:
    directory = sysfs / hca / "ports" / str(port)
    directory.mkdir(parents=True)
    (directory / "state").write_text(state + "\n")
    (directory / "rate").write_text(rate + "\n")


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    root = tmp_path / "infiniband"
    add_port(root, "mlx5_0", 1, "4: ACTIVE", "200 Gb/sec (4X HDR)")
    add_port(root, "mlx5_1", 1, "4: ACTIVE", "100 Gb/sec (4X EDR)")
    add_port(root, "mlx5_1", 2, "1: DOWN", "10 Gb/sec (4X)")
    add_port(root, "mlx5_2", 1, "1: DOWN", "400 Gb/sec (4X NDR)")
    add_port(root, "mlx5_9", 1, "4: ACTIVE", "25 Gb/sec (1X EDR)")
    return root


def test_a_fabric_runs_at_its_slowest_active_port(sysfs: Path) -> None:
    configured = [
        Fabric(name="compute", hcas=["mlx5_0", "mlx5_1"]),
        Fabric(name="storage", hcas=["mlx5_2"]),
    ]

    assert fabrics(configured, sysfs=sysfs) == [
        FabricFacts("compute", ("mlx5_0", "mlx5_1"), 100.0),
        FabricFacts("storage", ("mlx5_2",), None),
    ]


def test_no_fabric_configured_reports_none(sysfs: Path) -> None:
    assert fabrics([], sysfs=sysfs) == []


def test_check_fabrics_names_the_missing_hca(sysfs: Path) -> None:
    configured = [Fabric(name="compute", hcas=["mlx5_0", "mlx5_7"])]

    with pytest.raises(ConfigError) as caught:
        check_fabrics(configured, sysfs=sysfs)

    assert "mlx5_7 (fabric compute)" in caught.value.message
    assert "mlx5_0 (fabric" not in caught.value.message
    assert "TUNEPLANE_FABRICS" in caught.value.message


@pytest.mark.parametrize("hca", ["../mlx5_0", "/etc", ".."])
def test_check_fabrics_refuses_a_name_that_is_a_path(sysfs: Path, hca: str) -> None:
    with pytest.raises(ConfigError):
        check_fabrics([Fabric(name="compute", hcas=[hca])], sysfs=sysfs / "mlx5_1")


def test_check_fabrics_passes_when_every_hca_is_there(sysfs: Path, tmp_path: Path) -> None:
    check_fabrics([Fabric(name="compute", hcas=["mlx5_0", "mlx5_2"])], sysfs=sysfs)
    check_fabrics([], sysfs=tmp_path / "no-infiniband-here")
