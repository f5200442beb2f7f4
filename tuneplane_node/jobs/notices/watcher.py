"""NoticeWatcher: a cloud's metadata service, watched from the node (never from a job:
the egress rule keeps jobs away from it).

One background loop: the reader's `read` (a long poll where the cloud has one, else
every ``TUNEPLANE_CLOUD_NOTICE_POLL_S``) and the notices it answers handed to the
reactor. An endpoint that does not answer, or answers garbage, invents no notice and
withdraws none: it is said once in the log, asked again later and later (doubling up to
60 polls' time), and said again when it answers. The node's own session, whose reach is
the metadata service's address alone.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from urllib.parse import urlsplit

from tuneplane_node.clock import Clock
from tuneplane_node.errors import VolumeFillFailed
from tuneplane_node.fetch.fetching import Fetcher, Session
from tuneplane_node.jobs.notices.clouds import (
    GCP_WAIT_S,
    AzureReader,
    MetadataRefused,
    Reader,
    detected,
    reader_of,
)
from tuneplane_node.jobs.notices.reactor import NoticeReactor
from tuneplane_node.jobs.words.notices import Notice
from tuneplane_node.runtime.reach import Reach
from tuneplane_node.settings import NoticeSettings

log = logging.getLogger(__name__)
METADATA_NETWORKS = ("169.254.169.254/32", "fd00:ec2::254/128")
BACKOFF_POLLS = 60  # a silent endpoint is asked at most this many polls apart


def metadata_fetcher(base: str, *, stall_s: float, clock: Clock) -> Fetcher:
    """The node's own client of the metadata service at ``base``: it may reach that
    address (and the clouds' own) over plain http, and nothing else."""
    parts = urlsplit(base)
    allowed = list(METADATA_NETWORKS)
    with contextlib.suppress(ValueError):  # a name: it must resolve to the metadata address
        allowed.append(str(ipaddress.ip_network(parts.hostname or "")))
    host = f"{(parts.hostname or '').lower()}:{parts.port or 80}"
    return Fetcher(stall_s=stall_s, reach=Reach(allowed), insecure=frozenset({host}), clock=clock)


class NoticeWatcher:
    def __init__(
        self,
        reader: Reader,
        *,
        fetcher: Fetcher,
        reactor: NoticeReactor,
        poll_s: float,
        clock: Clock,
        ack: bool = False,
    ) -> None:
        self.reader = reader
        self.fetcher = fetcher
        self.reactor = reactor
        self.poll_s = poll_s
        self.ack = ack  # Azure: acknowledge an event once its drain ended
        self.clock = clock
        self.answering: bool | None = None  # None: not asked yet
        self.acknowledged: set[str] = set()

    async def run(self) -> None:
        """Until cancelled: read, hand over, wait (a polled reader), or back off."""
        backoff = self.poll_s
        while True:
            async with self.fetcher.session() as http:
                while True:
                    notices = await self._read(http)
                    if notices is None:
                        break
                    backoff = self.poll_s
                    await self.reactor.react(self.reader.name, notices)
                    drained = self.reactor.drained() if self.ack else None
                    if drained is not None:
                        await self.acknowledge(drained)
                    if not self.reader.waits:
                        await self.clock.sleep(self.poll_s)
            await self.clock.sleep(backoff)
            backoff = min(backoff * 2, self.poll_s * BACKOFF_POLLS)

    async def _read(self, http: Session) -> list[Notice] | None:
        """The notices standing now; None when the service did not answer as
        documented (said in the log when it stops answering and when it comes back)."""
        try:
            notices = await self.reader.read(http)
        except (VolumeFillFailed, MetadataRefused) as exc:
            if self.answering is not False:
                log.warning(
                    "cloud notices: the %s metadata service does not answer as documented "
                    "(%s): asked again later, no notice taken from it", self.reader.name,
                    getattr(exc, "reason", exc),
                )  # fmt: skip
            self.answering = False
            return None
        if self.answering is False:
            log.info("cloud notices: the %s metadata service answers again", self.reader.name)
        self.answering = True
        return notices

    async def acknowledge(self, notice: Notice) -> None:
        """Azure: start the event early (the drain it made has ended), once."""
        if not isinstance(self.reader, AzureReader) or notice.key in self.acknowledged:
            return
        async with self.fetcher.session() as http:
            try:
                await self.reader.acknowledge(http, notice)
            except (VolumeFillFailed, MetadataRefused) as exc:
                log.warning("cloud notices: %s not acknowledged: %s", notice.key, exc)
                return
        self.acknowledged.add(notice.key)
        log.info("cloud notices: %s acknowledged: the machine may go now", notice.key)


def watching(
    settings: NoticeSettings, *, reactor: NoticeReactor, clock: Clock
) -> NoticeWatcher | None:
    """The watcher of the cloud the operator names (``auto``: the one this machine says
    it runs on), None for none."""
    cloud: str = settings.cloud_notices
    if cloud == "auto":
        cloud = detected() or "off"
    if cloud == "off":
        return None
    reader = reader_of(cloud, settings.cloud_metadata_url, clock=clock)
    fetcher = metadata_fetcher(reader.base, stall_s=GCP_WAIT_S + 10, clock=clock)
    log.info("cloud notices: watching %s's metadata service at %s", cloud, reader.base)
    return NoticeWatcher(
        reader, fetcher=fetcher, reactor=reactor, poll_s=settings.cloud_notice_poll_s,
        clock=clock, ack=settings.cloud_notice_ack,
    )  # fmt: skip
