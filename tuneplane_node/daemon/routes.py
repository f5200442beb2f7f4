"""Thin handlers: parse with `wire`, act through launches / runtime / allocator, reply JSON."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

from tuneplane_node import inventory
from tuneplane_node.daemon.state import ALLOCATOR, DISK, LAUNCHES, RUNTIME, SETTINGS
from tuneplane_node.errors import BadRequest, NodeError
from tuneplane_node.gpu.allocator import Occupancy
from tuneplane_node.gpu.probe import CardFacts
from tuneplane_node.runtime.base import ContainerState, parse_time
from tuneplane_node.runtime.cache import StateCache
from tuneplane_node.wire import (
    PROTOCOL,
    parse_launch,
    parse_ref,
    parse_refs,
    parse_seconds,
    parse_tail,
    state_json,
)

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


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


@routes.post("/node/v1/launch")
async def launch(request: web.Request) -> web.Response:
    launch_request = parse_launch(await read_object(request))
    return web.json_response(await request.app[LAUNCHES].launch(launch_request))


@routes.post("/node/v1/observe")
async def observe(request: web.Request) -> web.Response:
    refs = parse_refs(await read_object(request))
    # One after another: each is a cache read, and a task per ref costs more than it.
    states = {ref: await observe_one(request.app, ref) for ref in dict.fromkeys(refs)}
    return web.json_response({"states": states})


async def observe_one(app: web.Application, ref: str) -> dict[str, Any]:
    launches = app[LAUNCHES]
    record = launches.pending(ref)
    if record is not None:
        return record.state_json(launches.clock())
    state = await app[RUNTIME].inspect(ref)
    if state.exists and not state.run_id:
        state = ContainerState.missing(ref)  # not ours: the node knows nothing of it
    return state_json(state)


@routes.post("/node/v1/stop")
async def stop(request: web.Request) -> web.Response:
    body = await read_object(request)
    ref, timeout = parse_ref(body), parse_seconds(body, "timeout")
    await request.app[LAUNCHES].stop(ref, timeout)
    return web.json_response({"ok": True})


@routes.post("/node/v1/remove")
async def remove(request: web.Request) -> web.Response:
    ref = parse_ref(await read_object(request))
    await request.app[LAUNCHES].remove(ref)
    return web.json_response({"ok": True})


@routes.get("/node/v1/logs")
async def logs(request: web.Request) -> web.Response:
    ref = parse_ref(dict(request.query))
    tail = parse_tail(request.query.get("tail"))
    record = request.app[LAUNCHES].pending(ref)
    if record is not None:
        text = f"no logs yet: {ref} is {record.phase} ({record.error or record.image})"
        return web.json_response({"logs": text})
    state = await request.app[RUNTIME].inspect(ref)
    if not state.exists or not state.run_id:
        return web.json_response({"logs": f"no logs: container {ref} does not exist"})
    return web.json_response({"logs": await request.app[RUNTIME].logs(ref, tail)})


@routes.post("/node/v1/reap")
async def reap(request: web.Request) -> web.Response:
    body = await read_object(request)
    max_age = parse_seconds(body, "max_age_s")
    if max_age is None:
        max_age = request.app[SETTINGS].local_container_ttl_s
    removed = 0
    for state in await request.app[RUNTIME].ps():
        if reapable(state, max_age) and await reap_one(request.app, state.name, max_age):
            removed += 1
    return web.json_response({"removed": removed})


def reapable(state: ContainerState, max_age: float) -> bool:
    """Exited past the TTL, or created and never started past it (it holds GPU labels)."""
    if state.status in ("exited", "dead"):
        moment = parse_time(state.finished_at) or parse_time(state.created_at)
    elif state.status == "created" and state.never_started:
        moment = parse_time(state.created_at)
    else:
        return False  # running, paused, restarting: never touched
    if moment is None:
        return False
    return (datetime.now(timezone.utc) - moment).total_seconds() > max_age


async def reap_one(app: web.Application, name: str, max_age: float) -> bool:
    launches = app[LAUNCHES]
    async with launches.locks.hold(name):
        if launches.pending(name) is not None:
            return False  # a launch is starting it right now
        state = await app[RUNTIME].inspect(name)  # it may have been relaunched meanwhile
        if not (state.run_id and reapable(state, max_age)):
            return False
        await app[RUNTIME].remove(name)
        return True


@routes.get("/node/v1/health")
async def health(request: web.Request) -> web.Response:
    app = request.app
    settings = app[SETTINGS]
    engine = await app[RUNTIME].health()
    answer: dict[str, Any] = {
        "ok": engine.ok,
        "protocol": PROTOCOL,
        "runtime": {"name": engine.engine, "version": engine.version},
        "series": settings.cluster_profile.lower() or None,
        "disk": await app[DISK].read(),
        "pending_pulls": app[LAUNCHES].summary(),
    }
    cache = getattr(app[RUNTIME], "cache", None)
    if isinstance(cache, StateCache):
        answer["state_cache"] = cache.status()
    occupancy: Occupancy | None = None
    if engine.ok:
        try:
            occupancy = await app[ALLOCATOR].occupancy()
        except NodeError as exc:
            answer.update(ok=False, error=exc.message)
    else:
        answer["error"] = engine.error
    answer.update(gpu_fields(occupancy))
    answer["gpu_probe"] = gpu_probe(occupancy)
    return web.json_response(answer)


GPU_FIELDS = (
    "gpus_total",
    "gpus_free",
    "gpus_reserved",
    "free_gpus",
    "external",
    "external_probe_ok",
    "unhealthy",
    "by_job",
    "gpu_detail",
    "explain",
)


def gpu_fields(occupancy: Occupancy | None) -> dict[str, Any]:
    """The GPU part of health; all unknown (null) when the engine could not be read."""
    if occupancy is None:
        return dict.fromkeys(GPU_FIELDS)
    return {
        "gpus_total": occupancy.total if occupancy.known else None,
        "gpus_free": occupancy.available,
        "gpus_reserved": occupancy.reserved_total,
        "free_gpus": list(occupancy.free),
        "external": {str(k): list(v) for k, v in occupancy.external.items()},
        "external_probe_ok": occupancy.external_probe_ok,
        "unhealthy": {str(k): v for k, v in occupancy.unhealthy.items()},
        "by_job": {str(k): v for k, v in occupancy.by_job.items()},
        "gpu_detail": gpu_detail(occupancy),
        "explain": occupancy.explain(),
    }


def gpu_detail(occupancy: Occupancy) -> list[dict[str, Any]]:
    """Per card: the driver's facts (null where it said nothing) and where the card is."""
    cards = occupancy.gpus.cards if occupancy.gpus else ()
    facts = {card.index: card.to_json() for card in cards}
    return [
        {**facts.get(index, CardFacts(index).to_json()), "state": occupancy.card_state(index)}
        for index in range(occupancy.total)
    ]


def gpu_probe(occupancy: Occupancy | None) -> dict[str, Any] | None:
    """Where the GPU facts come from, and why they are missing when they are."""
    if occupancy is None or occupancy.gpus is None:
        return None
    gpus = occupancy.gpus
    return {"source": gpus.source, "ok": gpus.ok, "error": gpus.error}


@routes.get("/node/v1/inventory")
async def node_inventory(request: web.Request) -> web.Response:
    app = request.app
    engine = await app[RUNTIME].health()
    gpus = await app[ALLOCATOR].snapshot()
    runtime = f"{engine.engine}://{engine.version}" if engine.version else None
    facts = await asyncio.to_thread(
        inventory.collect,
        app[SETTINGS],
        gpus=gpus,
        accelerator_count=app[ALLOCATOR].card_count(gpus),
        runtime=runtime,
    )
    return web.json_response(facts)
