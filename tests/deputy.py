"""Hostile sources for the deputy's tests (issue 49): an HTTP(S) server a tenant controls,
and listeners that count who connects to an address the node must never reach.

`Tenant` serves, at an address and port of the test's choosing (https with a test CA
when given a certificate): ``/redir?to=<url>`` (a 302 there), ``/signed`` (sets a
session cookie, then redirects to ``/mine``), ``/mine`` (a file only that cookie
reads), ``/trickle`` (a byte every ``trickle_s``), and ``/files/<name>`` (Range as a
real server: `FileServer`'s rules). Every request is recorded with its headers.
`Listener` accepts connections on an address and counts them: what a fake metadata
service or a LAN host must show after an attack (zero).
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from tests.volumeserver import RANGE

COOKIE = "session"


def lan_address() -> str | None:
    """An IPv4 address of this machine that is no loopback (its LAN's, here 192.0.2.0/24),
    from the kernel's local routes; None on a machine with none."""
    last = ""
    for line in Path("/proc/net/fib_trie").read_text().splitlines():
        text = line.strip()
        if text.startswith("|-- "):
            last = text[4:]
        elif text.startswith("/32 host LOCAL") and not ipaddress.ip_address(last).is_loopback:
            return last
    return None


@dataclass
class Request:
    path: str
    headers: dict[str, str]


@dataclass
class Tenant:
    host: str = "127.0.0.1"
    cert: tuple[Path, Path] | None = None  # (certificate, key): served over https
    files: dict[str, bytes] = field(default_factory=dict)
    mine: bytes = b""  # what /mine serves to the cookie's holder
    trickle_s: float = 0.2
    claims: int = 0  # the size /liar says its file is; it sends a MiB of it
    ranges: bool = True
    requests: list[Request] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)  # body bytes per path
    runner: web.AppRunner | None = None
    url: str = ""
    closing: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/redir", self._redirect)
        app.router.add_get("/signed", self._signed)
        app.router.add_get("/mine", self._mine)
        app.router.add_get("/trickle", self._trickle)
        app.router.add_get("/files/{name}", self._file)
        app.router.add_get("/liar", self._liar)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        context = None
        if self.cert is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(*self.cert)
        site = web.TCPSite(self.runner, self.host, 0, ssl_context=context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"{'https' if context else 'http'}://{self.host}:{port}"

    async def close(self) -> None:
        self.closing.set()  # a trickle ends: its fill may be a node's still
        if self.runner is not None:
            await self.runner.cleanup()

    def _seen(self, request: web.Request) -> None:
        self.requests.append(Request(request.path, dict(request.headers)))

    async def _redirect(self, request: web.Request) -> web.Response:
        self._seen(request)
        raise web.HTTPFound(request.query["to"])

    async def _signed(self, request: web.Request) -> web.Response:
        self._seen(request)
        response = web.HTTPFound("/mine")
        response.set_cookie(COOKIE, "tenant-b")
        raise response

    async def _mine(self, request: web.Request) -> web.Response:
        self._seen(request)
        if request.cookies.get(COOKIE) != "tenant-b":
            raise web.HTTPForbidden()
        return web.Response(body=self.mine)

    async def _trickle(self, request: web.Request) -> web.StreamResponse:
        self._seen(request)
        response = web.StreamResponse()
        response.content_length = 2**30
        await response.prepare(request)
        while not self.closing.is_set():
            await response.write(b"x")
            await asyncio.sleep(self.trickle_s)
        return response

    async def _liar(self, request: web.Request) -> web.StreamResponse:
        """A file of `claims` bytes, its size said as a real server would; a MiB of it
        comes, then the connection ends (a dropped connection, again and again)."""
        self._seen(request)
        if request.headers.get("Range") == "bytes=0-0":
            headers = {"Content-Range": f"bytes 0-0/{self.claims}"}
            return web.Response(body=b"x", status=206, headers=headers)
        response = web.StreamResponse()
        response.content_length = self.claims
        await response.prepare(request)
        await response.write(b"x" * 2**20)
        self.sent["/liar"] = self.sent.get("/liar", 0) + 2**20
        request.transport.close() if request.transport is not None else None
        return response

    async def _file(self, request: web.Request) -> web.StreamResponse:
        self._seen(request)
        data = self.files.get(request.match_info["name"])
        if data is None:
            raise web.HTTPNotFound()
        found = RANGE.fullmatch(request.headers.get("Range", "")) if self.ranges else None
        start, end = 0, len(data) - 1
        if found:
            start = int(found[1])
            end = min(int(found[2]), end) if found[2] else end
        body = data[start : end + 1]
        self.sent[request.path] = self.sent.get(request.path, 0) + len(body)
        response = web.Response(body=body, status=206 if found else 200)
        if found:
            response.headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        return response


class Listener:
    """A TCP listener on ``host`` that counts the connections made to it."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\nsecret-instance-role")
        await writer.drain()
        writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
