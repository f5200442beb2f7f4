"""Settings read from the arguments alone, and whether the NVIDIA driver's library loads:
what tests/unit/test_gpu_probe.py and tests/engines/test_gpu_probe_engines.py share."""

from __future__ import annotations

import ctypes
from typing import Any

from tuneplane_node.settings import NodeSettings


def settings(**values: Any) -> NodeSettings:
    return NodeSettings(_env_file=None, **values)  # type: ignore[call-arg]


def nvml_library_loads() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True
