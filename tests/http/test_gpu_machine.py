"""Readiness that catches what counting misses (issue 53): fewer cards than the operator
expects, an NVSwitch fabric not up, an NVIDIA Container Toolkit below the floor
(CVE-2025-23266). A simulated machine in front of the fake engine; the toolkit's version
as ``nvidia-ctk --version`` prints it, from a stand-in on PATH."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.conftest import IMAGE, MakeFakeNode
from tests.fakes.runtime import FakeRuntime
from tests.gpusimulation import Simulation, simulated_node
from tests.nvmlprobe import settings
from tuneplane_node.gpu import toolkit
from tuneplane_node.gpu.readiness import judge
from tuneplane_node.runtime.facts import DeviceSupport

NVIDIA = DeviceSupport(runtimes=("nvidia", "runc"))


async def not_ready_because(make: MakeFakeNode, sim: Simulation, **overrides: object) -> str:
    node = await simulated_node(make, sim, **overrides)
    health = await node.health()
    assert health["gpu_ready"] is False, health
    _, answer = await node.launch(gpus=1, expect=409)
    assert answer["code"] == "gpu_not_ready"
    return str(health["gpu_not_ready_reason"])


@pytest.mark.slow
async def test_fewer_cards_than_expected_is_not_ready(
    fake_node: MakeFakeNode, fake: FakeRuntime, tmp_path: Path
) -> None:
    sim = Simulation(tmp_path / "three.json", cards=3)
    reason = await not_ready_because(fake_node, sim, expected_gpus=4)
    assert reason.startswith("the driver shows 3 of the 4 cards TUNEPLANE_EXPECTED_GPUS expects")
    node = await simulated_node(fake_node, sim, expected_gpus=3)
    assert (await node.health())["gpu_ready"] is True


@pytest.mark.slow
@pytest.mark.parametrize(
    ("key", "bad", "good", "said"),
    [("fabric_manager", "In Progress", "Completed",
      "fabric manager's state is 'In Progress', not 'Completed': CUDA would fail every "
      "job (error 802"),
     ("toolkit_version", "1.17.7", "1.17.8",
      "the NVIDIA Container Toolkit is 1.17.7, older than "
      "TUNEPLANE_GPU_TOOLKIT_MIN_VERSION=1.17.8: CVE-2025-23266")],
)  # fmt: skip
async def test_a_fabric_not_up_or_an_old_toolkit_is_not_ready(
    fake_node: MakeFakeNode, fake: FakeRuntime, sim: Simulation, key: str, bad: str,
    good: str, said: str,
) -> None:  # fmt: skip
    sim.data[key] = bad
    sim.write()
    assert said in await not_ready_because(fake_node, sim)
    sim.data[key] = good
    sim.write()
    assert (await (await simulated_node(fake_node, sim)).health())["gpu_ready"] is True


@pytest.mark.slow
async def test_the_toolkits_floor_is_the_operators(
    fake_node: MakeFakeNode, fake: FakeRuntime, sim: Simulation
) -> None:
    sim.data["toolkit_version"] = "1.17.8"
    sim.write()
    node = await simulated_node(fake_node, sim, gpu_toolkit_min_version="1.18")
    reason = (await node.health())["gpu_not_ready_reason"]
    assert "older than TUNEPLANE_GPU_TOOLKIT_MIN_VERSION=1.18" in reason


def test_the_toolkit_floor_is_judged_only_where_the_engine_hands_cards() -> None:
    old = dict(support=NVIDIA, count=4, toolkit="1.17.7")
    assert judge(engine="docker", settings=settings(), **old).ready is False  # type: ignore[arg-type]
    assert judge(engine="process", settings=settings(), **old).ready is True  # type: ignore[arg-type]
    unknown = dict(support=NVIDIA, count=4, toolkit=None)
    assert judge(engine="docker", settings=settings(), **unknown).ready is True  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("printed", "version"),
    [("NVIDIA Container Toolkit CLI version 1.17.8\ncommit: f202b80", "1.17.8"),
     ("NVIDIA Container Toolkit CLI version v1.16.2", "1.16.2"),
     ("nothing to see", None)],
)  # fmt: skip
def test_the_toolkit_version_is_read_from_nvidia_ctk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, printed: str, version: str | None
) -> None:
    ctk = tmp_path / "nvidia-ctk"
    ctk.write_text(f"#!/bin/sh\ncat <<'EOF'\n{printed}\nEOF\n")
    ctk.chmod(ctk.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert toolkit.installed_version() == version


def test_versions_compare_by_their_numbers() -> None:
    assert toolkit.older("1.17.7", "1.17.8") and toolkit.older("1.9", "1.17.8")
    assert not toolkit.older("1.17.8", "1.17.8") and not toolkit.older("1.18", "1.17.8")
    assert toolkit.installed_version("no-such-nvidia-ctk") is None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("env", "refused"),
    [({"NVIDIA_REQUIRE_CUDA": "cuda>=13.0 brand=tesla,driver>=535,driver<536"}, "13.0"),
     ({"CUDA_VERSION": "12.6.3"}, "12.6"),
     ({"CUDA_VERSION": "12.4.1"}, None),
     ({"NVIDIA_REQUIRE_CUDA": "cuda>=13.0", "NVIDIA_DISABLE_REQUIRE": "true"}, None),
     ({}, None)],
)  # fmt: skip
async def test_an_image_needing_a_newer_cuda_than_the_drivers_is_refused_naming_both(
    fake_node: MakeFakeNode, fake: FakeRuntime, sim: Simulation, env: dict[str, str],
    refused: str | None,
) -> None:  # fmt: skip
    sim.data["cuda"] = "12.4"
    sim.write()
    node = await simulated_node(fake_node, sim)
    fake.image_envs[IMAGE] = env
    if refused is None:
        await node.launch(image=IMAGE, gpus=1)
        return
    _, answer = await node.launch(image=IMAGE, gpus=1, expect=409)
    assert answer["code"] == "driver_too_old"
    assert answer["detail"].startswith(
        f"the image {IMAGE} needs CUDA {refused}; this node's driver gives CUDA 12.4 "
        "(driver 580.159.03)"
    )
    assert fake.calls["run"] == 0
    await node.launch(image=IMAGE, gpus=0)  # without a card it needs no driver
