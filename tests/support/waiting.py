"""Waiting without guessing: on a container's state, a predicate, or the loop's ready tasks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from tuneplane_node.runtime.base import ContainerRuntime, ContainerState


async def wait_status(
    runtime: ContainerRuntime, name: str, wanted: str, timeout: float = 20, poll: float = 0.1
) -> ContainerState:
    """The container's state once it reads ``wanted``, or as it is when time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        state = await runtime.inspect(name)
        if state.status == wanted or time.monotonic() > deadline:
            return state
        await asyncio.sleep(poll)


async def wait_until(predicate: Callable[[], object], timeout: float = 30) -> None:
    """Poll until ``predicate()`` is true; fail the test when it never becomes so."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.02)


async def settle(rounds: int = 50) -> None:
    """Let every task that can run without waiting on I/O run (no wall-clock sleep)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
