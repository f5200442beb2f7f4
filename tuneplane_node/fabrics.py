"""The machine's InfiniBand fabrics as the operator names them (``TUNEPLANE_FABRICS``):
each fabric's HCAs and the slowest active port's rate, from sysfs; a configured HCA the
machine does not have refused at start; the RDMA devices a job may be handed, from
/dev/infiniband. Part of the inventory (`inventory.collect`), read by the job rules and
`check` too. Blocking file-system reads: a thread's."""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tuneplane_node.errors import ConfigError
from tuneplane_node.settings import Fabric, env_name

IB_SYSFS = Path("/sys/class/infiniband")
READ_CHUNK = 16384  # a v1 memory.stat is about 1 KiB; a bigger file takes more reads


@dataclass(frozen=True)
class FabricFacts:
    fabric: str
    hcas: tuple[str, ...]
    rate_gbps: float | None  # the slowest active port; None when none is active
    rdma_to_jobs: bool = False  # its devices are handed to jobs (TUNEPLANE_RDMA)


def fabrics(
    configured: Sequence[Fabric], *, sysfs: Path = IB_SYSFS, rdma_to_jobs: bool = False
) -> list[FabricFacts]:
    """Each operator-named fabric with its HCAs and the slowest active port's rate in Gb/s.

    The slowest port bounds what a job spanning the fabric gets; no active port gives
    None. HCAs not named in the settings are not reported.
    """
    return [
        FabricFacts(
            fabric=fabric.name,
            hcas=tuple(fabric.hcas),
            rate_gbps=min(
                (rate for hca in fabric.hcas for rate in active_rates(sysfs, hca)), default=None
            ),
            rdma_to_jobs=rdma_to_jobs,
        )
        for fabric in configured
    ]


RDMA_DEVICES = re.compile(r"uverbs[0-9]+|rdma_cm")
"""The verbs and connection-manager devices a job's NCCL needs; umad* is for management
tools (the subnet manager's), never a job's."""


def rdma_devices(directory: Path) -> tuple[Path, ...]:
    """The RDMA character devices in ``directory`` (/dev/infiniband), sorted; none when
    the directory is missing or unreadable (a machine without InfiniBand)."""
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return ()
    found = []
    for entry in entries:
        with contextlib.suppress(OSError):
            if RDMA_DEVICES.fullmatch(entry.name) and stat.S_ISCHR(entry.lstat().st_mode):
                found.append(entry)
    return tuple(found)


def active_rates(sysfs: Path, hca: str) -> list[float]:
    """Rates in Gb/s of the HCA's ACTIVE ports; a missing HCA or unreadable port adds none."""
    directory = _hca_dir(sysfs, hca)
    if directory is None:
        return []
    rates = []
    for port in sorted((directory / "ports").glob("*")):
        state = read_ascii(port / "state") or ""  # "4: ACTIVE"
        rate = _parse_rate(read_ascii(port / "rate"))  # "200 Gb/sec (4X HDR)"
        if state.rsplit(":", 1)[-1].strip() == "ACTIVE" and rate is not None:
            rates.append(rate)
    return rates


def check_fabrics(configured: Sequence[Fabric], *, sysfs: Path = IB_SYSFS) -> None:
    """Refuse to start on a configured HCA this machine does not have (a typo, or a
    card gone), rather than report a fabric the node is not on. Raises ConfigError."""
    missing = [
        f"{hca} (fabric {fabric.name})"
        for fabric in configured
        for hca in fabric.hcas
        if (directory := _hca_dir(sysfs, hca)) is None or not directory.is_dir()
    ]
    if missing:
        present = sorted(entry.name for entry in sysfs.glob("*"))
        found = ", ".join(present) if present else "no HCA at all"
        raise ConfigError(
            f"{env_name('fabrics')}: HCA not found in {sysfs}: {', '.join(missing)}; "
            f"this machine has {found}"
        )


def _hca_dir(sysfs: Path, hca: str) -> Path | None:
    """The HCA's sysfs directory; None for a name that is not a plain file name."""
    if hca in ("", ".", "..") or "/" in hca:
        return None
    return sysfs / hca


def read_ascii(path: str | os.PathLike[str]) -> str | None:
    """A small file's text (sysfs, /proc, cgroupfs), stripped; None where unreadable or
    not ASCII. Read with the bare calls: the stats sampler reads 1,500 of them for 300
    jobs on the engine's pool, holding the GIL a request burst waits for, and
    `Path.read_text`'s layers (a buffered text file, its decoder) were most of that."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, READ_CHUNK):
            chunks.append(chunk)
        return b"".join(chunks).decode("ascii").strip()
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)


def _parse_rate(text: str | None) -> float | None:
    try:
        return float((text or "").split()[0])
    except (IndexError, ValueError):
        return None
