"""The handlers: parse with `wire`, act through the job service, answer with `render` (and
`machine`), in the shapes `wire` declares.

Each route is declared once, by `api` on its handler: its method and path, what its
request holds and what it answers. The OpenAPI document (`document`) is made of those
declarations, so a route cannot be served undocumented.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import web

from tuneplane_node.daemon import machine, render
from tuneplane_node.daemon.access.audit import audited
from tuneplane_node.daemon.access.guard import TOKEN_KEY
from tuneplane_node.daemon.access.tokens import FULL
from tuneplane_node.daemon.follow import stream_log
from tuneplane_node.daemon.metrics import CONTENT_TYPE
from tuneplane_node.daemon.presence import GONE, unless_gone
from tuneplane_node.daemon.state import HEALTH_STATUS, MEMOS, METRICS, NODE
from tuneplane_node.errors import (
    BadRequest,
    DriverTooOld,
    EngineConflict,
    GpuNotReady,
    ImageAccessDenied,
    InsufficientScope,
    InsufficientStorage,
    MemlockUnavailable,
    NameTaken,
    NoCapacity,
    NoClientCertificate,
    NodeCordoned,
    NodeError,
    NoRdma,
    NotRunning,
    RegistryRefused,
    RunConflict,
    SandboxUnavailable,
    SpecRefused,
    TooManyAuthFailures,
    TooManyFollows,
    TooManyWatches,
    Unauthorized,
    UsernsUnavailable,
    VolumeAccessDenied,
    VolumeFillFailed,
    VolumeStoreFull,
)
from tuneplane_node.jobs import AlreadyExited, AlreadyPending, AlreadyRunning, Pulling, Started
from tuneplane_node.wire import answers, images, requests, schema, verbs, volumes
from tuneplane_node.wire.fields import Body
from tuneplane_node.wire.schema import ENGINE
from tuneplane_node.wire.stats import STATS, StatsJson, parse_stats
from tuneplane_node.wire.values import PULLING

Handler = TypeVar("Handler", bound=Callable[[web.Request], Awaitable[web.StreamResponse]])
routes = web.RouteTableDef()
OPERATIONS: list[schema.Operation] = []
LAUNCH_ERRORS: tuple[schema.Raised, ...] = (
    ImageAccessDenied,
    VolumeAccessDenied,
    InsufficientStorage,
    NoCapacity,
    GpuNotReady,
    DriverTooOld,
    NameTaken,
    RunConflict,
    NodeCordoned,
    NoRdma,
    MemlockUnavailable,
    SandboxUnavailable,
    UsernsUnavailable,
    EngineConflict,
    SpecRefused,
    RegistryRefused,
    VolumeFillFailed,  # an OCI volume's reference its registry does not resolve
    *ENGINE,
)
LAUNCH_OUTCOMES = {
    Started: "started",
    AlreadyRunning: "running",
    AlreadyExited: "exited",
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


def api(
    method: str,
    path: str,
    answer: Any,
    *,
    body: Body | None = None,
    query: Body | None = None,
    errors: tuple[schema.Raised, ...] = (),
    text: str | None = None,
    accepted: bool = False,
    feature: str | None = None,
) -> Callable[[Handler], Handler]:
    """Serve the handler at ``method path``, and declare it to the OpenAPI document: the
    200's JSON shape (``answer``; ``accepted``: a 202's too), the request's body or
    query, the errors of its own (`NodeError` classes: their statuses and codes), the
    optional feature it serves (`features`) (`schema.Operation`). The summary is the
    first paragraph of the handler's docstring."""

    def serve(handler: Handler) -> Handler:
        summary = " ".join((handler.__doc__ or "").split("\n\n")[0].split())
        declared = schema.Operation(
            method, path, summary, answer, body, query, errors, text, accepted, feature
        )
        OPERATIONS.append(declared)
        routes.route(method.upper(), path)(handler)
        return handler

    return serve


