"""The handlers: parse with `wire`, act through the job service, render with `wire`."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tuneplane_node import wire
from tuneplane_node.daemon.state import JOBS
from tuneplane_node.errors import BadRequest

routes = web.RouteTableDef()


async def read_object(request: web.Request) -> dict[str, Any]:
    """The JSON object in the body; an empty body reads as {}."""
    raw = await request.read()  # over client_max_size: aiohttp raises 413 first
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def answer(data: object) -> web.Response:
    return web.json_response(data)


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return answer(wire.OK)


@routes.post("/node/v1/launch")
async def launch(request: web.Request) -> web.Response:
    launch_request = wire.parse_launch(await read_object(request))
    return answer(wire.launch_json(await request.app[JOBS].launch(launch_request)))


@routes.post("/node/v1/observe")
async def observe(request: web.Request) -> web.Response:
    refs = wire.parse_refs(await read_object(request))
    return answer(wire.observe_json(await request.app[JOBS].observe(refs)))


@routes.post("/node/v1/stop")
async def stop(request: web.Request) -> web.Response:
    body = await read_object(request)
    ref, timeout = wire.parse_ref(body), wire.parse_seconds(body, "timeout")
    await request.app[JOBS].stop(ref, timeout)
    return answer(wire.OK)


@routes.post("/node/v1/remove")
async def remove(request: web.Request) -> web.Response:
    ref = wire.parse_ref(await read_object(request))
    await request.app[JOBS].remove(ref)
    return answer(wire.OK)


@routes.get("/node/v1/logs")
async def logs(request: web.Request) -> web.Response:
    ref = wire.parse_ref(dict(request.query))
    tail = wire.parse_tail(request.query.get("tail"))
    return answer(wire.logs_json(await request.app[JOBS].logs(ref, tail)))


@routes.post("/node/v1/reap")
async def reap(request: web.Request) -> web.Response:
    max_age = wire.parse_seconds(await read_object(request), "max_age_s")
    return answer(wire.reap_json(await request.app[JOBS].reap(max_age)))


@routes.get("/node/v1/health")
async def health(request: web.Request) -> web.Response:
    return answer(wire.health_json(await request.app[JOBS].status()))


@routes.get("/node/v1/inventory")
async def inventory(request: web.Request) -> web.Response:
    return answer(wire.inventory_json(await request.app[JOBS].inventory()))
