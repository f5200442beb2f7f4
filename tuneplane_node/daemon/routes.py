"""The handlers: parse with `wire`, act through the job service, render with `wire`."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tuneplane_node.daemon.state import JOBS
from tuneplane_node.errors import BadRequest
from tuneplane_node.wire import answers, requests

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
    except RecursionError:  # hostile nesting: the decoder gives up before memory does
        raise BadRequest("request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def answer(data: object) -> web.Response:
    return web.json_response(data)


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return answer(answers.OK)


@routes.post("/node/v1/launch")
async def launch(request: web.Request) -> web.Response:
    launch_request = requests.parse_launch(await read_object(request))
    return answer(answers.launch_json(await request.app[JOBS].launch(launch_request)))


@routes.post("/node/v1/observe")
async def observe(request: web.Request) -> web.Response:
    refs = requests.parse_refs(await read_object(request))
    return answer(answers.observe_json(await request.app[JOBS].observe(refs)))


@routes.post("/node/v1/stop")
async def stop(request: web.Request) -> web.Response:
    body = await read_object(request)
    ref, timeout = requests.parse_ref(body), requests.parse_grace(body)
    await request.app[JOBS].stop(ref, timeout)
    return answer(answers.OK)


@routes.post("/node/v1/remove")
async def remove(request: web.Request) -> web.Response:
    ref = requests.parse_ref(await read_object(request))
    await request.app[JOBS].remove(ref)
    return answer(answers.OK)


@routes.get("/node/v1/logs")
async def logs(request: web.Request) -> web.Response:
    ref = requests.parse_ref(dict(request.query))
    tail = requests.parse_tail(request.query.get("tail"))
    since = requests.parse_since(request.query.get("since"))
    return answer(answers.logs_json(await request.app[JOBS].logs(ref, tail, since)))


@routes.post("/node/v1/reap")
async def reap(request: web.Request) -> web.Response:
    max_age = requests.parse_max_age(await read_object(request))
    return answer(answers.reap_json(await request.app[JOBS].reap(max_age)))


@routes.get("/node/v1/health")
async def health(request: web.Request) -> web.Response:
    return answer(answers.health_json(await request.app[JOBS].status()))


@routes.get("/node/v1/inventory")
async def inventory(request: web.Request) -> web.Response:
    return answer(answers.inventory_json(await request.app[JOBS].inventory()))


@routes.post("/node/v1/cordon")
async def cordon(request: web.Request) -> web.Response:
    reason = requests.parse_reason(await read_object(request))
    return answer(answers.node_state_json(await request.app[JOBS].cordon(reason)))


@routes.post("/node/v1/drain")
async def drain(request: web.Request) -> web.Response:
    body = await read_object(request)
    reason, grace = requests.parse_reason(body), requests.parse_drain_grace(body)
    return answer(answers.node_state_json(await request.app[JOBS].drain(reason, grace)))


@routes.post("/node/v1/uncordon")
async def uncordon(request: web.Request) -> web.Response:
    await read_object(request)  # {} or nothing; anything else is a 400 as everywhere
    return answer(answers.node_state_json(await request.app[JOBS].uncordon()))
