"""Where the test engines are, and how a test that needs one gets it (or fails under CI).

`contrib/dev/engines.sh` starts them; these defaults match what it prints.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

DEV_DOCKER_SOCK = Path("/run/tuneplane-dev/docker.sock")
REGISTRY = os.environ.get("TUNEPLANE_TEST_REGISTRY", "127.0.0.1:5000")
IMAGE = "tuneplane-test/busybox:1"
REGISTRY_IMAGE = f"{REGISTRY}/{IMAGE}"
# Lives in the registry only: pulling it really downloads ~9 MB.
BIG_IMAGE = f"{REGISTRY}/tuneplane-test/big:1"


def docker_host() -> str | None:
    explicit = os.environ.get("TUNEPLANE_TEST_DOCKER_HOST")
    if explicit:
        return explicit
    if DEV_DOCKER_SOCK.exists():
        return f"unix://{DEV_DOCKER_SOCK}"
    return os.environ.get("DOCKER_HOST")  # None: the docker SDK's default socket


def podman_url() -> str:
    return os.environ.get("TUNEPLANE_TEST_PODMAN_URL", "unix:///run/podman/podman.sock")


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def engine_missing(what: str, why: str) -> None:
    """Fail under CI (a missing engine is a broken build), skip visibly elsewhere."""
    message = f"{what} not reachable ({why}); run `sudo contrib/dev/engines.sh` first"
    if under_ci():
        pytest.fail(message)
    pytest.skip(message)


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
