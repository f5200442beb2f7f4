"""create_node_app(): the aiohttp application, its middlewares and its lifecycle.

Fail closed: no token, no app. Every ``/node/v1/*`` request needs a bearer token of the
`TokenSet` and the protocol header; every error leaves as ``{"detail": <sentence>,
"code": <word>}`` (a request error adds its ``errors``) with its status. The daemon's
background tasks (the stats sampler, the wreckage sweep, the token file's watch, the
loop's lag, a SIGHUP's reload) are `app[TASKS]`'s: named, their failure logged,
cancelled and awaited first at shutdown (`tuneplane_node.tasks`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from tuneplane_node import inventory
from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.daemon.metrics import Metrics
from tuneplane_node.daemon.routes import answer, routes
from tuneplane_node.daemon.state import JOBS, METRICS, REGISTRY_AUTH, SETTINGS, TASKS, TOKENS
from tuneplane_node.daemon.tokens import TokenSet
from tuneplane_node.errors import (
    MissingProtocol,
    NodeError,
    PayloadTooLarge,
    ProtocolMismatch,
    Unauthorized,
)
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.jobs import JobService
from tuneplane_node.runtime import detect_runtime
from tuneplane_node.runtime.base import ContainerRuntime
from tuneplane_node.runtime.dockerauth import AuthFile
from tuneplane_node.settings import NodeSettings
from tuneplane_node.tasks import BackgroundTasks
from tuneplane_node.wire import MAX_BODY_BYTES, PROTOCOL, PROTOCOL_HEADER, PROTOCOLS
from tuneplane_node.wire.answers import error_json

log = logging.getLogger(__name__)
access_log = logging.getLogger("tuneplane_node.access")
API_PREFIX = "/node/v1/"
METRICS_PATH = "/metrics"
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"})


def error_response(exc: NodeError) -> web.Response:
    return answer(error_json(exc.message, exc.code, exc.errors), exc.status)


def http_error(status: int, detail: str) -> web.Response:
    """aiohttp's own refusals (no such route, method): the status's name is the code."""
    return answer(error_json(detail, HTTPStatus(status).phrase.lower().replace(" ", "_")), status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The one place errors become HTTP: NodeError by its status and code, anything else
    a 500 ``internal``."""
    try:
        return await handler(request)
    except NodeError as exc:
        if exc.status >= 500:
            log.warning("%s %s: %s", request.method, request.path, exc.message)
        return error_response(exc)
    except web.HTTPRequestEntityTooLarge:
        return error_response(PayloadTooLarge(limit=MAX_BODY_BYTES))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return http_error(exc.status, exc.reason)
    except Exception as exc:
        log.exception("%s %s failed on a bug", request.method, request.path)
        return error_response(NodeError(f"internal error: {type(exc).__name__}"))


def guard_middleware(tokens: TokenSet, *, metrics_public: bool) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(API_PREFIX):
            check_token(tokens, request)
            check_protocol(request.headers.get(PROTOCOL_HEADER))
        elif request.path == METRICS_PATH and not metrics_public:
            check_token(tokens, request)  # a scraper sends the token, not the protocol
        return await handler(request)

    return guard


def check_token(tokens: TokenSet, request: web.Request) -> None:
    # surrogateescape: a header of hostile bytes is a wrong token, not a crash.
    given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
    if not tokens.accepts(given):
        raise Unauthorized()


def measure_middleware(metrics: Metrics) -> Middleware:
    """Every request's time by route template (never a ref), and the access line."""

    @web.middleware
    async def measure(request: web.Request, handler: Handler) -> web.StreamResponse:
        started, status = time.perf_counter(), 500
        try:
            response = await handler(request)
            status = response.status
            return response
        finally:
            seconds = time.perf_counter() - started
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else "unmatched"
            method = request.method if request.method in METHODS else "other"
            metrics.request(route, method, status, seconds)
            access_log.debug(
                "%s %s %d %.1f ms", method, route, status, seconds * 1000,
                extra={"client": request.remote, "status": status},
            )  # fmt: skip

    return measure


def check_protocol(value: str | None) -> None:
    if value is None or not value.strip():
        raise MissingProtocol(header=PROTOCOL_HEADER, node=PROTOCOL)
    if value.strip() not in {str(spoken) for spoken in PROTOCOLS}:
        raise ProtocolMismatch(console=value.strip()[:40], node=PROTOCOL)


