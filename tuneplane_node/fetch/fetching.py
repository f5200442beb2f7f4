"""Fetcher: the volume store's HTTP(S) client, acting for one tenant at a time.

The only HTTP client below the daemon (aiohttp's, already the daemon's server), and the
one place its errors are translated: into `VolumeFillFailed`, ``retryable`` when the
connection dropped or stalled (a fill resumes from what it has), not when the server
said no or the node may not go there.

A fetch is a tenant's request made from the node's place in the network, so it carries
that tenant's authority alone (design, principle 12):
- **Reach.** Every connection goes to an address `Reach` allows (public ones, or the
  operator's networks): the resolver drops the addresses it refuses, and the socket is
  made only for an address checked at that moment (an IP literal too). The name is
  resolved once, and what was checked is what is connected to.
- **Redirects** are followed here, not by aiohttp, at most `MAX_REDIRECTS`: each target
  a URL as `wire.volumes.is_url` reads it, over https (plain http only to a host the
  operator listed), its address checked as the first's; an ``Authorization`` header is
  not carried to another origin, and a POST is not redirected.
- **No shared state.** Each `Session` has its own connections and cookie jar: one
  tenant's login, cookie or connection never serves another's request (a signed URL's
  redirect that sets a cookie still works within its own fill). A fill, a proof or a
  resolution opens its own and closes it.

A download asks for ``Range: bytes=<offset>-``; a server that ignores it (200) sends the
whole file again, and says so (`Download.resumed` false). Bodies are read in batches of
up to `BATCH` bytes, so the writer's thread is called once a MiB, not once a packet. A
body that brings fewer than `PROGRESS_BYTES` in ``stall_s`` has stalled (a trickle is
not progress), as one that brings nothing.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import ssl
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import VolumeFillFailed
from tuneplane_node.runtime.reach import Reach
from tuneplane_node.settings import env_name
from tuneplane_node.wire.volumes import is_url

log = logging.getLogger(__name__)
BATCH = 2**20
PROGRESS_BYTES = 2**20  # what a stall period must bring to count as progress
MAX_REDIRECTS = 5
REDIRECTS = frozenset({301, 302, 303, 307, 308})
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
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


class AddressRefused(OSError):
    """A connection the node may not make for a tenant: ``why`` is the address's kind
    (`reach.REFUSED`), which a tenant may read; the address itself is the log's."""

    def __init__(self, address: str, why: str) -> None:
        super().__init__(f"{address}: {why}")
        self.address = address
        self.why = why


@dataclass(frozen=True)
class Answer:
    """A small answer, read whole."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class Download:
    """An answer of the server, its body not read yet."""

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        *,
        url: str,
        offset: int,
        stall_s: float,
        monotonic: Callable[[], float],
    ) -> None:
        self._response = response
        self.url = shown(url)
        self.status = response.status
        self.resumed = response.status == 206 and offset > 0
        self.total = _total(response, offset)
        self.range = _range(response)
        self._stall_s = stall_s
        self._monotonic = monotonic

    async def batches(self) -> AsyncIterator[bytearray]:
        """The body, in batches of about `BATCH` bytes: each a buffer of its own, never
        reused (the fill writes one on its thread while this reads the next), handed over
        without a copy. Fewer than `PROGRESS_BYTES` in ``stall_s`` is a stall."""
        buffer = bytearray()
        mark, since = self._monotonic(), 0
        try:
            while chunk := await self._response.content.readany():
                buffer += chunk
                since += len(chunk)
                if since >= PROGRESS_BYTES:
                    mark, since = self._monotonic(), 0
                elif self._monotonic() - mark > self._stall_s:
                    yield buffer
                    raise VolumeFillFailed(
                        source=self.url, reason=_stalled(self._stall_s), retryable=True
                    )
                if len(buffer) >= BATCH:
                    yield buffer
                    buffer = bytearray()
        except DROPPED as exc:
            if buffer:
                yield buffer
            dropped = f"the connection dropped: {_said(exc)}"
            raise VolumeFillFailed(source=self.url, reason=dropped, retryable=True) from exc
        except aiohttp.ClientError as exc:
            raise VolumeFillFailed(source=self.url, reason=_said(exc)) from exc
        if buffer:
            yield buffer


def _stalled(stall_s: float) -> str:
    return f"fewer than {PROGRESS_BYTES} bytes came in {stall_s:g} s"


def _total(response: aiohttp.ClientResponse, offset: int) -> int | None:
    """The whole file's size, from Content-Range (206) or Content-Length (200)."""
    if response.status == 206:
        found = CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
        return int(found[3]) if found and found[3] != "*" else None
    return response.content_length


