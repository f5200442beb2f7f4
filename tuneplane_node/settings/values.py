"""One setting's value, read and checked, whatever view it belongs to: the variable's
name (``TUNEPLANE_*``), sizes and shares, engine addresses and whether one is this
machine's, a token's characters."""

from __future__ import annotations

import re
from pathlib import Path

from tuneplane_node.sizes import MAX_SIZE, size_in_bytes

ENV_PREFIX = "TUNEPLANE_"
DAY = 86400.0
GIB = 2**30
TOKEN_PATTERN = re.compile(r"[\x21-\x7e]+")
"""A token: printable ASCII without spaces, what an HTTP header carries intact."""
DOCKER_SCHEMES = ("unix", "tcp", "http", "https", "ssh")
PODMAN_SCHEMES = ("unix", "http+unix", "tcp", "http", "https", "ssh")
DOCKER_DEFAULT = "unix:///var/run/docker.sock"  # the docker SDK's, without DOCKER_HOST


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def absolute(path: Path) -> Path:
    """The path as a mount would name it: absolute, each link resolved."""
    return path.expanduser().resolve()


def size_from(size: str | int, least: int, *, example: str) -> str | int:
    """``size`` when it reads as ``least`` bytes to `MAX_SIZE` (the settings' sizes)."""
    bytes_ = size_in_bytes(size)
    if bytes_ is None or not least <= bytes_ <= MAX_SIZE:
        raise ValueError(f"must be a size like {example} or 512m, at least 1m")
    return size


def share_of(limit: str) -> float | None:
    """The percentage a ``50%`` names (more than 0, at most 100); None for anything else."""
    number = limit.removesuffix("%")
    if number == limit or not re.fullmatch(r"[0-9]+(\.[0-9]+)?", number):
        return None
    share = float(number)
    return share if 0 < share <= 100 else None


def checked_address(address: str, schemes: tuple[str, ...]) -> str:
    scheme, sep, rest = address.partition("://")
    if not sep or scheme not in schemes or not rest:
        raise ValueError(f"must be {' or '.join(s + '://...' for s in schemes)}")
    return address


def unix_socket(address: str) -> str | None:
    """The socket path of an engine address on this machine (``unix://``,
    ``http+unix://``); None for another machine's (or a Windows pipe)."""
    scheme, _, rest = address.partition("://")
    return rest if scheme in ("unix", "http+unix") and rest else None


def local_engine(address: str) -> bool:
    """Whether an engine address is this machine's: its socket, or a Windows pipe."""
    return unix_socket(address) is not None or address.startswith("npipe://")
