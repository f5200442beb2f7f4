"""The handlers: parse with `wire`, act through the job service, render with `wire`."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tuneplane_node.daemon.audit import audited
from tuneplane_node.daemon.follow import stream_log
from tuneplane_node.daemon.metrics import CONTENT_TYPE
from tuneplane_node.daemon.state import JOBS, METRICS
from tuneplane_node.errors import BadRequest, NodeError
from tuneplane_node.jobs import AlreadyPending, AlreadyRunning, Pulling, Started
from tuneplane_node.wire import answers, requests, schema
from tuneplane_node.wire.stats import parse_stats, stats_json

routes = web.RouteTableDef()
LAUNCH_OUTCOMES = {
    Started: "started",
    AlreadyRunning: "running",
    Pulling: "pulling",
    AlreadyPending: "pending",
}


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


def answer(data: object, status: int = 200) -> web.Response:
    return encoded(answers.encode(data), status)


def encoded(body: bytes, status: int = 200) -> web.Response:
    """A JSON answer already encoded."""
    return web.Response(body=body, status=status, content_type="application/json", charset="utf-8")


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    """Prometheus' text format (the guard asks for the token unless metrics are public)."""
    body = await request.app[METRICS].scrape(request.app[JOBS])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return answer(answers.OK)


@routes.post("/node/v1/launch")
async def launch(request: web.Request) -> web.Response:
    launch_request = requests.parse_launch(await read_object(request))
    spec = launch_request.spec
    facts = {"run_id": launch_request.run_id, "ref": spec.name, "image": spec.image}
    with audited(request, "launch", **facts) as outcome:
        try:
            result = await request.app[JOBS].launch(launch_request)
        except NodeError as exc:
            request.app[METRICS].launch("refused" if exc.status < 500 else "failed")
            raise
        outcome.result = LAUNCH_OUTCOMES[type(result)]
        outcome.gpus = getattr(result, "gpus", None)
    request.app[METRICS].launch(outcome.result)
    return answer(answers.launch_json(result))


@routes.post("/node/v1/observe")
async def observe(request: web.Request) -> web.Response:
    refs = requests.parse_refs(await read_object(request))
    return encoded(answers.encode_observe(await request.app[JOBS].observe(refs)))


@routes.post("/node/v1/stats")
async def stats(request: web.Request) -> web.Response:
    """Answered from the background samples: a request never samples."""
    refs = parse_stats(await read_object(request))
    return answer(stats_json(await request.app[JOBS].stats(refs)))


@routes.post("/node/v1/stop")
async def stop(request: web.Request) -> web.Response:
    body = await read_object(request)
    ref, timeout = requests.parse_ref(body), requests.parse_grace(body)
    with audited(request, "stop", ref=ref, timeout=timeout):
        await request.app[JOBS].stop(ref, timeout)
    return answer(answers.OK)


@routes.post("/node/v1/remove")
async def remove(request: web.Request) -> web.Response:
    ref = requests.parse_ref(await read_object(request))
    with audited(request, "remove", ref=ref):
        await request.app[JOBS].remove(ref)
    return answer(answers.OK)


@routes.get("/node/v1/logs")
async def logs(request: web.Request) -> web.StreamResponse:
    ref = requests.parse_ref(dict(request.query))
    tail = requests.parse_tail(request.query.get("tail"))
    since = requests.parse_since(request.query.get("since"))
    if requests.parse_follow(request.query.get("follow")):
        return await stream_log(request, request.app[JOBS].follow(ref, tail, since))
    return answer(answers.logs_json(await request.app[JOBS].logs(ref, tail, since)))


@routes.post("/node/v1/reap")
async def reap(request: web.Request) -> web.Response:
    max_age = requests.parse_max_age(await read_object(request))
    with audited(request, "reap", max_age_s=max_age) as outcome:
        removed = await request.app[JOBS].reap(max_age)
        outcome.result = f"removed {removed}"
    return answer(answers.reap_json(removed))


@routes.get("/node/v1/health")
async def health(request: web.Request) -> web.Response:
    return answer(answers.health_json(await request.app[JOBS].status()))


@routes.get("/node/v1/inventory")
async def inventory(request: web.Request) -> web.Response:
    return answer(answers.inventory_json(await request.app[JOBS].inventory()))


@routes.post("/node/v1/cordon")
async def cordon(request: web.Request) -> web.Response:
    reason = requests.parse_reason(await read_object(request))
    with audited(request, "cordon", reason=reason) as outcome:
        node = await request.app[JOBS].cordon(reason)
        outcome.result = node.state
    return answer(answers.node_state_json(node))


@routes.post("/node/v1/drain")
async def drain(request: web.Request) -> web.Response:
    body = await read_object(request)
    reason, grace = requests.parse_reason(body), requests.parse_drain_grace(body)
    with audited(request, "drain", reason=reason, grace_s=grace) as outcome:
        node = await request.app[JOBS].drain(reason, grace)
        outcome.result = node.state
    return answer(answers.node_state_json(node))


@routes.post("/node/v1/uncordon")
async def uncordon(request: web.Request) -> web.Response:
    await read_object(request)  # {} or nothing; anything else is a 400 as everywhere
    with audited(request, "uncordon") as outcome:
        node = await request.app[JOBS].uncordon()
        outcome.result = node.state
    return answer(answers.node_state_json(node))


@routes.get(schema.DOCUMENT_PATH)
async def openapi(request: web.Request) -> web.Response:
    """This API as an OpenAPI 3.1 document, generated from the wire (`wire/schema.py`)."""
    return answer(schema.document())
