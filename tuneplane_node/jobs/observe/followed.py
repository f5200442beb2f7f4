"""A followed log's end, vouched for: passed on as the end only once the job has stopped.

An engine ends a follow when the job exits; one that ends it while the job still runs
(podman 4 was seen to, under a job writing at full speed) would make a clean end that a
client takes for the job's exit. Such an end becomes an error instead, which the HTTP
layer turns into a cut connection: the client sees a broken answer and follows again.
"""

from __future__ import annotations

from typing import Protocol

from tuneplane_node.errors import EngineUnavailable
from tuneplane_node.runtime.base import LogStream

END_GRACE_S = 5.0
"""How long after the stream's end the job's exit may take to be known: the engine ends
the stream as the job exits, and its exit event comes a moment later."""


class JobExits(Protocol):
    """What vouching for an end asks of the engine: whether the job has stopped."""

    name: str

    async def wait_exited(self, name: str, timeout: float) -> bool: ...


class EndedWithJob:
    """A `LogStream` whose end waits (holding no thread) until the job is seen stopped."""

    def __init__(
        self,
        stream: LogStream,
        runtime: JobExits,
        *,
        name: str,
        grace_s: float = END_GRACE_S,
    ) -> None:
        self.stream, self.runtime = stream, runtime
        self.name, self.grace_s = name, grace_s

    def __aiter__(self) -> EndedWithJob:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self.stream.__anext__()
        except StopAsyncIteration:
            if await self.runtime.wait_exited(self.name, self.grace_s):
                raise
        reason = f"it ended the log stream of {self.name} while the job still runs"
        raise EngineUnavailable(engine=self.runtime.name, reason=reason)

    async def aclose(self) -> None:
        await self.stream.aclose()
