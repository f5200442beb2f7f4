"""Serving the app: its listening sockets (`listener`), TLS, signals, and a guard on
connections.

Nothing a client does without a token may take the node away from the others: a
connection that has not sent its request headers within ``TUNEPLANE_HEADER_TIMEOUT_S``,
or sits idle that long between requests, is closed (aiohttp's keep-alive timer, armed
from the moment a connection opens); the number of open connections stays under the
open-file limit by closing the oldest idle ones; and a failing ``accept()`` is logged
at most once a second, without a traceback, as is a malformed request (never its bytes).

SIGTERM and SIGINT stop the daemon gracefully; SIGHUP reads the token file and the TLS
certificate again. Under systemd (``Type=notify``) it says ``READY=1`` once it serves and
``STOPPING=1`` when a stop begins.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import logging
import resource
import signal
import socket
import ssl
import sys
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from aiohttp.web_protocol import RequestHandler

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.daemon.app import create_node_app, error_response
from tuneplane_node.daemon.listener import describe, listen
from tuneplane_node.daemon.notify import notify
from tuneplane_node.daemon.quiet import QUIET_S, QuietAccept, QuietBadRequests
from tuneplane_node.daemon.state import PORT_HELD, REGISTRY_AUTH, TASKS, TOKENS
from tuneplane_node.errors import ConfigError, NoClientCertificate
from tuneplane_node.settings import NodeSettings, env_name

log = logging.getLogger(__name__)
SLICE_S = 0.005
"""How long a burst of requests may hold the event loop before it turns (LoopSlices)."""
MAX_WOKEN = 64
"""Waiters woken for one slice at most: requests that mostly wait on the engine would
make the last slice's cost per request look tiny."""
LIVENESS_PATH = "/healthz"
BACKLOG = 128
"""asyncio accepts up to this many connections in one go, before any is given to the
guard, and closes a shed one only on the next turn of the loop: both need headroom."""
RESERVED_FDS = 128 + 2 * BACKLOG
"""File descriptors kept from clients: the engine's pool, files, logs, and a burst of
accepts. Out of descriptors, asyncio stops accepting for a whole second."""


