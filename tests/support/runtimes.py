"""Runtimes that clean up only what the test made, and a container's log as text."""

from __future__ import annotations

from typing import Any

from tuneplane_node.runtime.base import ContainerRuntime, LogQuery
from tuneplane_node.runtime.spec import ContainerSpec


class TrackingRuntime:
    """Wraps a runtime and force-removes, at the end, every container a test made through it."""

    def __init__(self, runtime: ContainerRuntime, made: list[str] | None = None) -> None:
        self.inner = runtime
        self.made: list[str] = [] if made is None else made

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)

    async def run(self, spec: ContainerSpec) -> str:
        self.made.append(spec.name)
        return await self.inner.run(spec)

    def track(self, name: str) -> None:
        """A container the test made some other way (the SDK, the API)."""
        self.made.append(name)

    async def cleanup(self) -> None:
        for name in self.made:
            await self.inner.remove(name)


async def log_text(runtime: ContainerRuntime, ref: str, tail: int = 100) -> str:
    """A container's last lines as text; "" when it is missing."""
    text = await runtime.logs(ref, LogQuery(tail=tail, max_bytes=8 * 2**20))
    return "" if text is None else text.text
