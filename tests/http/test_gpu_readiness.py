"""GPU readiness (issue 25, finding 1): health's ``gpu_ready`` and a card launch's 409 on
a node whose engine cannot hand the cards to a container, or whose card count is
unknown; in front of the in-memory engine, then the real docker and podman (neither has
the NVIDIA runtime nor a CDI specification on this machine)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.conftest import MakeFakeNode, fake_settings
from tests.fakes.clock import FakeClock
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tuneplane_node.errors import GpuNotReady
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.gpu.cdi import gpu_devices
from tuneplane_node.gpu.probe import NoDriverProbe
from tuneplane_node.gpu.readiness import judge
from tuneplane_node.runtime.facts import DeviceSupport

NO_NVIDIA = DeviceSupport(runtimes=("runc",))


async def test_a_node_without_the_nvidia_runtime_says_so_and_refuses_card_launches(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    fake.support = NO_NVIDIA
    node = await fake_node()
    health = await node.health()
    assert health["ok"] is True  # the engine answers: CPU jobs run
    assert health["gpu_ready"] is False
    assert health["gpu_not_ready_reason"].startswith(
        "fake has no nvidia runtime (runtimes: runc): install the NVIDIA Container Toolkit"
    )
    _, answer = await node.launch(gpus=1, expect=409)
    assert answer["detail"] == f"this node cannot run GPU jobs: {health['gpu_not_ready_reason']}"
    assert fake.calls["run"] == 0  # the engine was never asked for the cards
    await node.launch(gpus=0)  # a job without cards still runs


async def test_a_ready_node_and_a_node_without_cards_by_design(fake_node: MakeFakeNode) -> None:
    health = await (await fake_node()).health()
    assert (health["gpu_ready"], health["gpu_not_ready_reason"]) == (True, None)
    health = await (await fake_node(local_gpu_count=0)).health()
    assert (health["gpu_ready"], health["gpu_not_ready_reason"]) == (None, None)


async def test_passthrough_off_is_ready_by_the_operators_word(
    fake_node: MakeFakeNode, fake: FakeRuntime
) -> None:
    fake.support = NO_NVIDIA
    node = await fake_node(local_gpu_passthrough=False)
    assert (await node.health())["gpu_ready"] is True
    await node.launch(gpus=1)


async def test_an_unknown_card_count_is_not_ready_and_names_the_setting(
    tmp_path: Path, clock: FakeClock, fake: FakeRuntime
) -> None:
    settings = fake_settings(tmp_path, local_gpu_count=None)
    allocator = GpuAllocator(fake, settings, probe=NoDriverProbe("NVML Shared Library Not Found"))
    readiness = await allocator.ready()
    assert readiness.ready is False and readiness.reason is not None
    assert "the card count is unknown: no GPU driver answered (NVML Shared" in readiness.reason
    assert "set TUNEPLANE_LOCAL_GPU_COUNT (0 on a machine without cards)" in readiness.reason
    with pytest.raises(GpuNotReady) as refused:
        await allocator.claim("tuneplane-a", 1, run_id="a")
    assert refused.value.status == 409 and GpuNotReady.code == "gpu_not_ready"
    assert await allocator.claim("tuneplane-b", 0, run_id="b") == ()
    await allocator.close()


async def test_the_engines_answer_is_read_once_per_period(
    tmp_path: Path, fake: FakeRuntime
) -> None:
    calls, answer = 0, NO_NVIDIA

    async def counted() -> DeviceSupport:
        nonlocal calls
        calls += 1
        return answer

    fake.device_support = counted  # type: ignore[method-assign]
    clock = FakeClock()
    allocator = GpuAllocator(fake, fake_settings(tmp_path), probe=FakeProbe(2), clock=clock)
    for _ in range(5):
        assert (await allocator.ready()).ready is False
    assert calls == 1
    clock.advance(11)
    answer = DeviceSupport(runtimes=("nvidia", "runc"))  # the toolkit installed meanwhile
    # A period later: the last answer at once, a burst sharing one look behind it ...
    burst = await asyncio.gather(*(allocator.ready() for _ in range(20)))
    assert {readiness.ready for readiness in burst} == {False}
    # ... whose answer the next requests see.
    await wait_until_ready(allocator)
    assert calls == 2
    await allocator.close()


async def wait_until_ready(allocator: GpuAllocator) -> None:
    for _ in range(500):
        if (await allocator.ready()).ready:
            return
        await asyncio.sleep(0.01)
    pytest.fail("the look behind the burst never landed")


# --- CDI specifications ---------------------------------------------------------------

NVIDIA_CTK_YAML = """---
cdiVersion: 0.5.0
containerEdits:
  hooks:
  - args: [nvidia-ctk, hook]
    hookName: createContainer
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
    env:
    - name: NOT_A_DEVICE
  name: "0"
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
  name: "1"
- containerEdits: {}
  name: all
kind: nvidia.com/gpu
"""


def test_cdi_devices_are_read_from_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "etc" / "nvidia.yaml").write_text(NVIDIA_CTK_YAML)
    other = {"cdiVersion": "0.6.0", "kind": "vendor.com/fpga", "devices": [{"name": "7"}]}
    (tmp_path / "run" / "fpga.json").write_text(json.dumps(other))
    gpus = {"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": [{"name": "2"}]}
    (tmp_path / "run" / "more.json").write_text(json.dumps(gpus))
    (tmp_path / "run" / "broken.json").write_text("{")
    dirs = [str(tmp_path / "etc"), str(tmp_path / "run"), str(tmp_path / "absent")]
    assert gpu_devices(dirs) == {"0", "1", "2", "all"}


@pytest.mark.parametrize(("cdi", "ready"), [({"0", "1"}, True), ({"0"}, False), (set(), False)])
def test_podman_is_ready_when_a_specification_names_each_card(
    tmp_path: Path, cdi: set[str], ready: bool
) -> None:
    support = DeviceSupport(cdi_dirs=("/etc/cdi", "/var/run/cdi"))
    verdict = judge(
        engine="podman", support=support, count=2, settings=fake_settings(tmp_path), cdi=cdi
    )
    assert verdict.ready is ready
    if not ready:
        assert verdict.reason is not None and "nvidia.com/gpu=1" in verdict.reason
        assert "`sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`" in verdict.reason


def test_docker_with_cdi_naming_each_card_is_ready(tmp_path: Path) -> None:
    support = DeviceSupport(runtimes=("runc",), cdi_dirs=("/etc/cdi",))
    settings = fake_settings(tmp_path)
    assert judge(engine="docker", support=support, count=2, settings=settings, cdi={"0", "1"})
    verdict = judge(engine="docker", support=support, count=2, settings=settings, cdi={"0"})
    assert verdict.ready is False
