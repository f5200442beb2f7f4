"""A test's job containers: unique names, and a job's spec."""

from __future__ import annotations

import uuid
from typing import Any

from tests.support.images import IMAGE
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import LABEL_RUN_ID, container_name


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def job(command: list[str], *, image: str = IMAGE, **fields: Any) -> ContainerSpec:
    """A job container of the node (run-id label) with a unique name."""
    run_id = unique("rt")
    labels = {LABEL_RUN_ID: run_id, **fields.pop("labels", {})}
    return ContainerSpec(
        name=container_name(run_id), image=image, command=tuple(command), labels=labels, **fields
    )
