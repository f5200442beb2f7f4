"""A file server for volume tests: Range, bytes counted, and faults on demand.

Serves ``/<name>`` for each file given to `FileServer.add`; counts the body bytes it
sends per file (`sent`); can drop the connection once after some bytes (`drop_after`),
serve other bytes than those added (`wrong`), or hold a request until released
(`stall`; a size probe, ``Range: bytes=0-0``, is never held), or after some bytes
(`hold_after`: `holding` is set, and the rest waits for the file's `stall`). Runs in the
test's own loop on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiohttp import web

from tuneplane_node.fetch.fetching import Fetcher
from tuneplane_node.runtime.reach import Reach

RANGE = re.compile(r"bytes=(\d+)-(\d*)")
WRITE = 64 * 2**10
LOOPBACK = ["127.0.0.0/8", "::1/128"]
"""The networks the tests' servers are on: a node refuses them to tenants by default
(`Reach`), so a test of fills that are not about reach allows them, as an operator
lists an internal mirror (``TUNEPLANE_VOLUME_ALLOWED_NETWORKS``)."""


def local_fetcher(*, stall_s: float = 30.0, insecure: Iterable[str] = ()) -> Fetcher:
    """A fetcher that may reach the tests' servers on loopback, over plain http for the
    ``host:port`` in ``insecure``."""
    return Fetcher(stall_s=stall_s, reach=Reach(LOOPBACK), insecure=frozenset(insecure))


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class FileServer:
    files: dict[str, bytes] = field(default_factory=dict)
    sent: Counter[str] = field(default_factory=Counter)
    requests: list[tuple[str, str]] = field(default_factory=list)  # (name, Range header)
    drop_after: dict[str, int] = field(default_factory=dict)  # once, then served whole
    wrong: set[str] = field(default_factory=set)
    stall: dict[str, asyncio.Event] = field(default_factory=dict)
    hold_after: dict[str, int] = field(default_factory=dict)  # then wait for its stall
    holding: asyncio.Event = field(default_factory=asyncio.Event)  # set when one holds
    ranges: bool = True
    runner: web.AppRunner | None = None
    url: str = ""

    @property
    def host(self) -> str:
        """``127.0.0.1:<port>``: what ``TUNEPLANE_VOLUME_INSECURE_HOSTS`` lists."""
        return self.url.removeprefix("http://")

    def add(self, name: str, data: bytes) -> str:
        """The URL of ``data``, served as ``name``."""
        self.files[name] = data
        return f"{self.url}/{name}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/{name}", self._serve)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        for event in self.stall.values():
            event.set()
        if self.runner is not None:
            await self.runner.cleanup()

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in self.files:
            raise web.HTTPNotFound()
        self.requests.append((name, request.headers.get("Range", "")))
        data = self.files[name]
        if name in self.wrong:
            data = bytes(b ^ 0xFF for b in data[:1]) + data[1:]
        start, end = 0, len(data) - 1
        found = RANGE.fullmatch(request.headers.get("Range", "")) if self.ranges else None
        if found:
            start = int(found[1])
            end = min(int(found[2]), end) if found[2] else end
            if start >= len(data):
                raise web.HTTPRequestRangeNotSatisfiable()
        response = web.StreamResponse(status=206 if found else 200)
        response.content_length = end - start + 1
        if found:
            response.headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        await response.prepare(request)
        if name in self.stall and request.headers.get("Range") != "bytes=0-0":  # not a probe
            await self.stall[name].wait()
        await self._body(request, response, name, data[start : end + 1])
        return response

    async def _body(
        self, request: web.Request, response: web.StreamResponse, name: str, body: bytes
    ) -> None:
        limit = self.drop_after.get(name)
        for at in range(0, len(body), WRITE):
            piece = body[at : at + WRITE]
            if limit is not None and self.sent[name] + len(piece) > limit:
                del self.drop_after[name]
                piece = piece[: max(0, limit - self.sent[name])]
                await response.write(piece)
                self.sent[name] += len(piece)
                assert request.transport is not None
                request.transport.close()  # dropped mid-transfer
                return
            await response.write(piece)
            self.sent[name] += len(piece)
            if self.sent[name] >= self.hold_after.get(name, self.sent[name] + 1):
                del self.hold_after[name]
                self.holding.set()
                await self.stall.setdefault(name, asyncio.Event()).wait()
