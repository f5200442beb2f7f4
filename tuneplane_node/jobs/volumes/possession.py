"""Possession: a source shows that it holds an entry's bytes before the node hands it
an entry another access filled (design, principle 12: a stored result goes only to
whoever shows the same right).

Naming a file's sha256 is no right to it: a model hub lists the hashes of gated weights
for anyone, and a signed URL's file is another tenant's. So a URL that names an entry
the node holds, by an access the entry never recorded (`Accesses`), is asked for
`PROOF_RANGES` ranges of `PROOF_BYTES` bytes each, at offsets drawn at random when
asked, with the launch's own access (its session, its reach), and each answer is
compared with the stored bytes; a file of at most `PROOF_RANGES` x `PROOF_BYTES` is
asked whole. A mirror of the same weights answers in a few requests without the node
fetching the file again. A server that answers a range with the whole file (200) can
prove it only by sending all of it: that proof is a fill's work (`VolumeFills`, hashed,
nothing written), in the background. The ranged proof has `PROOF_S` in all: a launch
waits on it.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tuneplane_node.clock import Clock
from tuneplane_node.fetch.fetching import Fetcher, Session, shown
from tuneplane_node.jobs.words.volumes import Entry

log = logging.getLogger(__name__)
T = TypeVar("T")
PROOF_RANGES = 4
PROOF_BYTES = 64 * 2**10
PROOF_S = 30.0
Io = Callable[..., Awaitable[T]]


def spans(
    size: int, *, count: int = PROOF_RANGES, each: int = PROOF_BYTES
) -> list[tuple[int, int]]:
    """``count`` ranges of ``each`` bytes (first, last byte) at random offsets of a file
    of ``size`` bytes, or the whole file when it is no larger than all of them."""
    if size <= count * each:
        return [(0, size - 1)] if size else []
    return sorted(
        (start, start + each - 1)
        for start in (secrets.randbelow(size - each + 1) for _ in range(count))
    )


def stored(entry: Entry, span: tuple[int, int]) -> bytes:
    """The entry's bytes of ``span``. Blocking."""
    with entry.path.open("rb") as file:
        file.seek(span[0])
        return file.read(span[1] - span[0] + 1)


class Possession:
    """The ranged proofs of a volume store; ``io`` runs a blocking call in its threads."""

    def __init__(self, fetcher: Fetcher, *, io: Io[bytes], clock: Clock) -> None:
        self.fetcher = fetcher
        self.io = io
        self.clock = clock

    async def ranged(self, source: str, entry: Entry) -> bool | None:
        """True when ``source`` answered every range with ``entry``'s bytes, False when
        it answered other bytes (or another size); None when it answers ranges with the
        whole file. Its refusals (a 4xx, an address the node may not reach) raise
        `VolumeFillFailed`; past `PROOF_S`, `asyncio.TimeoutError`."""
        async with self.fetcher.session() as http:
            return await self.clock.wait_for(self._asked(http, source, entry), PROOF_S)

    async def _asked(self, http: Session, source: str, entry: Entry) -> bool | None:
        for span in spans(entry.size):
            answer = await self._range(http, source, entry, span)
            if answer is not True:
                log.info(
                    "volume sha256:%s: %s %s the range %d-%d", entry.digest, shown(source),
                    "does not answer" if answer is None else "answered other bytes for",
                    *span,
                )  # fmt: skip
                return answer
        return True

    async def _range(
        self, http: Session, source: str, entry: Entry, span: tuple[int, int]
    ) -> bool | None:
        whole = span == (0, entry.size - 1)
        async with http.open(source, span=span) as download:
            if download.status == 200 and not whole:
                return None  # not read: the connection is closed, not drained
            if download.status == 206 and (download.range != span or download.total != entry.size):
                return False
            got = bytearray()
            async for batch in download.batches():
                got += batch
                if len(got) > span[1] - span[0] + 1:
                    return False
        return bytes(got) == await self.io(stored, entry, span)
