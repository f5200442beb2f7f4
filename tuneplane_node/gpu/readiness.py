"""Whether this node can run a GPU job: the card count is known, and the engine can hand
the cards to a container.

A node that says "ok" and then fails its first GPU launch with the engine's ``could not
select device driver`` (docker without the NVIDIA runtime) or an unknown CDI device
(podman without a specification) is a node the console cannot trust. So health and
``check`` say so first, with the fix, and a launch asking for cards on such a node is a
409 naming it (`GpuNotReady`), never the engine's 502.

Counting misses some: fewer cards than ``TUNEPLANE_EXPECTED_GPUS``, an NVSwitch fabric
manager not ``Completed`` (CUDA error 802 for every job), a Container Toolkit below
``TUNEPLANE_GPU_TOOLKIT_MIN_VERSION`` (CVE-2025-23266): each is not ready, with the reason.

Ready is ``None`` where the node has no cards by design (a count of 0, from
``TUNEPLANE_LOCAL_GPU_COUNT`` or the driver), and ``True`` without a look at the engine
when ``TUNEPLANE_LOCAL_GPU_PASSTHROUGH=false`` (the operator's word: containers get no
device, development) or on the process runtime (a job sees its cards by
``CUDA_VISIBLE_DEVICES``, no engine between).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.gpu.cdi import gpu_devices
from tuneplane_node.gpu.probe import GpuSnapshot
from tuneplane_node.gpu.toolkit import installed_version, refusal
from tuneplane_node.runtime.base import ContainerRuntime
from tuneplane_node.runtime.facts import CDI_GPU_KIND, DeviceSupport
from tuneplane_node.settings import NodeSettings, env_name
from tuneplane_node.tasks import BackgroundTasks, KeptReading

log = logging.getLogger(__name__)

READING_TTL_S = 10.0
"""How long one look at the engine's runtimes and the CDI files serves: the toolkit is
installed once, and health is asked every few seconds."""
TOOLKIT = "install the NVIDIA Container Toolkit"
FABRIC_UP = "Completed"
GENERATE = "run `sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`"


@dataclass(frozen=True)
class GpuReadiness:
    """``ready``: True, False (``reason`` says why and the fix), None (no cards)."""

    ready: bool | None
    reason: str | None = None


NO_CARDS = GpuReadiness(None)
READY = GpuReadiness(True)


def judge(
    *,
    engine: str,
    support: DeviceSupport | None,
    count: int | None,
    settings: NodeSettings,
    driver_error: str | None = None,
    cdi: set[str] | None = None,
    gpus: GpuSnapshot | None = None,
    toolkit: str | None = None,
) -> GpuReadiness:
    """The verdict from what is known. ``support``, ``cdi`` and ``toolkit`` (the NVIDIA
    Container Toolkit's version; None: not known) are asked for only when the verdict
    needs them (`needs_engine`); ``gpus``: the driver's reading, for what counting misses."""
    if count is None:
        why = f" ({driver_error})" if driver_error else ""
        return GpuReadiness(
            False,
            f"the card count is unknown: no GPU driver answered{why}; install the NVIDIA "
            f"driver, or set {env_name('local_gpu_count')} (0 on a machine without cards)",
        )
    machine = machine_refusal(settings, gpus)
    if machine is not None:
        return GpuReadiness(False, machine)
    if not needs_engine(engine=engine, count=count, settings=settings):
        return NO_CARDS if count == 0 else READY
    old = refusal(toolkit, settings.gpu_toolkit_min_version) if toolkit else None
    if old is not None:
        return GpuReadiness(False, old)
    assert support is not None
    if support.error is not None:
        return GpuReadiness(False, f"cannot ask {engine} how it hands out cards: {support.error}")
    if engine == "podman":  # cards are CDI devices, nvidia.com/gpu=N
        return _cdi(engine, support, count, cdi or set())
    return _docker(engine, support, count, cdi or set())  # a device request, or CDI


def machine_refusal(settings: NodeSettings, gpus: GpuSnapshot | None) -> str | None:
    """What the driver's reading says counting misses: fewer cards than the operator
    expects, an NVSwitch fabric not up. None: nothing (or nothing read)."""
    if gpus is None or not gpus.ok:
        return None
    expected = settings.expected_gpus
    if expected is not None and len(gpus.cards) < expected:
        return (
            f"the driver shows {len(gpus.cards)} of the {expected} cards "
            f"{env_name('expected_gpus')} expects: a card fell off the bus or the driver "
            "lost one; reseat or reset it, or reboot"
        )
    if gpus.fabric is not None and gpus.fabric != FABRIC_UP:
        return (
            f"the NVSwitch fabric manager's state is {gpus.fabric!r}, not {FABRIC_UP!r}: "
            "CUDA would fail every job (error 802, system not yet initialized); start "
            "nvidia-fabricmanager (`systemctl start nvidia-fabricmanager`) and wait for it"
        )
    return None


def needs_engine(*, engine: str, count: int, settings: NodeSettings) -> bool:
    return count > 0 and settings.local_gpu_passthrough and engine != "process"


def _docker(engine: str, support: DeviceSupport, count: int, cdi: set[str]) -> GpuReadiness:
    if "nvidia" in support.runtimes:
        return READY
    if support.cards_by_cdi and not _missing(count, cdi):
        return READY  # the cards are handed as CDI devices
    runtimes = ", ".join(support.runtimes) or "none"
    fix = (
        f"{TOOLKIT} and run `sudo nvidia-ctk runtime configure --runtime=docker`, then "
        "restart docker"
    )
    why = f"{engine} has no nvidia runtime (runtimes: {runtimes})"
    return GpuReadiness(False, f"{why}: {fix}{_dev()}")


def _cdi(engine: str, support: DeviceSupport, count: int, cdi: set[str]) -> GpuReadiness:
    if not support.cdi_local:
        return READY  # the specifications are on the engine's host, which this is not
    missing = _missing(count, cdi)
    if not missing:
        return READY
    named = ", ".join(f"{CDI_GPU_KIND}={index}" for index in missing)
    where = ", ".join(support.cdi_dirs)
    return GpuReadiness(
        False,
        f"no CDI specification in {where} names {named}, which {engine} needs to hand "
        f"the card(s) to a container: {TOOLKIT} and {GENERATE}{_dev()}",
    )


def _missing(count: int, cdi: set[str]) -> list[int]:
    return [index for index in range(count) if str(index) not in cdi]


def _dev() -> str:
    return f"; or, for development, set {env_name('local_gpu_passthrough')}=false"


class ReadinessReader:
    """`judge` over the engine's answer and the CDI files, read at most once per
    `READING_TTL_S` (off the loop) and only when the verdict needs them."""

    def __init__(
        self, runtime: ContainerRuntime, settings: NodeSettings, *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.runtime = runtime
        self.settings = settings
        self.clock = clock
        self._tasks = BackgroundTasks(log)
        # An engine down is asked again by the next request (and that look waited for).
        self._look = KeptReading(
            self._read,
            ttl_s=READING_TTL_S,
            clock=clock,
            tasks=self._tasks,
            name="gpu readiness look",
            keep=lambda looked: looked[0].error is None,
        )

    async def read(
        self, count: int | None, driver_error: str | None = None, gpus: GpuSnapshot | None = None
    ) -> GpuReadiness:
        engine = self.runtime.name
        support, cdi, toolkit = None, None, None
        if count is not None and needs_engine(engine=engine, count=count, settings=self.settings):
            support, cdi, toolkit = await self._look.get()  # the last look; a new one behind it
            if gpus is not None and gpus.source == "simulation":
                toolkit = gpus.toolkit  # the file's word stands for the machine's
        return judge(
            engine=engine,
            support=support,
            count=count,
            settings=self.settings,
            driver_error=driver_error,
            cdi=cdi,
            gpus=gpus,
            toolkit=toolkit,
        )

    async def _read(self) -> tuple[DeviceSupport, set[str], str | None]:
        support = await self.runtime.device_support()
        cdi: set[str] = set()
        if support.cdi_dirs and support.cdi_local and support.error is None:
            cdi = await asyncio.to_thread(gpu_devices, support.cdi_dirs)
        toolkit = None
        if self.settings.gpu_simulation_file is None:
            toolkit = await asyncio.to_thread(installed_version)
        return support, cdi, toolkit

    async def close(self) -> None:
        """Cancel a look in flight (shutdown)."""
        await self._tasks.close()
