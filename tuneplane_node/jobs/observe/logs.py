"""The logs reader: a job's last lines, or its stream, within the node's limits.

A read holds one of `LOG_READERS` turns, a follow one of `follow_limit` slots: logs are
the one verb whose cost a client chooses, so it is the one bounded here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Protocol

from tuneplane_node.errors import EngineRefused, TooManyFollows
from tuneplane_node.jobs.observe.followed import END_GRACE_S, EndedWithJob, JobExits
from tuneplane_node.jobs.pending import PendingTable
from tuneplane_node.jobs.words.views import LogNote, Own
from tuneplane_node.runtime.base import ContainerState, LogQuery, LogStream, LogText
from tuneplane_node.settings import ObserveSettings

LOG_READERS = 1
"""Logs read at once. A read of a huge log keeps a thread busy in Python for a second or
more; two at once starve the event loop of the GIL (health took 90 ms behind three)."""


class LogRuntime(JobExits, Protocol):
    """What reading a job's logs asks of the engine (a follow's end too)."""

    async def logs(self, ref: str, query: LogQuery) -> LogText | None: ...
    async def follow_logs(self, ref: str, query: LogQuery) -> LogStream | None: ...


def follow_limit(settings: ObserveSettings) -> int:
    """Logs followed at once: each holds an engine thread for as long as it streams, so
    a quarter of the pool at most, and the other verbs always keep three quarters."""
    return max(1, settings.runtime_threads // 4)


class LogsReader:
    """`logs` and `follow` of the node's containers; a pending or missing one gets a
    sentence saying why it has none."""

    def __init__(
        self,
        runtime: LogRuntime,
        settings: ObserveSettings,
        *,
        own: Own,
        pending: PendingTable,
    ) -> None:
        self.runtime = runtime
        self.max_bytes = settings.logs_max_bytes
        self.own = own
        self.pending = pending
        self._readers = asyncio.Semaphore(LOG_READERS)
        self.follow_limit = follow_limit(settings)
        self._followers = asyncio.Semaphore(self.follow_limit)
        self.end_grace_s = END_GRACE_S

    async def logs(self, ref: str, tail: int, since: datetime | None = None) -> LogText:
        """The container's last lines, at most ``TUNEPLANE_LOGS_MAX_BYTES`` of the newest."""
        found = await self._readable(ref)
        if isinstance(found, LogText):
            return found
        query = LogQuery(tail=tail, max_bytes=self.max_bytes, since=since)
        try:
            async with self._readers:  # each read is a busy thread: the loop needs the GIL
                text = await self.runtime.logs(found.handle, query)
        except EngineRefused as exc:
            return LogText(f"no logs for {ref}: {exc.reason}")
        return _missing(ref) if text is None else text

    @contextlib.asynccontextmanager
    async def follow(
        self, ref: str, tail: int, since: datetime | None = None
    ) -> AsyncIterator[LogStream]:
        """The container's last lines, then its new ones until it stops. Past
        `follow_limit` streams at once, `TooManyFollows` (before anything is sent).
        Leaving the context releases the stream and its slot at once."""
        found = await self._readable(ref)
        if isinstance(found, LogText):
            yield LogNote(found.text)
            return
        if self._followers.locked():
            raise TooManyFollows(limit=self.follow_limit)
        async with self._followers:
            stream = await self._stream(ref, found, LogQuery(tail, self.max_bytes, since))
            try:
                yield stream
            finally:
                await stream.aclose()

    async def _stream(self, ref: str, found: ContainerState, query: LogQuery) -> LogStream:
        """The engine's stream, ending only with the job; else the sentence why not."""
        try:
            stream = await self.runtime.follow_logs(found.handle, query)
        except EngineRefused as exc:
            return LogNote(f"no logs for {ref}: {exc.reason}")
        if stream is None:
            return LogNote(_missing(ref).text)
        return EndedWithJob(stream, self.runtime, name=found.name, grace_s=self.end_grace_s)

    async def _readable(self, ref: str) -> ContainerState | LogText:
        """The node's container of that name, or the sentence saying why it has no logs."""
        record = self.pending.get(ref)
        if record is not None:
            return LogText(f"no logs yet: {ref} is {record.phase} ({record.error or record.image})")
        state = await self.own(ref)
        return state if state.exists else _missing(ref)


def _missing(ref: str) -> LogText:
    return LogText(f"no logs: container {ref} does not exist")