def _range(response: aiohttp.ClientResponse) -> tuple[int, int] | None:
    """The first and last byte a 206 sends (Content-Range), else None."""
    found = CONTENT_RANGE.fullmatch(response.headers.get("Content-Range", "").strip())
    return (int(found[1]), int(found[2])) if response.status == 206 and found else None


URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")


def _said(exc: BaseException) -> str:
    """The client's own words, every URL in them as `shown` (aiohttp names the URL, a
    redirect's too, with its query: a signed URL's token)."""
    return URL.sub(lambda found: shown(found[0]), str(exc)) or type(exc).__name__


class _Guarded(AbstractResolver):
    """A name's addresses, those `Reach` refuses left out (and said in the log): none
    left is an `AddressRefused`."""

    def __init__(self, reach: Reach) -> None:
        self._reach = reach
        self._resolver = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._resolver.resolve(host, port, family)
        kept = [each for each in found if self._reach.refusal(each["host"]) is None]
        if not kept:
            refusals = {each["host"]: self._reach.refusal(each["host"]) for each in found}
            log.warning("volume fetch: %s resolves to %s only: refused", host, refusals)
            kinds = sorted({why for why in refusals.values() if why})
            raise AddressRefused(host, " and ".join(kinds) or "no address")
        return kept

    async def close(self) -> None:
        await self._resolver.close()