class ConnectionGuard:
    """Keeps the open connections under ``limit`` by closing the oldest idle ones.

    Idle means no request being handled: a client trickling its headers, or a
    keep-alive connection between requests, or one still in its TLS handshake (the
    handshake is the guard's own, `TlsHandshake`: asyncio's would hold a connection,
    unseen, until a ClientHello came). A request in flight is never cut.
    """

    def __init__(self, limit: int, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.limit = limit
        self.clock = clock
        # RequestHandler has __slots__ and no weak references: plain containers, pruned.
        self.opened: dict[RequestHandler, float] = {}
        self.busy: set[Any] = set()
        self.handshakes: dict[TlsHandshake, float] = {}  # each while it lasts
        self.shed = 0
        self._said = -QUIET_S

    def factory(
        self, server: web.Server, *, tls: ssl.SSLContext | None = None, handshake_s: float = 10
    ) -> Callable[[], asyncio.Protocol]:
        """Each accepted connection's protocol: aiohttp's handler, after a handshake of
        at most ``handshake_s`` with ``tls``."""

        def connection() -> asyncio.Protocol:
            room = self._make_room(server)
            opened = self.clock.monotonic()
            if tls is not None:
                gate = TlsHandshake(self, server, tls, timeout_s=handshake_s)
                self.handshakes[gate] = opened
                if not room:  # as below: it waits for nobody
                    asyncio.get_running_loop().call_soon(gate.abort)
                return gate
            return self.handler(server, opened, room=room)

        return connection

    def handler(self, server: web.Server, opened: float, *, room: bool) -> RequestHandler:
        handler = server()
        self.opened[handler] = opened
        if not room:  # every connection is busy: this one waits for nobody
            asyncio.get_running_loop().call_soon(handler.force_close)
        return handler

    def _make_room(self, server: web.Server) -> bool:
        # A closed handler stays listed until its task ends: count the open ones.
        connections = [handler for handler in server.connections if handler.transport is not None]
        if len(self.opened) > 2 * len(connections) + 64:  # forget the closed, now and then
            self.opened = {h: self.opened[h] for h in connections if h in self.opened}
        count = len(connections) + len(self.handshakes)
        excess = count + 1 - self.limit
        if excess <= 0:
            return True
        idle: list[tuple[float, Callable[[], None]]] = [
            (self.opened.get(handler, 0.0), handler.force_close)
            for handler in connections
            if handler not in self.busy
        ]
        idle += [(opened, gate.abort) for gate, opened in self.handshakes.items()]
        idle.sort(key=lambda entry: entry[0])
        # Close a sixteenth of the limit more than needed: under a flood the scan and
        # sort run once per batch of accepts, not on every one.
        closing = idle[: excess + self.limit // 16]
        for _, close in closing:
            close()
        self.shed += len(closing)
        self._say(f"{count} connections open: closed the {len(closing)} oldest idle")
        return len(closing) >= excess

    def abort_handshakes(self) -> None:
        """At shutdown: no handshake outlives the server (its task ends with it)."""
        for gate in list(self.handshakes):
            gate.abort()

    def _say(self, message: str) -> None:
        now = self.clock.monotonic()
        if now - self._said >= QUIET_S:
            self._said = now
            log.warning("%s (limit %d; %d closed in all)", message, self.limit, self.shed)

    def middleware(self) -> Middleware:
        """Marks a connection busy while one of its requests is handled."""

        @web.middleware
        async def busy(request: web.Request, handler: Handler) -> web.StreamResponse:
            protocol = request.protocol
            self.busy.add(protocol)
            try:
                return await handler(request)
            finally:
                self.busy.discard(protocol)

        return busy


class TlsHandshake(asyncio.Protocol):
    """A TLS connection until its handshake is done, within the header timeout; then
    aiohttp's handler takes it (`loop.start_tls`), opened as the connection was.

    Until then it is the guard's to count and to close: a client that never sends its
    ClientHello holds a file descriptor like any other idle connection.
    """

    def __init__(
        self,
        guard: ConnectionGuard,
        server: web.Server,
        context: ssl.SSLContext,
        *,
        timeout_s: float,
    ) -> None:
        self.guard = guard
        self.server = server
        self.context = context
        self.timeout_s = timeout_s
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self not in self.guard.handshakes:  # shed before it was made
            transport.abort()
            return
        transport.pause_reading()  # the ClientHello is the handshake's to read
        self.task = asyncio.get_running_loop().create_task(self._handshake())

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.handshakes.pop(self, None)  # gone before its handshake began

    def abort(self) -> None:
        self.guard.handshakes.pop(self, None)
        if self.transport is not None:
            self.transport.abort()

    async def _handshake(self) -> None:
        assert self.transport is not None
        opened = self.guard.handshakes.get(self)
        if opened is None:  # shed before it began (and aborted then)
            return
        handler = self.guard.handler(self.server, opened, room=True)
        try:
            secured = await asyncio.get_running_loop().start_tls(
                self.transport,
                handler,
                self.context,
                server_side=True,
                ssl_handshake_timeout=self.timeout_s,
            )
        except (OSError, asyncio.TimeoutError):  # refused, timed out, shed, or gone
            self.guard.opened.pop(handler, None)
            self.transport.abort()
            return
        finally:
            self.guard.handshakes.pop(self, None)
        if secured is None:  # closed the moment its handshake was done
            self.guard.opened.pop(handler, None)
            return
        handler.connection_made(secured)


class LoopSlices:
    """Answers a burst in slices of about ``slice_s`` of the loop's time, letting the loop
    run what else is due between them: timers (header timeouts, the engine's heartbeat),
    the engine's events (a job's exit), the liveness probe. Otherwise a burst of 200
    requests is one turn of the loop, 30 ms and more on a small machine, with all of that
    waiting.

    A slice begins with the first request of a turn and ends on the next turn. A request
    that finds the slice spent, or others waiting, waits in a FIFO queue; each later turn
    wakes as many waiters as the last slice's cost per request says fit in one slice (at
    least one). Waiters sleep until woken: a burst of any size costs each request one
    wake-up, not one per turn. ``/healthz`` never waits.
    """

    def __init__(self, slice_s: float = SLICE_S, clock: Callable[[], float] = time.perf_counter):
        self.slice_s = slice_s
        self.clock = clock
        self.began: float | None = None  # when the current slice began; None: no slice
        self.admitted = 0  # requests let through in the current slice
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()

    def middleware(self) -> Middleware:
        @web.middleware
        async def sliced(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path != LIVENESS_PATH and not self._admit():
                waiter = asyncio.get_running_loop().create_future()
                self.waiting.append(waiter)
                await waiter  # a cancelled request's waiter is skipped when its turn comes
            return await handler(request)

        return sliced

    def _admit(self) -> bool:
        if self.waiting:
            return False  # behind those already waiting
        now = self.clock()
        if self.began is None:
            self.began, self.admitted = now, 0
            asyncio.get_running_loop().call_soon(self._end_slice)  # runs on the next turn
        elif now - self.began > self.slice_s:
            return False
        self.admitted += 1
        return True

    def _end_slice(self) -> None:
        assert self.began is not None
        now = self.clock()
        each = (now - self.began) / max(self.admitted, 1)
        fit = min(int(self.slice_s / each), MAX_WOKEN) if each > 0 else MAX_WOKEN
        self.began = None
        if not self.waiting:
            return
        self.began, self.admitted = now, 0  # the woken are the next slice
        while self.waiting and self.admitted < max(fit, 1):
            waiter = self.waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)  # it runs on the next turn
                self.admitted += 1
        # After the wake-ups: this slice ends once the woken have run.
        asyncio.get_running_loop().call_soon(self._end_slice)


class GuardedSite(web.TCPSite):
    """A TCP site whose every accepted connection passes the guard first.

    With ``sock``, it serves that socket, bound and listening already (the daemon's, see
    `listener`); without, it binds ``host`` and ``port`` at start, as a TCPSite does.
    """

    def __init__(
        self,
        runner: web.AppRunner,
        guard: ConnectionGuard,
        *,
        sock: socket.socket | None = None,
        handshake_s: float = 10,
        **options: Any,
    ) -> None:
        super().__init__(runner, **options)
        self.guard = guard
        self.sock = sock
        self.handshake_s = handshake_s
        # Named now, as SockSite does: a closed socket has no address.
        scheme = "https" if self._ssl_context else "http"
        self.sock_name = None if sock is None else f"{scheme}://{describe(sock)}"

    @property
    def name(self) -> str:
        return super().name if self.sock_name is None else self.sock_name

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        where: dict[str, Any] = {"sock": self.sock}
        if self.sock is None:
            where = {"host": self._host, "port": self._port, "reuse_address": self._reuse_address}
        # TLS is the guard's (its handshakes count, within the header timeout), not
        # asyncio's: asyncio's waits 60 s for a ClientHello, out of the guard's sight.
        tls = self._ssl_context
        if tls is not None and sys.version_info < (3, 11):  # 3.10's start_tls resets it
            where |= {"ssl": self._ssl_context, "ssl_handshake_timeout": self.handshake_s}
            tls = None  # asyncio's handshake, within the header timeout, out of the guard's sight
        self._server = await asyncio.get_running_loop().create_server(
            self.guard.factory(server, tls=tls, handshake_s=self.handshake_s),
            backlog=self._backlog,
            **where,
        )


def connection_limit() -> int:
    """Connections the node keeps open at most: under the open-file limit, with room."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 65536
    return max(16, soft - RESERVED_FDS)


# --- TLS ---------------------------------------------------------------------------------


def tls_context(settings: NodeSettings) -> ssl.SSLContext | None:
    """HTTPS only, TLS 1.2 or newer; with a client CA, a client certificate is asked for
    and, when given, verified: `client_certificates` says which paths need one."""
    if settings.tls_cert_file is None:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        load_certificate(context, settings)
        if settings.tls_client_ca_file is not None:
            context.load_verify_locations(cafile=settings.tls_client_ca_file)
            context.verify_mode = ssl.CERT_OPTIONAL
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"{env_name('tls_cert_file')}: cannot use the TLS files: {exc}") from None
    return context


def load_certificate(context: ssl.SSLContext, settings: NodeSettings) -> None:
    """(Re)load the chain and key; handshakes after this use the new certificate."""
    assert settings.tls_cert_file is not None and settings.tls_key_file is not None
    context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)


def client_certificates(settings: NodeSettings) -> Middleware:
    """Mutual TLS per path: a client certificate on every path but ``/healthz``, which
    the image's HEALTHCHECK and kubelet's probes call without one (kubelet's rule too:
    its probes are not its API's clients)."""
    refused = NoClientCertificate(setting=env_name("tls_client_ca_file"))

    @web.middleware
    async def certified(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path != LIVENESS_PATH and not _certified(request):
            return error_response(refused)
        return await handler(request)

    return certified


def _certified(request: web.Request) -> bool:
    """Whether the peer gave a certificate (verified in the handshake, or refused there)."""
    transport = request.transport
    tls = transport.get_extra_info("ssl_object") if transport is not None else None
    return isinstance(tls, ssl.SSLObject) and tls.getpeercert(binary_form=True) is not None


# --- running -----------------------------------------------------------------------------


async def serve(settings: NodeSettings, *, host: str, port: int) -> None:
    """Run the daemon until SIGTERM or SIGINT; requests in flight finish first.

    Raises ConfigError on a bad setting, CannotListen when the port cannot be had,
    EngineTaken while another daemon of this machine manages the engine.
    """
    context = tls_context(settings)
    guard = ConnectionGuard(connection_limit())
    middlewares = [guard.middleware(), LoopSlices().middleware()]
    if context is not None and settings.tls_client_ca_file is not None:
        middlewares.append(client_certificates(settings))
    app = create_node_app(settings, middlewares=tuple(middlewares), engine_lock=True)
    # The port before the start-up (the cache's sync can take seconds): a job looping on
    # bind() during a restart would take it meanwhile. Clients wait in the backlog.
    sockets, app[PORT_HELD] = listen(host, port, backlog=BACKLOG)  # read at start-up
    try:
        await _run(app, settings, guard, sockets=sockets, context=context)
    finally:
        for sock in sockets:  # closed already once served; not if the start-up failed
            sock.close()
    log.info("stopped")


async def _run(
    app: web.Application,
    settings: NodeSettings,
    guard: ConnectionGuard,
    *,
    sockets: list[socket.socket],
    context: ssl.SSLContext | None,
) -> None:
    runner = web.AppRunner(
        app,
        access_log=None,
        logger=QuietBadRequests(log),
        keepalive_timeout=settings.header_timeout_s,
        shutdown_timeout=settings.local_stop_timeout,
    )
    loop = asyncio.get_running_loop()
    previous = loop.get_exception_handler()
    loop.set_exception_handler(QuietAccept(loop.default_exception_handler, log))
    try:
        # The app's start-up: the state cache synced (or the engine found down, which is
        # then served as 503s) and the operator's cordon read, all before READY=1.
        await runner.setup()
        freeze_start_up()
        try:
            served = await _serve_on(
                runner,
                guard,
                sockets=sockets,
                context=context,
                handshake_s=settings.header_timeout_s,
            )
            notify("READY=1", f"STATUS=serving on {served}")
            await _until_stopped(lambda: _reload(app, settings, context))
        finally:
            notify("STOPPING=1")
            guard.abort_handshakes()
            await runner.cleanup()  # the app's cleanup: pulls cancelled, the engine closed
    finally:
        loop.set_exception_handler(previous)


def freeze_start_up() -> None:
    """Keep what start-up made (modules, the SDKs, the synced cache) out of every later
    collection, for the process's life. A full collection walks every tracked object:
    68,000 of them here, 27 to 45 ms in which no request is answered."""
    gc.collect()
    gc.freeze()
    log.debug("%d start-up objects left out of garbage collection", gc.get_freeze_count())


async def _serve_on(
    runner: web.AppRunner,
    guard: ConnectionGuard,
    *,
    sockets: list[socket.socket],
    context: ssl.SSLContext | None,
    handshake_s: float,
) -> str:
    """Serve the bound sockets, one site each; their addresses, for the log and systemd.
    A TLS handshake has ``handshake_s`` (the header timeout), as headers do."""
    sites = [
        GuardedSite(
            runner, guard, sock=sock, ssl_context=context, backlog=BACKLOG, handshake_s=handshake_s
        )
        for sock in sockets
    ]
    for site in sites:
        await site.start()
    served = ", ".join(site.name for site in sites)
    log.info("listening on %s (at most %d connections)", served, guard.limit)
    return served


async def _until_stopped(on_hangup: Callable[[], None]) -> None:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    def stop(sig: signal.Signals) -> None:
        log.info("%s: stopping (requests in flight finish first)", sig.name)
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop, sig)
    loop.add_signal_handler(signal.SIGHUP, on_hangup)
    try:
        await stopping.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)


def _reload(app: web.Application, settings: NodeSettings, context: ssl.SSLContext | None) -> None:
    log.info("SIGHUP: reading the token file, the registry auth file and the TLS files again")
    app[TASKS].spawn(app[TOKENS].reload(), name="token reload")
    if REGISTRY_AUTH in app:
        app[TASKS].spawn(app[REGISTRY_AUTH].reload(), name="registry auth reload")
    if context is not None:
        try:
            load_certificate(context, settings)
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS files unreadable (%s): keeping the certificate in use", exc)