@functools.cache
def features() -> tuple[str, ...]:
    """The optional features this node serves, as its routes declare them: a console
    tells what it may ask by these, not by version numbers."""
    return tuple(sorted({op.feature for op in OPERATIONS if op.feature is not None}))


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI document of the routes declared here, made once (read it, never change
    it): after every route's declaration, which happens at import."""
    return schema.document(OPERATIONS)


def answer(data: object, status: int = 200) -> web.Response:
    return encoded(render.encode(data), status)


def encoded(body: bytes, status: int = 200) -> web.Response:
    """A JSON answer already encoded."""
    return web.Response(body=body, status=status, content_type="application/json", charset="utf-8")


@api(
    "get",
    "/metrics",
    None,
    errors=(Unauthorized, NoClientCertificate, InsufficientScope, TooManyAuthFailures),
    text=CONTENT_TYPE,
)
async def metrics(request: web.Request) -> web.Response:
    """Prometheus' text format; the token unless TUNEPLANE_METRICS_PUBLIC.

    The guard asks for the token, and no protocol header: a scraper sends none."""
    body = await request.app[METRICS].scrape(request.app[NODE])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


@api("get", "/healthz", answers.OkJson)
async def healthz(request: web.Request) -> web.Response:
    """Always ok while the process serves; no token."""
    return answer(answers.OK)


@api("post", "/node/v1/launch", answers.LaunchJson, body=requests.LAUNCH, errors=LAUNCH_ERRORS)
async def launch(request: web.Request) -> web.Response:
    """Launch a job's container, or start its image's pull."""
    launch = requests.parse_launch(await read_object(request))
    facts = {"run_id": launch.run_id, "ref": launch.ref, "image": launch.container.image}
    with audited(request, "launch", **facts) as outcome:
        try:
            result = await request.app[NODE].jobs.launch(launch)
        except NodeError as exc:
            request.app[METRICS].launch("refused" if exc.status < 500 else "failed")
            raise
        outcome.result = LAUNCH_OUTCOMES[type(result)]
        outcome.gpus = getattr(result, "gpus", None)
    request.app[METRICS].launch(outcome.result)
    return answer(render.launch_json(result, ref=launch.ref))


@api(
    "post",
    "/node/v1/images/pull",
    images.PrefetchJson,
    body=images.PREFETCH,
    errors=(ImageAccessDenied, RegistryRefused, InsufficientStorage, *ENGINE),
    accepted=True,
    feature="images",
)
async def prefetch(request: web.Request) -> web.Response:
    """Pull an image before the launches that need it: 202 pulling, or 200 present.

    The pull runs in the background, shared with launches of the image (a launch made
    meanwhile waits on this one download). Cordon does not refuse it. Wrong credentials
    fail it as they fail a launch: GET /node/v1/images shows the error."""
    prefetch_request = images.parse_prefetch(await read_object(request))
    with audited(request, "prefetch", image=prefetch_request.image) as outcome:
        result = await request.app[NODE].catalog.prefetch(prefetch_request)
        outcome.result = result.phase
    status = 202 if result.phase == PULLING else 200
    return answer(render.prefetch_json(result), status)


@api("get", "/node/v1/images", images.ImagesJson, errors=ENGINE, feature="images")
async def list_images(request: web.Request) -> web.Response:
    """The images the node pulled or its containers use, and the pulls under way.

    Not every image of the engine: only the node's. Each pull with its bytes, layers,
    rate and time left (null while unknown); a failed prefetch stays with its error as
    long as a failed launch's record."""
    return answer(render.images_json(await request.app[NODE].catalog.view()))


@api("get", "/node/v1/volumes", volumes.VolumesJson, errors=ENGINE, feature="volumes")
async def list_volumes(request: web.Request) -> web.Response:
    """The entries of the node's volume store, the fills under way or failed, the store.

    Each entry by its sha256 with its size, its last use, the containers that bind it
    (read from their labels; null when the engine did not answer) and its prefetch's pin;
    each fill with its bytes, rate and time left (null while unknown), how many wait for
    it, and a failed prefetch's error. A source is shown without its query."""
    return answer(render.volumes_json(await request.app[NODE].volumes.view()))


