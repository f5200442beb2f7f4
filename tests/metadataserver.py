"""A fake cloud metadata service for the notice tests (issue 54): AWS's IMDSv2, GCP's
instance metadata (waited on with ``wait_for_change``) and Azure's scheduled events, each
at its documented paths, headers and formats, in the test's own loop on 127.0.0.1.

The test sets what stands (`spot`, `rebalance`, `scheduled`; `gcp`; `events`), or
breaks the service (`down`: 503 to everything; `garbage`: a 200 of no JSON). Every
request is recorded (method, path, the headers that matter), and Azure's
acknowledgements (`acks`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

TOKEN = "imdsv2-session-token"


@dataclass
class Metadata:
    spot: dict[str, str] | None = None  # AWS: {"action", "time"}
    rebalance: dict[str, str] | None = None  # AWS: {"noticeTime"}
    scheduled: list[dict[str, str]] = field(default_factory=list)  # AWS maintenance events
    gcp: dict[str, Any] = field(
        default_factory=lambda: {"preempted": "FALSE", "maintenanceEvent": "NONE"}
    )
    events: list[dict[str, Any]] = field(default_factory=list)  # Azure's Events
    vm: str = "gpu-vm-7"
    down: bool = False
    garbage: bool = False
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    acks: list[str] = field(default_factory=list)
    runner: web.AppRunner | None = None
    url: str = ""
    _etag: int = 1
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def gcp_set(self, **values: Any) -> None:
        """GCP's instance document changes: waiting long polls answer now."""
        self.gcp.update(values)
        self._etag += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def start(self) -> None:
        app = web.Application()
        app.router.add_put("/latest/api/token", self._token)
        app.router.add_get("/latest/meta-data/{path:.+}", self._aws)
        app.router.add_get("/computeMetadata/v1/instance/", self._gcp)
        app.router.add_get("/metadata/scheduledevents", self._azure)
        app.router.add_post("/metadata/scheduledevents", self._ack)
        app.router.add_get("/metadata/instance/compute/name", self._name)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        self._changed.set()
        if self.runner is not None:
            await self.runner.cleanup()

    def _seen(self, request: web.Request) -> None:
        kept = ("X-aws-ec2-metadata-token", "Metadata-Flavor", "Metadata")
        headers = {k: request.headers[k] for k in kept if k in request.headers}
        self.requests.append((request.method, request.path_qs, headers))
        if self.down:
            raise web.HTTPServiceUnavailable()
        if self.garbage:
            raise web.HTTPOk(text="<html>not json")

    async def _token(self, request: web.Request) -> web.Response:
        self._seen(request)
        if "X-aws-ec2-metadata-token-ttl-seconds" not in request.headers:
            raise web.HTTPBadRequest()
        return web.Response(text=TOKEN)

    async def _aws(self, request: web.Request) -> web.Response:
        self._seen(request)
        if request.headers.get("X-aws-ec2-metadata-token") != TOKEN:
            raise web.HTTPUnauthorized()
        found = {
            "spot/instance-action": self.spot,
            "events/recommendations/rebalance": self.rebalance,
            "events/maintenance/scheduled": self.scheduled,
        }.get(request.match_info["path"])
        if found is None:
            raise web.HTTPNotFound()
        return web.json_response(found)

    async def _gcp(self, request: web.Request) -> web.Response:
        self._seen(request)
        if request.headers.get("Metadata-Flavor") != "Google":
            raise web.HTTPForbidden()
        if request.query.get("wait_for_change") == "true" and request.query.get("last_etag") == str(
            self._etag
        ):
            timeout = float(request.query.get("timeout_sec", "60"))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout)
        return web.json_response(self.gcp, headers={"ETag": str(self._etag)})

    async def _azure(self, request: web.Request) -> web.Response:
        self._seen(request)
        if request.headers.get("Metadata") != "true":
            raise web.HTTPBadRequest()
        return web.json_response({"DocumentIncarnation": 1, "Events": self.events})

    async def _ack(self, request: web.Request) -> web.Response:
        self._seen(request)
        for start in json.loads(await request.read()).get("StartRequests", []):
            self.acks.append(start["EventId"])
        return web.Response(status=200)

    async def _name(self, request: web.Request) -> web.Response:
        self._seen(request)
        return web.Response(text=self.vm)
