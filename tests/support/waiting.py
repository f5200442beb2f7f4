"""Waiting without guessing: on a container's state, a predicate, a value, or the loop's ready
tasks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

from tuneplane_node.runtime.base import ContainerRuntime, ContainerState

T = TypeVar("T")


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


def settled(read: Callable[[], T], wanted: T, timeout: float) -> T:
    """``read()`` once it is ``wanted``, or as it is after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (found := read()) != wanted and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


async def settled_async(read: Callable[[], T], wanted: T, timeout: float) -> T:
    """`settled`, waiting on the loop (a node on it goes on meanwhile)."""
    deadline = time.monotonic() + timeout
    while (found := read()) != wanted and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return found