@api(
    "post",
    "/node/v1/volumes/pull",
    volumes.VolumePullJson,
    body=volumes.VOLUME_PULL,
    errors=(ImageAccessDenied, VolumeAccessDenied, VolumeStoreFull, VolumeFillFailed, *ENGINE),
    accepted=True,
    feature="volumes",
)
async def volume_pull(request: web.Request) -> web.Response:
    """Fill a volume before the launches that name it: 202 filling, or 200 present.

    The fill runs in the background, shared with launches of the same sha256, and its
    entry is pinned against eviction for `TUNEPLANE_VOLUME_PIN_S`. The answer comes once
    the fill is admitted: its size asked of the server (a refusal is `502`
    `volume_fill_failed`) and room found below the high threshold (else `507`
    `volume_store_full`, before its first byte, nothing evicted). With `wait`, once the
    fill has ended. A later failure shows in GET /node/v1/volumes. Cordon does not
    refuse it."""
    volume, wait = volumes.parse_volume_pull(await read_object(request))
    with audited(request, "volume pull", sha256=volume.sha256) as outcome:
        result = await request.app[NODE].volumes.prefetch(volume, wait=wait)
        outcome.result = result.phase
    status = 200 if result.fill is None else 202
    return answer(render.volume_pull_json(result), status)


@api(
    "post",
    "/node/v1/volumes/gc",
    volumes.VolumeGcJson,
    body=volumes.VOLUME_GC,
    errors=ENGINE,
    feature="volumes",
)
async def volume_gc(request: web.Request) -> web.Response:
    """Run the volume store's eviction now: what it removed, and the store after.

    At or above `TUNEPLANE_VOLUME_GC_HIGH_PERCENT` of its filesystem, the least recently
    used entries go until the use is at `TUNEPLANE_VOLUME_GC_LOW_PERCENT`; never one a
    job binds (its container's label), a launch holds or a prefetch pinned. One run at a
    time. Each entry removed is an audit line of its own."""
    volumes.parse_volume_gc(await read_object(request))  # {}: any field is refused
    with audited(request, "volume gc") as outcome:
        run = await request.app[NODE].volumes.collect()
        outcome.result = f"removed {len(run.removed)}, freed {run.freed_bytes} bytes"
    return answer(render.volume_gc_json(run))


@api("post", "/node/v1/observe", answers.ObserveJson, body=verbs.REFS, errors=ENGINE)
async def observe(request: web.Request) -> web.Response:
    """The state of each ref."""
    refs = tuple(verbs.parse_observe(await read_object(request)))  # the kept answers' key
    jobs, answers = request.app[NODE].jobs, request.app[MEMOS].jobs
    at = jobs.observed(refs)  # before the read: a change meanwhile is a new state
    answer = answers.observed.get(refs, at)
    if answer is None:
        answer = answers.observe(await jobs.observe(refs))
        answers.observed.keep(refs, at, answer)
    return encoded(answer)


@api(
    "get",
    "/node/v1/jobs",
    answers.JobsJson,
    query=verbs.JOBS,
    errors=(TooManyWatches, *ENGINE),
    feature="watch",
)
async def jobs(request: web.Request) -> web.Response:
    """Every job of the node by ref; with index, what changed since (a blocking query).

    Without `index`: every container of the node and every pending launch, in observe's
    shape, and the `index` of this answer. With it: the jobs changed since (as they are
    now, each once) and the refs removed, at once when anything changed, else at the
    next change or after `wait`. `full: true`: the cursor was of another daemon process
    or older than the node's history, and `jobs` is every job. While the engine does
    not answer: 503, never a job removed. Past `TUNEPLANE_WATCH_MAX` waiting: 429 (a
    quarter of them, at least one, kept for `full` tokens). A query whose client goes
    away is cancelled, its slot freed within a second."""
    cursor, wait = verbs.parse_jobs(request.query.items())
    changes = request.app[NODE].changes
    if cursor is None:
        return encoded(request.app[MEMOS].jobs.jobs(await changes.list(), watched=False))
    token = request.get(TOKEN_KEY)
    console = token is None or token.scope == FULL
    result = await unless_gone(request, changes.query(cursor, wait=wait, console=console))
    if result is None:
        return web.Response(status=GONE)
    request.app[METRICS].watch_answered(full=result.full)
    node = request.app[NODE]
    event = None
    if result.node:  # the node itself changed since the cursor: a notice, its state
        event = machine.node_event_json(node.store.node, node.notices.current())
    return encoded(request.app[MEMOS].jobs.jobs(result, watched=True, node=event))


