"""`GpuSettings`: how the node judges its cards, declared apart (`NodeSettings` extends
it): the XID tables by the scope of a fault (``TUNEPLANE_GPU_XID_*``), the circuit breaker
on automatic take-outs, how often the cards are looked at for faults and for their
return, and what the machine must show to be ready (``TUNEPLANE_EXPECTED_GPUS``, the
toolkit's floor)."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from tuneplane_node.settings.values import DAY


class GpuSettings(BaseSettings):
    """What makes a card's fault the job's, the card's or the machine's, and the bounds
    on what the node does about it by itself."""

    gpu_xid_ignore: list[int] = Field([], max_length=256)
    """XID codes that are nothing at all: not shown, nothing done (none by default: the
    application's own faults are ``TUNEPLANE_GPU_XID_JOB``'s)."""
    gpu_xid_job: list[int] = Field([13, 31, 43, 45, 68, 94], max_length=256)
    """XID codes that are the job's own fault (NVIDIA's catalog: application errors): shown
    on the job holding the card, nothing stopped, the card kept."""
    gpu_xid_card: list[int] = Field([48, 63, 64, 74, 95, 109, 119, 120], max_length=256)
    """XID codes that take the card out until it is reset and then probes clean: its job is
    warned and stopped. An XID in no table is treated so too."""
    gpu_xid_node: list[int] = Field([79], max_length=256)
    """XID codes that take the machine out (79: the card fell off the bus): the node is
    cordoned with the reason and every job is drained, warned."""
    gpu_xid_quarantine_s: float = Field(600.0, ge=0, le=7 * DAY, allow_inf_nan=False)
    """Where the driver tells no reset (no recovery action, no reset count): seconds after
    the last card or node fault before the card may come back on a clean probe. Also how
    long a job-scope fault stays shown."""
    gpu_breaker_per_hour: int = Field(4, ge=0, le=1024)
    """At most this many cards taken out automatically (and node cordons for a card's fault)
    in any hour; past it, faulted cards are kept in and reported, until
    ``ctl gpus reset-breaker`` or a restart."""
    gpu_fault_poll_s: float = Field(2.0, ge=0.1, le=300, allow_inf_nan=False)
    """Seconds between two looks at the cards for new faults and for draining cards' return:
    a job on a faulted card hears its warning within one of these."""
    gpu_drain_timeout_s: float = Field(600.0, ge=0, le=DAY, allow_inf_nan=False)
    """Seconds a card whose job's container is gone may stay ``draining`` (a process still
    on it, or its memory not back at its baseline) before its reason says it is stuck
    (it stays out all the same)."""

    expected_gpus: int | None = Field(None, ge=0, le=1024)
    """The cards this machine should show. Fewer visible to the driver (a card fallen off
    the bus, a driver install that lost one) is not ready, with the reason: counting alone
    would take it as a smaller machine. Unset: whatever the driver shows."""
    gpu_toolkit_min_version: str = Field("1.17.8", pattern=r"^\d+(\.\d+){0,3}$", max_length=40)
    """The oldest NVIDIA Container Toolkit (``nvidia-ctk --version``) a node with cards is
    ready with: 1.17.7 and older give a hostile image host root through the
    createContainer hook (NVIDIAScape, CVE-2025-23266), CDI mode included. A toolkit the
    node cannot read is not judged (``check`` says so)."""

    @field_validator("gpu_xid_ignore", "gpu_xid_job", "gpu_xid_card", "gpu_xid_node")
    @classmethod
    def _xids(cls, codes: list[int]) -> list[int]:
        if any(not 0 < code < 1000 for code in codes):
            raise ValueError("XID codes are whole numbers from 1 to 999")
        return codes