def create_node_app(
    settings: NodeSettings,
    *,
    runtime: ContainerRuntime | None = None,
    allocator: GpuAllocator | None = None,
    clock: Clock = SYSTEM_CLOCK,
    middlewares: tuple[Middleware, ...] = (),
    sweep: bool = True,
) -> web.Application:
    """The daemon. A runtime or allocator passed in is the caller's to start and close.

    ``middlewares`` run first, before the error mapping (the server's connection guard).
    ``sweep``: remove the node's wreckage at start and once a relist period (off only
    for a test daemon on an engine shared with other people's nodes).
    """
    tokens = TokenSet.from_settings(settings, clock=clock)  # no token, no app
    metrics = Metrics(per_job=settings.metrics_per_job)
    guard = guard_middleware(tokens, metrics_public=settings.metrics_public)
    app = web.Application(
        middlewares=[*middlewares, measure_middleware(metrics), errors_middleware, guard],
        client_max_size=MAX_BODY_BYTES,
    )
    app[SETTINGS] = settings
    app[TOKENS] = tokens
    auth_file = AuthFile.from_settings(settings, clock=clock)  # a bad file: no app either
    if auth_file is not None:
        app[REGISTRY_AUTH] = auth_file
    app[METRICS] = metrics
    app[TASKS] = BackgroundTasks(log)
    app.add_routes(routes)
    app.cleanup_ctx.append(_lifecycle(runtime, allocator, clock, sweep=sweep))
    app.on_shutdown.append(_answer_watches)
    return app


async def _answer_watches(app: web.Application) -> None:
    """A stopping daemon answers its waiting watch queries now: before aiohttp waits for
    the requests in flight, which they would hold for up to their ``wait``."""
    if JOBS in app:
        app[JOBS].changes.stop()


def _lifecycle(
    given_runtime: ContainerRuntime | None,
    given_allocator: GpuAllocator | None,
    clock: Clock,
    *,
    sweep: bool,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        settings = app[SETTINGS]
        inventory.check_fabrics(settings.fabrics)
        telemetry = app[METRICS]
        runtime = given_runtime or await detect_runtime(settings, telemetry=telemetry, clock=clock)
        if given_runtime is None:
            await runtime.start()  # the state cache is filled before the first request
        allocator = given_allocator or GpuAllocator(runtime, settings, clock=clock)
        jobs = app[JOBS] = JobService(
            runtime,
            allocator,
            settings,
            clock=clock,
            telemetry=telemetry,
            credentials=app.get(REGISTRY_AUTH),
        )
        await jobs.start()  # the operator's cordon or drain, before the first request
        await _start_background(app, jobs, sweep=sweep)
        log.info("node ready: runtime %s, protocol %s", runtime.name, PROTOCOL)
        yield
        # Shutdown in this order: the loops that call the service; the service (a drain,
        # the pending launches, their pulls: cancelled, not orphaned); the cards' probe;
        # the engine (its cache's relist and event thread).
        await app[TASKS].close()
        await jobs.close()
        if given_allocator is None:
            await allocator.close()
        if given_runtime is None:
            await runtime.close()

    return lifecycle


async def _start_background(app: web.Application, jobs: JobService, *, sweep: bool) -> None:
    tasks = app[TASKS]
    tasks.spawn(jobs.sampler.run(), name="stats sampler")
    if sweep:  # wreckage of a daemon killed between create and start, before serving
        await _sweep_at_start(jobs)
        tasks.spawn(jobs.maintain(), name="wreckage sweep")
    tasks.spawn(app[TOKENS].watch(), name="token file watch")
    if REGISTRY_AUTH in app:
        tasks.spawn(app[REGISTRY_AUTH].watch(), name="registry auth file watch")
    tasks.spawn(app[METRICS].watch_lag(), name="event loop lag")


async def _sweep_at_start(jobs: JobService) -> None:
    try:
        await jobs.sweep_wreckage(older_than_s=0)
    except NodeError as exc:  # the engine may be down: the periodic sweep will do it
        log.warning("could not sweep wreckage at start: %s", exc.message)
