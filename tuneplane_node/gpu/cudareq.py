"""Whether an image's CUDA runs on this machine's driver, read from the image's own
environment as the NVIDIA Container Toolkit reads it.

An image says the CUDA it needs with ``NVIDIA_REQUIRE_CUDA`` (``cuda>=12.4
brand=tesla,driver>=470,driver<471 ...``: the ``cuda>=`` constraint is the one read here)
or, failing that, ``CUDA_VERSION`` (``12.4.1``: its major and minor). The driver's CUDA is
the version NVML reports it supports (``12.4``). An image that needs more would start and
then find no usable device (PyTorch falls back to the CPU without a word), so a launch of
it asking for cards is a ``409 driver_too_old`` naming both. The ``cuda-compat`` rule: an
image carrying the forward-compatibility libraries sets ``NVIDIA_DISABLE_REQUIRE=true``
(as the toolkit honours it) and is not judged; nor is one that says nothing, nor a driver
whose CUDA is unknown.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from tuneplane_node.runtime.facts import CUDA_DISABLE as DISABLE
from tuneplane_node.runtime.facts import CUDA_REQUIRE as REQUIRE
from tuneplane_node.runtime.facts import CUDA_VERSION as VERSION

_CUDA_AT_LEAST = re.compile(r"(?:^|[\s,])cuda>=(\d+)(?:\.(\d+))?")
_MAJOR_MINOR = re.compile(r"^\s*(\d+)(?:\.(\d+))?")


def required(env: Mapping[str, str]) -> tuple[int, int] | None:
    """The CUDA (major, minor) the image needs; None: it says none, or opts out."""
    if env.get(DISABLE, "").strip().lower() in ("true", "1", "yes"):
        return None
    wants = [
        _version(m.group(1), m.group(2)) for m in _CUDA_AT_LEAST.finditer(env.get(REQUIRE, ""))
    ]
    if wants:
        return max(wants)
    found = _MAJOR_MINOR.match(env.get(VERSION, ""))
    return _version(found.group(1), found.group(2)) if found else None


def driver_cuda(text: str | None) -> tuple[int, int] | None:
    """The driver's CUDA (``12.4``) as (major, minor); None: unknown."""
    found = _MAJOR_MINOR.match(text or "")
    return _version(found.group(1), found.group(2)) if found else None


def too_old(env: Mapping[str, str], driver: str | None) -> tuple[str, str] | None:
    """(what the image needs, what the driver gives) where the driver is too old; None:
    it runs, or the node cannot tell."""
    need, have = required(env), driver_cuda(driver)
    if need is None or have is None or have >= need:
        return None
    return f"{need[0]}.{need[1]}", f"{have[0]}.{have[1]}"


def _version(major: str, minor: str | None) -> tuple[int, int]:
    return int(major), int(minor or 0)