@api("post", "/node/v1/stats", StatsJson, body=STATS, errors=ENGINE, feature="stats")
async def stats(request: web.Request) -> web.Response:
    """What each job uses, from the node's latest samples.

    Answered from the background samples: a request never samples."""
    refs = parse_stats(await read_object(request))
    return answer(render.stats_json(await request.app[NODE].jobs.stats(refs)))


@api("post", "/node/v1/stop", answers.OkJson, body=verbs.STOP, errors=ENGINE)
async def stop(request: web.Request) -> web.Response:
    """Cancel a pending launch, stop the container: its warning, its stop signal, SIGKILL.

    Answered once the job has ended (or been killed): after the warning's time, if it
    asks for one, and the grace period at most."""
    ref, plan = verbs.parse_stop_body(await read_object(request))
    facts = {"timeout": plan.grace, "signal": plan.signal}
    if plan.warn_signal:
        facts |= {"warn_signal": plan.warn_signal, "warn_s": plan.warn_s}
    with audited(request, "stop", ref=ref, **facts):
        await request.app[NODE].jobs.stop(ref, plan)
    return answer(answers.OK)


@api(
    "post",
    "/node/v1/signal",
    answers.OkJson,
    body=verbs.SIGNAL_BODY,
    errors=(NotRunning, *ENGINE),
    feature="signal",
)
async def signal(request: web.Request) -> web.Response:
    """Send a running job a signal (a checkpoint request); the job goes on.

    Delivered to the job's command through its init. A job that is not running, or a
    launch still pending, is a 409: nothing is sent."""
    ref, sent = verbs.parse_signal_body(await read_object(request))
    with audited(request, "signal", ref=ref, signal=sent):
        await request.app[NODE].jobs.signal(ref, sent)
    return answer(answers.OK)


@api("post", "/node/v1/remove", answers.OkJson, body=verbs.REF_BODY, errors=ENGINE)
async def remove(request: web.Request) -> web.Response:
    """Cancel a pending launch, force-remove the container."""
    ref = verbs.parse_remove(await read_object(request))
    with audited(request, "remove", ref=ref):
        await request.app[NODE].jobs.remove(ref)
    return answer(answers.OK)


@api(
    "get",
    "/node/v1/logs",
    answers.LogsJson,
    query=verbs.LOGS,
    errors=(TooManyFollows, *ENGINE),
    text="text/plain; charset=utf-8",
    feature="follow",
)
async def logs(request: web.Request) -> web.StreamResponse:
    """The newest lines of a job's output; with follow, a text/plain stream."""
    ref, tail, since, follow = verbs.parse_logs(request.query.items())
    if follow:
        return await stream_log(request, request.app[NODE].jobs.follow(ref, tail, since))
    return answer(render.logs_json(await request.app[NODE].jobs.logs(ref, tail, since)))


@api("post", "/node/v1/reap", answers.ReapJson, body=verbs.REAP, errors=ENGINE)
async def reap(request: web.Request) -> web.Response:
    """Remove the node's containers that ended long enough ago."""
    max_age = verbs.parse_reap(await read_object(request))
    with audited(request, "reap", max_age_s=max_age) as outcome:
        removed = await request.app[NODE].jobs.reap(max_age)
        outcome.result = f"removed {removed}"
    return answer(render.reap_json(removed))


