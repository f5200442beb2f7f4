"""create_node_app(): the aiohttp application, its middlewares and its lifecycle.

Fail closed: no token, no app. Every ``/node/v1/*`` request needs a bearer token of the
`TokenSet` and the protocol header; every error leaves as ``{"detail": <sentence>,
"code": <word>}`` (a request error adds its ``errors``) with its status. The background
tasks (the node's loops, which `Node.spawn_tasks` names; the token and auth files'
watches, the loop's lag, a SIGHUP's reload) are `app[TASKS]`'s: named, their failure
logged, cancelled and awaited first at shutdown (`tuneplane_node.tasks`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from http import HTTPStatus
from typing import NoReturn

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from tuneplane_node import fabrics, inventory
from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.daemon.access.audit import refused_for_scope
from tuneplane_node.daemon.access.guard import (
    METRICS_PATH,
    READ_VERBS,
    TOKEN_KEY,
    AuthFailures,
    authenticate,
    needed_scope,
    refuse,
)
from tuneplane_node.daemon.access.tokens import TokenSet
from tuneplane_node.daemon.enginelock import EngineLock, engine_address
from tuneplane_node.daemon.metrics import Metrics
from tuneplane_node.daemon.render import error_json
from tuneplane_node.daemon.routes import answer, routes
from tuneplane_node.daemon.state import (
    HEALTH_STATUS,
    MEMOS,
    METRICS,
    NODE,
    PORT_HELD,
    REGISTRY_AUTH,
    SETTINGS,
    TASKS,
    TOKENS,
    Memos,
)
from tuneplane_node.errors import (
    ConfigError,
    InsufficientScope,
    InsufficientStorage,
    MissingProtocol,
    NodeError,
    PayloadTooLarge,
    ProtocolMismatch,
    TooManyAuthFailures,
    Unauthorized,
)
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.jobs.node import Node, build_node
from tuneplane_node.runtime import detect_runtime
from tuneplane_node.runtime.authfile import AuthFile
from tuneplane_node.runtime.base import ContainerRuntime
from tuneplane_node.settings import NodeSettings, env_name
from tuneplane_node.tasks import BackgroundTasks, TurnShared
from tuneplane_node.wire import MAX_BODY_BYTES, PROTOCOL, PROTOCOL_HEADER, SPOKEN

log = logging.getLogger(__name__)
access_log = logging.getLogger("tuneplane_node.access")
API_PREFIX = "/node/v1/"
METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"})


def error_response(exc: NodeError) -> web.Response:
    figures = exc.figures() if isinstance(exc, InsufficientStorage) else None
    return answer(error_json(exc.message, exc.code, exc.errors, figures), exc.status)


def http_error(status: int, detail: str, *, allow: str | None = None) -> web.Response:
    """aiohttp's own refusals (no such route, method): the status's name is the code; a
    405 says the methods the path has in ``Allow`` (RFC 9110, 15.5.6)."""
    code = HTTPStatus(status).phrase.lower().replace(" ", "_")
    response = answer(error_json(detail, code), status)
    if allow is not None:
        response.headers["Allow"] = allow
    return response


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
        return http_error(exc.status, exc.reason, allow=exc.headers.get("Allow"))
    except Exception as exc:
        log.exception("%s %s failed on a bug", request.method, request.path)
        return error_response(NodeError(f"internal error: {type(exc).__name__}"))


async def _no_server_header(request: web.Request, response: web.StreamResponse) -> None:
    """aiohttp names Python's and its own version in ``Server``: a map of the CVEs that
    apply, given to anyone who connects. The node names nothing."""
    response.headers.popall("Server", None)


async def _changes_seen(request: web.Request, response: web.StreamResponse) -> None:
    """A request that may have changed the node (a POST but the reads, observe and
    stats) ends the sharing of health's status (`TurnShared`) once answered: a health
    request pipelined after it on the same connection may run in the same turn (Python
    3.12's eager tasks), and must see what it changed."""
    method = request.method
    if method in ("GET", "HEAD") or (method, request.path) in READ_VERBS:
        return
    if HEALTH_STATUS in request.app:
        request.app[HEALTH_STATUS].forget()


def guard_middleware(
    tokens: TokenSet, metrics: Metrics, *, metrics_public: bool, failures: AuthFailures
) -> Middleware:
    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        api = request.path.startswith(API_PREFIX)
        # a scraper of the metrics sends the token, not the protocol
        if api or (request.path == METRICS_PATH and not metrics_public):
            if not check_token(tokens, failures, request):
                await refused(failures, metrics, request)
            if api:
                check_protocol(request.headers.get(PROTOCOL_HEADER))
        return await handler(request)

    return guard


def check_token(tokens: TokenSet, failures: AuthFailures, request: web.Request) -> bool:
    """Whether the request's token is one of the set (raises when it lacks the scope)."""
    scope = needed_scope(request.method, request.path)
    try:
        return authenticate(tokens, failures, request, scope=scope) is not None
    except InsufficientScope as exc:
        refused_for_scope(request, exc)
        raise


async def refused(failures: AuthFailures, metrics: Metrics, request: web.Request) -> NoReturn:
    """A token none of the set: counted, its answer after the peer's delay (`refuse`)."""
    try:
        await refuse(failures, request.remote or "unknown")
    except (Unauthorized, TooManyAuthFailures) as exc:
        metrics.auth_failed(exc.status)
        raise


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
            if access_log.isEnabledFor(logging.DEBUG):  # else its arguments cost for nothing
                token = request.get(TOKEN_KEY)
                name = token.name if token is not None else "-"
                access_log.debug(
                    "%s %s %d %.1f ms by %s", method, route, status, seconds * 1000, name,
                    extra={"client": request.remote, "status": status, "token": name},
                )  # fmt: skip

    return measure


def check_protocol(value: str | None) -> None:
    if value is None or not value.strip():
        raise MissingProtocol(header=PROTOCOL_HEADER, node=PROTOCOL)
    if value.strip() not in SPOKEN:
        raise ProtocolMismatch(console=value.strip()[:40], node=PROTOCOL)


def create_node_app(
    settings: NodeSettings,
    *,
    runtime: ContainerRuntime | None = None,
    allocator: GpuAllocator | None = None,
    clock: Clock = SYSTEM_CLOCK,
    middlewares: tuple[Middleware, ...] = (),
    sweep: bool = True,
    engine_lock: bool = False,
    port_held: bool = False,
) -> web.Application:
    """The daemon. A runtime or allocator passed in is the caller's to start and close.

    ``middlewares`` run first, before the error mapping (the server's connection guard).
    ``sweep``: remove the node's wreckage at start and once a relist period (off only
    for a test daemon on an engine shared with other people's nodes). ``engine_lock``:
    refuse to start while another daemon of this machine manages the engine (`serve`'s
    rule, `enginelock`; raises EngineTaken at start-up). ``port_held``: systemd holds
    the node's port across restarts (`serve` says so once it has its sockets).
    """
    tokens = TokenSet.from_settings(settings, clock=clock)  # no token, no app
    metrics = Metrics(per_job=settings.metrics_per_job)
    guard = guard_middleware(
        tokens, metrics, metrics_public=settings.metrics_public, failures=AuthFailures()
    )
    app = web.Application(
        middlewares=[*middlewares, measure_middleware(metrics), errors_middleware, guard],
        client_max_size=MAX_BODY_BYTES,
    )
    app[SETTINGS] = settings
    app[PORT_HELD] = port_held
    app[TOKENS] = tokens
    auth_file = AuthFile.from_settings(settings, clock=clock)  # a bad file: no app either
    if auth_file is not None:
        app[REGISTRY_AUTH] = auth_file
    app[METRICS] = metrics
    app[MEMOS] = Memos()  # this app's alone
    app[TASKS] = BackgroundTasks(log)
    app.add_routes(routes)
    app.on_response_prepare.append(_no_server_header)
    app.on_response_prepare.append(_changes_seen)
    lifecycle = _lifecycle(runtime, allocator, clock, sweep=sweep, engine_lock=engine_lock)
    app.cleanup_ctx.append(lifecycle)
    app.on_shutdown.append(_answer_watches)
    return app


async def _answer_watches(app: web.Application) -> None:
    """A stopping daemon answers its waiting watch queries now: before aiohttp waits for
    the requests in flight, which they would hold for up to their ``wait``."""
    if NODE in app:
        app[NODE].changes.stop()


def _lifecycle(
    given_runtime: ContainerRuntime | None,
    given_allocator: GpuAllocator | None,
    clock: Clock,
    *,
    sweep: bool,
    engine_lock: bool,
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        settings = app[SETTINGS]
        fabrics.check_fabrics(settings.fabrics)
        telemetry = app[METRICS]
        runtime = given_runtime or await detect_runtime(settings, telemetry=telemetry, clock=clock)
        lock = None
        if given_runtime is None:
            try:  # before the cache's fill and the sweep: another daemon's engine is not ours
                lock = await _take_lock(settings, runtime) if engine_lock else None
            except BaseException:
                await runtime.close()
                raise
            await runtime.start()  # the state cache is filled before the first request
        allocator = given_allocator or GpuAllocator(runtime, settings, clock=clock)
        node = app[NODE] = build_node(
            settings,
            runtime=runtime,
            allocator=allocator,
            clock=clock,
            telemetry=telemetry,
            credentials=app.get(REGISTRY_AUTH),
            port_held=app[PORT_HELD],
        )
        app[HEALTH_STATUS] = TurnShared(node.jobs.status)
        await node.start()  # the operator's cordon or drain, before the first request
        await _start_background(app, node, sweep=sweep)
        log.info("node ready: runtime %s, protocol %s", runtime.name, PROTOCOL)
        yield
        # Shutdown in this order: the loops that call the service; the service (a drain,
        # the pending launches, their pulls: cancelled, not orphaned); the cards' probe;
        # the engine (its cache's relist and event thread).
        await app[TASKS].close()
        await node.close()
        if given_allocator is None:
            await allocator.close()
        if given_runtime is None:
            await runtime.close()
        if lock is not None:
            lock.release()

    return lifecycle


async def _take_lock(settings: NodeSettings, runtime: ContainerRuntime) -> EngineLock | None:
    """The engine's lock (`enginelock`); None for the process runtime, or by the
    development setting."""
    address = engine_address(settings, runtime.name)
    if address is None:
        return None
    if settings.dev_shared_engine:
        log.warning(
            "%s=true: no engine lock; other daemons may manage %s too (development only)",
            env_name("dev_shared_engine"), address,
        )  # fmt: skip
        return None
    node_id = await asyncio.to_thread(inventory.node_id, settings.state_dir)
    try:
        return await asyncio.to_thread(EngineLock.take, address, node_id=node_id)
    except OSError as exc:
        raise ConfigError(f"cannot make the engine lock: {exc}") from None


async def _start_background(app: web.Application, node: Node, *, sweep: bool) -> None:
    """The node's loops (`Node.spawn_tasks` names them), then the daemon's own."""
    tasks = app[TASKS]
    await node.spawn_tasks(tasks, sweep=sweep)
    tasks.spawn(app[TOKENS].watch(), name="token file watch")
    if REGISTRY_AUTH in app:
        tasks.spawn(app[REGISTRY_AUTH].watch(), name="registry auth file watch")
    tasks.spawn(app[METRICS].watch_lag(), name="event loop lag")
