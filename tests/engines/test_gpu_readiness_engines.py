"""GPU readiness (issue 25, finding 1): health's ``gpu_ready`` and a card launch's 409 on
a node whose engine cannot hand the cards to a container, or whose card count is
unknown; in front of the in-memory engine, then the real docker and podman (neither has
the NVIDIA runtime nor a CDI specification on this machine).

This module holds the ones that need an engine; tests/http/test_gpu_readiness.py has the rest."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import MakeNode

# --- the real engines -------------------------------------------------------------------


@pytest.mark.engine
@pytest.mark.parametrize("engine", ["docker", "podman"])
async def test_a_card_launch_on_a_real_engine_without_gpu_support_is_a_409_not_a_502(
    make_node: MakeNode, engine: str
) -> None:
    """Issue 25, finding 1: docker answered ``502 docker refused ... could not select
    device driver "" with capabilities: [[gpu]]``, and health said ok."""
    node = await make_node(engine, local_gpu_passthrough=True, local_gpu_count=2)
    health = await node.answered_health()
    assert health["ok"] is True and health["gpu_ready"] is False, health
    reason: Any = health["gpu_not_ready_reason"]
    fix = "nvidia-ctk runtime configure" if engine == "docker" else "nvidia-ctk cdi generate"
    assert fix in reason and "TUNEPLANE_LOCAL_GPU_PASSTHROUGH=false" in reason
    _, answer = await node.launch(gpus=1, expect=409)
    assert answer["detail"] == f"this node cannot run GPU jobs: {reason}"