@api("post", "/node/v1/images/gc", answers.ImageGcJson, body=images.IMAGE_GC, errors=ENGINE)
async def image_gc(request: web.Request) -> web.Response:
    """Run the image GC now: what it removed, and the engine's image store after.

    One run at a time: a run under way is waited for. Each image removed is an audit
    line of its own (image, id, size, why)."""
    images.parse_image_gc(await read_object(request))  # {}: any field is refused
    with audited(request, "image gc") as outcome:
        run = await request.app[NODE].gc.collect()
        outcome.result = f"removed {len(run.removed)}, freed {run.freed_bytes} bytes"
    return answer(machine.image_gc_json(run))


@api("get", "/node/v1/health", answers.HealthJson)
async def health(request: web.Request) -> web.Response:
    """Whether the node can serve, and why."""
    status = await request.app[HEALTH_STATUS].get()  # a burst's requests share one
    return encoded(request.app[MEMOS].health.encode(status, features=features()))


@api("get", "/node/v1/inventory", answers.InventoryJson)
async def inventory(request: web.Request) -> web.Response:
    """What the machine has."""
    facts = await request.app[NODE].jobs.inventory()
    return answer(machine.inventory_json(facts, features=features()))


@api(
    "post",
    "/node/v1/cordon",
    answers.NodeStateJson,
    body=verbs.CORDON,
    errors=(InsufficientStorage,),
    feature="cordon",
)
async def cordon(request: web.Request) -> web.Response:
    """Refuse new launches."""
    reason = verbs.parse_cordon(await read_object(request))
    with audited(request, "cordon", reason=reason) as outcome:
        node = await request.app[NODE].jobs.cordon(reason)
        outcome.result = node.state
    return answer(machine.node_state_json(node))


@api(
    "post",
    "/node/v1/drain",
    answers.NodeStateJson,
    body=verbs.DRAIN,
    errors=(InsufficientStorage,),
    feature="cordon",
)
async def drain(request: web.Request) -> web.Response:
    """Cordon, cancel pending launches and stop every job."""
    reason, plan = verbs.parse_drain(await read_object(request))
    facts: dict[str, object] = {"grace_s": plan.grace}
    if plan.warn_signal:
        facts |= {"warn_signal": plan.warn_signal, "warn_s": plan.warn_s}
    with audited(request, "drain", reason=reason, **facts) as outcome:
        node = await request.app[NODE].jobs.drain(reason, plan)
        outcome.result = node.state
    return answer(machine.node_state_json(node))


@api(
    "post",
    "/node/v1/uncordon",
    answers.NodeStateJson,
    body=verbs.UNCORDON,
    errors=(InsufficientStorage,),
    feature="cordon",
)
async def uncordon(request: web.Request) -> web.Response:
    """Take launches again."""
    verbs.parse_uncordon(await read_object(request))  # {} or nothing
    with audited(request, "uncordon") as outcome:
        node = await request.app[NODE].jobs.uncordon()
        outcome.result = node.state
    return answer(machine.node_state_json(node))


@api(
    "post",
    "/node/v1/gpus/reset-breaker",
    answers.BreakerJson,
    body=verbs.RESET_BREAKER,
    feature="gpu-faults",
)
async def reset_breaker(request: web.Request) -> web.Response:
    """Reset the GPU circuit breaker: the hour's count starts again; the faulted cards it
    kept in stay in, no longer counted (a new fault is decided afresh)."""
    verbs.parse_reset_breaker(await read_object(request))  # {} or nothing
    allocator = request.app[NODE].allocator
    with audited(request, "reset-breaker") as outcome:
        allocator.reset_breaker()
        breaker = (await allocator.occupancy()).breaker or allocator.breaker.state()
        outcome.result = "tripped" if breaker.tripped else "closed"
    return answer(machine.breaker_json(breaker))


@api("get", schema.DOCUMENT_PATH, schema.SELF, feature="openapi")
async def openapi(request: web.Request) -> web.Response:
    """This document.

    This API as an OpenAPI 3.1 document, made of the declarations above (`document`)."""
    return answer(document())
