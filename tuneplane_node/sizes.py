"""Sizes as people and engines write them: ``512m``, ``16g``, ``4096`` (bytes).

One grammar for the console's ``shm_size`` and ``memory_limit`` and the operator's
``TUNEPLANE_SYSTEM_RESERVED_MEMORY``: what docker and podman both accept.
"""

from __future__ import annotations

import re

# [0-9], not \d: \d takes any script's digits, which pass float() but not the engine.
SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)([bkmgBKMG]?)")
UNITS = {"": 1, "b": 1, "k": 2**10, "m": 2**20, "g": 2**30}
MAX_SIZE = 2**50  # 1 PiB


def size_in_bytes(value: object) -> float | None:
    """The bytes a size names, or None when it is not a size. A huge int is clamped (a
    float of 10**400 would overflow), so a caller's bounds check still refuses it."""
    if isinstance(value, int) and not isinstance(value, bool):
        return float(max(-1, min(value, 2 * MAX_SIZE)))
    match = SIZE.fullmatch(value) if isinstance(value, str) else None
    return float(match.group(1)) * UNITS[match.group(2).lower()] if match else None