class Fetcher:
    """What every session of the volume store shares: the reach of its connections, the
    hosts it may ask over plain http, the CAs it trusts, its timeouts. ``stall_s``:
    seconds a body may take to bring `PROGRESS_BYTES`."""

    def __init__(
        self,
        *,
        stall_s: float,
        reach: Reach | None = None,
        insecure: frozenset[str] = frozenset(),
        ca_file: Path | None = None,
        connect_s: float = 30.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.stall_s = stall_s
        self.reach = reach if reach is not None else Reach()
        self.insecure = insecure
        self.clock = clock
        self._timeout = aiohttp.ClientTimeout(sock_connect=connect_s, sock_read=stall_s)
        self._ca_file = ca_file
        self._tls: ssl.SSLContext | None = None

    def insecure_host(self, host: str, port: int | None) -> bool:
        """Listed as ``host:port``; a host without a port is asked on 80."""
        return f"{host.lower()}:{port or 80}" in self.insecure

    def tls(self) -> ssl.SSLContext:
        """The system's CAs and the operator's (``TUNEPLANE_VOLUME_CA_FILE``), loaded at
        the first session (a bundle takes tens of ms: once, not per fill)."""
        if self._tls is None:
            context = ssl.create_default_context()
            if self._ca_file is not None:
                context.load_verify_locations(cafile=str(self._ca_file))
            self._tls = context
        return self._tls

    @asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        """A session of its own (connections, cookies), closed when left."""
        session = Session(self)
        try:
            yield session
        finally:
            await session.close()

    def _refused_socket(self, addr_info: tuple) -> socket.socket:  # type: ignore[type-arg]
        """The socket for one address, made only when `Reach` allows the address: the
        last check, on the address connected to (an IP literal meets no resolver)."""
        family, kind, proto, _, address = addr_info
        why = self.reach.refusal(str(address[0]))
        if why is not None:
            log.warning("volume fetch: a connection to %s refused: %s", address[0], why)
            raise AddressRefused(str(address[0]), why)
        return socket.socket(family=family, type=kind, proto=proto)

    def connector(self) -> aiohttp.TCPConnector:
        return aiohttp.TCPConnector(
            resolver=_Guarded(self.reach),
            socket_factory=self._refused_socket,
            ssl=self.tls(),
        )


class Session:
    """One tenant's requests: its own connections and cookie jar."""

    def __init__(self, fetcher: Fetcher) -> None:
        self._fetcher = fetcher
        self._client = aiohttp.ClientSession(
            connector=fetcher.connector(),
            timeout=fetcher._timeout,
            auto_decompress=False,
            cookie_jar=aiohttp.CookieJar(unsafe=True),  # the session's own: one fill's
        )

    @asynccontextmanager
    async def open(
        self,
        url: str,
        *,
        offset: int = 0,
        first_byte: bool = False,
        span: tuple[int, int] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[Download]:
        """The server's answer to a GET of ``url`` from byte ``offset`` (only its first
        byte: ``first_byte``; bytes ``span[0]`` to ``span[1]``: ``span``), with
        ``headers`` besides (a registry's token); a 4xx or 5xx is a `VolumeFillFailed`
        (a 5xx retryable), as is a connection that cannot be made."""
        said = shown(url)
        asked = {"Range": f"bytes={offset}-"} if offset else {}
        if first_byte:
            asked = {"Range": "bytes=0-0"}
        if span is not None:
            asked = {"Range": f"bytes={span[0]}-{span[1]}"}
        fetcher = self._fetcher
        with _translated(said):
            headers = {**(headers or {}), **asked}
            async with self._followed("GET", url, headers, said=said) as response:
                if response.status == 416 and offset:  # nothing past the offset
                    raise VolumeFillFailed(source=said, reason="the file got shorter")
                if response.status >= 400:
                    raise VolumeFillFailed(
                        source=said,
                        reason=f"the server answered {response.status} {response.reason}",
                        retryable=response.status >= 500,
                    )
                yield Download(
                    response, url=url, offset=offset, stall_s=fetcher.stall_s,
                    monotonic=fetcher.clock.monotonic,
                )  # fmt: skip

    async def request(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        limit: int,
        form: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> Answer:
        """A small request's whole answer (a manifest, a token; ``form``: a POST's
        fields, or ``body``: its bytes): its status, headers and up to ``limit`` bytes of
        body (more is a `VolumeFillFailed`). A connection that cannot be made is a
        retryable failure."""
        said = shown(url)
        sent = form if form is not None else body
        with _translated(said):
            async with self._followed(method, url, dict(headers), sent, said=said) as response:
                body = await response.content.read(limit + 1)
                if len(body) > limit:
                    raise VolumeFillFailed(source=said, reason=f"an answer past {limit} bytes")
                return Answer(response.status, response.headers.copy(), body)

    async def size(self, url: str) -> int | None:
        """The file's size, from the headers of a GET of its first byte (an S3 URL signed
        for GET answers no HEAD); None when the server does not say."""
        async with self.open(url, first_byte=True) as download:
            return download.total

    @asynccontextmanager
    async def _followed(
        self,
        method: str,
        url: str,
        headers: dict[str, str],
        form: Mapping[str, str] | bytes | None = None,
        *,
        said: str,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The answer at the end of ``url``'s redirects, each hop held to the rules
        (`_hop`); ``Authorization`` dropped at the first hop to another origin. A failure
        names the URL asked (``said``), never where its redirects led."""
        for hop in range(MAX_REDIRECTS + 1):
            self._hop(url, said, redirected=hop > 0)
            async with self._client.request(
                method, url, headers=headers, data=form, allow_redirects=False
            ) as response:
                location = response.headers.get("Location")
                if response.status not in REDIRECTS or not location:
                    yield response
                    return
                target = urljoin(str(response.url), location)
            if method not in ("GET", "HEAD"):
                raise VolumeFillFailed(source=said, reason=f"its {method} was redirected")
            if _origin(target) != _origin(url):
                headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
            url = target
        raise VolumeFillFailed(source=said, reason=f"more than {MAX_REDIRECTS} redirects")

    def _hop(self, url: str, said: str, *, redirected: bool) -> None:
        """A URL the session may ask: one `is_url` reads, over https, or plain http to a
        host the operator listed."""
        parts = urlsplit(url) if is_url(url) else None
        where = "a redirect to " if redirected else ""
        if parts is None:
            raise VolumeFillFailed(source=said, reason=f"{where}a URL that names no valid host")
        if parts.scheme == "http" and not self._fetcher.insecure_host(
            parts.hostname or "", parts.port
        ):
            raise VolumeFillFailed(
                source=said,
                reason=f"{where}plain http://: only to the hosts in "
                f"{env_name('volume_insecure_hosts')}",
            )

    async def close(self) -> None:
        await self._client.close()


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


@contextmanager
def _translated(said: str) -> Iterator[None]:
    """aiohttp's failures as `VolumeFillFailed`: a refused address final (the tenant
    reads its kind only), a connection that could not be made or dropped retryable."""
    try:
        yield
    except VolumeFillFailed:
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        refused = _refusal(exc)
        if refused is not None:
            reason = (
                f"its host is not one the node fetches from for a tenant ({refused.why}); "
                f"the operator lists internal networks in "
                f"{env_name('volume_allowed_networks')}"
            )
            raise VolumeFillFailed(source=said, reason=reason) from None
        retryable = isinstance(exc, (aiohttp.ClientConnectionError, asyncio.TimeoutError))
        raise VolumeFillFailed(source=said, reason=_said(exc), retryable=retryable) from exc


def _refusal(exc: BaseException) -> AddressRefused | None:
    """The `AddressRefused` behind a connector's error, if that is what it is."""
    cause = getattr(exc, "os_error", None) or exc.__cause__
    return cause if isinstance(cause, AddressRefused) else None
