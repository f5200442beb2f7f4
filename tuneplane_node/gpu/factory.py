"""Choosing the probe of this machine: the simulation file, NVML, or none and why.

Above every probe module: it imports them, none imports it.
"""

from __future__ import annotations

import logging

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.gpu.probe import DriverUnavailableError, GpuProbe, NoDriverProbe
from tuneplane_node.gpu.simulation import SimulatedProbe
from tuneplane_node.settings import NodeSettings

log = logging.getLogger(__name__)


def make_probe(settings: NodeSettings, *, clock: Clock = SYSTEM_CLOCK) -> GpuProbe:
    """The simulation file when one is set, else NVML, else a probe that says why not;
    ``clock`` times the XID quarantine and dates its reason."""
    if settings.gpu_simulation_file is not None:
        log.info("GPU probe: simulation file %s", settings.gpu_simulation_file)
        return SimulatedProbe(settings.gpu_simulation_file, settings, clock=clock)
    try:
        probe = _nvml_probe(settings, clock)
    except DriverUnavailableError as exc:
        log.info("GPU probe: none (%s)", exc.reason)
        return NoDriverProbe(exc.reason)
    log.info("GPU probe: NVML")
    return probe


def _nvml_probe(settings: NodeSettings, clock: Clock) -> GpuProbe:
    try:
        # Here, not at the top: without nvidia-ml-py the node runs, with NoDriverProbe.
        from tuneplane_node.gpu.nvml import NvmlProbe

        return NvmlProbe(settings, clock=clock)
    except DriverUnavailableError:
        raise
    except ImportError as exc:
        raise DriverUnavailableError(f"nvidia-ml-py is not installed: {exc}") from exc
    except Exception as exc:  # an old or broken binding: run without GPUs, say why
        log.exception("GPU probe: NVML failed to start")
        raise DriverUnavailableError(f"NVML probe failed to start: {exc!r}") from exc
