"""Fetcher: one file of a volume over HTTP(S), from an offset, on the event loop.

The only HTTP client below the daemon (aiohttp's, already the daemon's server), and the
one place its errors are translated: into `VolumeFillFailed`, ``retryable`` when the
connection dropped or stalled (a fill resumes from what it has), not when the server
said no. A download asks for ``Range: bytes=<offset>-``; a server that ignores it (200)
sends the whole file again, and says so (`Download.resumed` false). Bodies are read in
batches of up to `BATCH` bytes, so the writer's thread is called once a MiB, not once
a packet.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from tuneplane_node.errors import VolumeFillFailed

BATCH = 2**20
MAX_REDIRECTS = 5
CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
# A dropped or stalled connection: what a fill retries from where it stopped.
DROPPED = (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, asyncio.TimeoutError)


def shown(url: str) -> str:
    """The URL as an answer, error or log line may show it: no query, fragment or user
    (a signed URL's token is in its query; secrets pass through, never stay)."""
    if "://" not in url:
        return url  # an OCI reference: no query, no user
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


@dataclass(frozen=True)
class Answer:
    """A small answer, read whole."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class Download:
    """An answer of the server, its body not read yet."""

    def __init__(self, response: aiohttp.ClientResponse, *, url: str, offset: int) -> None:
        self._response = response
        self.url = shown(url)
        self.resumed = response.status == 206 and offset > 0
        self.total = _total(response, offset)

    async def batches(self) -> AsyncIterator[bytearray]:
        """The body, in batches of about `BATCH` bytes: each a buffer of its own, never
        reused (the fill writes one on its thread while this reads the next), handed over
        without a copy."""
        buffer = bytearray()
        try:
            while chunk := await self._response.content.readany():
                buffer += chunk
                if len(buffer) >= BATCH:
                    yield buffer
                    buffer = bytearray()
        except DROPPED as exc:
            if buffer:
                yield buffer
            dropped = f"the connection dropped: {_said(exc)}"
            raise VolumeFillFailed(source=shown(self.url), reason=dropped, retryable=True) from exc
        except aiohttp.ClientError as exc:
            raise VolumeFillFailed(source=shown(self.url), reason=_said(exc)) from exc
        if buffer:
            yield buffer


def _total(response: aiohttp.ClientResponse, offset: int) -> int | None:
    """The whole file's size, from Content-Range (206) or Content-Length (200)."""
    if response.status == 206:
        found = CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
        return int(found[3]) if found and found[3] != "*" else None
    return response.content_length


URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def _said(exc: BaseException) -> str:
    """The client's own words, every URL in them as `shown` (aiohttp names the URL, a
    redirect's too, with its query: a signed URL's token)."""
    return URL.sub(lambda found: shown(found[0]), str(exc)) or type(exc).__name__


class Fetcher:
    """Downloads over one connection pool; ``stall_s``: seconds a read may wait for a byte."""

    def __init__(self, *, stall_s: float, connect_s: float = 30.0) -> None:
        self._timeout = aiohttp.ClientTimeout(sock_connect=connect_s, sock_read=stall_s)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout, auto_decompress=False)
        return self._session

    @asynccontextmanager
    async def open(
        self,
        url: str,
        *,
        offset: int = 0,
        first_byte: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Download]:
        """The server's answer to a GET of ``url`` from byte ``offset`` (only its first
        byte: ``first_byte``), with ``headers`` besides (a registry's token); a 4xx or 5xx
        is a `VolumeFillFailed` (a 5xx retryable), as
        is a connection that cannot be made."""
        said = shown(url)
        asked = {"Range": f"bytes={offset}-"} if offset else {}
        if first_byte:
            asked = {"Range": "bytes=0-0"}
        try:
            async with self._client().get(
                url, headers={**(headers or {}), **asked}, max_redirects=MAX_REDIRECTS
            ) as response:
                if response.status == 416 and offset:  # nothing past the offset
                    raise VolumeFillFailed(source=said, reason="the file got shorter")
                if response.status >= 400:
                    raise VolumeFillFailed(
                        source=said,
                        reason=f"the server answered {response.status} {response.reason}",
                        retryable=response.status >= 500,
                    )
                yield Download(response, url=url, offset=offset)
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            raise VolumeFillFailed(source=said, reason=_said(exc), retryable=True) from exc
        except aiohttp.ClientError as exc:
            raise VolumeFillFailed(source=said, reason=_said(exc)) from exc

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        limit: int,
        form: Mapping[str, str] | None = None,
    ) -> Answer:
        """A small request's whole answer (a manifest, a token; ``form``: a POST's
        fields): its status, headers and up to ``limit`` bytes of body (more is a
        `VolumeFillFailed`); no redirect past `MAX_REDIRECTS`. A connection that cannot
        be made is a retryable failure."""
        said = shown(url)
        try:
            async with self._client().request(
                method, url, headers=dict(headers), data=form, max_redirects=MAX_REDIRECTS
            ) as response:
                body = await response.content.read(limit + 1)
                if len(body) > limit:
                    raise VolumeFillFailed(source=said, reason=f"an answer past {limit} bytes")
                return Answer(response.status, response.headers.copy(), body)
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            raise VolumeFillFailed(source=said, reason=_said(exc), retryable=True) from exc
        except aiohttp.ClientError as exc:
            raise VolumeFillFailed(source=said, reason=_said(exc)) from exc

    async def size(self, url: str) -> int | None:
        """The file's size, from the headers of a GET of its first byte (an S3 URL signed
        for GET answers no HEAD); None when the server does not say."""
        async with self.open(url, first_byte=True) as download:
            return download.total

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
