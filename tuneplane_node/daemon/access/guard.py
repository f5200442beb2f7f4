"""Who may ask what: the bearer token and its scope, per route, and a brake on guessing.

A verb needs the ``full`` scope unless the tables below say less: the node's care an
``operate`` token buys (an operator's ``ctl``: images, prefetch, GC, cordon, drain), the
read verbs an ``observe`` token buys (a dashboard), and ``/metrics``, which a ``metrics``
token buys alone (a scraper). A verb outside the token's scope is a 403 naming the
scope it needs.

A wrong token costs its sender: every failure is counted (``tuneplane_node_auth_failures``)
and said at most once a second with the peer and the count; past `SLOW_AFTER` failures
in `WINDOW_S` a peer's 401s are delayed, longer with each, and past `REFUSE_AFTER` they
are 429s, until its failures age out of the window. A peer with `MAX_WAITING` delayed
answers in flight gets its next 429 at once: a delayed answer holds a connection, and a
guesser's rate is what it may hold open over the delay. A right token is never slowed,
even from a peer that failed before (the console behind the same NAT), and its peer's
failures are forgotten.
"""

from __future__ import annotations

import collections
import logging
from typing import NoReturn

from aiohttp import hdrs, web

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.daemon.access.tokens import FULL, METRICS, OBSERVE, OPERATE, Token, TokenSet
from tuneplane_node.errors import InsufficientScope, TooManyAuthFailures, Unauthorized
from tuneplane_node.wire.schema import DOCUMENT_PATH

log = logging.getLogger(__name__)
METRICS_PATH = "/metrics"
READ_VERBS = frozenset(
    {
        ("GET", "/node/v1/health"),
        ("GET", "/node/v1/inventory"),
        ("POST", "/node/v1/observe"),
        ("GET", "/node/v1/jobs"),
        ("POST", "/node/v1/stats"),
        ("GET", DOCUMENT_PATH),
    }
)
"""What an ``observe`` token buys besides ``/metrics``: reading, never acting, never logs
(a job's output is the customer's)."""
OPERATE_VERBS = frozenset(
    {
        ("GET", "/node/v1/images"),
        ("GET", "/node/v1/volumes"),
        ("POST", "/node/v1/images/pull"),
        ("POST", "/node/v1/images/gc"),
        ("POST", "/node/v1/volumes/pull"),
        ("POST", "/node/v1/volumes/gc"),
        ("POST", "/node/v1/cordon"),
        ("POST", "/node/v1/uncordon"),
        ("POST", "/node/v1/drain"),
        ("POST", "/node/v1/gpus/reset-breaker"),
    }
)
"""What an ``operate`` token buys besides the reads: the node's care, never a job's verb
(launch, stop, signal, remove, reap) nor its logs. A drain stops every job, as an
operator taking the node out of service must."""
TOKEN_KEY = web.RequestKey("token", Token)
WINDOW_S = 10.0
SLOW_AFTER = 5
"""Failures in the window a peer makes before its answers are delayed: typos are free."""
REFUSE_AFTER = 20
DELAY_STEP_S = 0.1
MAX_DELAY_S = 1.5
"""A delayed answer holds a connection: bounded, and a refused peer is not delayed."""
MAX_WAITING = 4
MAX_PEERS = 4096
"""Peers whose failures are remembered; past it the oldest is forgotten (memory)."""
SAY_EVERY_S = 1.0


def needed_scope(method: str, path: str) -> str:
    verb = ("GET" if method == "HEAD" else method, path)
    if verb == ("GET", METRICS_PATH):
        return METRICS
    if verb in READ_VERBS:
        return OBSERVE
    return OPERATE if verb in OPERATE_VERBS else FULL


class AuthFailures:
    """Failed authentications per peer over the last `WINDOW_S`, and their one log line
    a second."""

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.peers: collections.OrderedDict[str, collections.deque[float]] = (
            collections.OrderedDict()
        )
        self.waiting: collections.Counter[str] = collections.Counter()  # delayed answers
        self.total = 0
        self._unsaid = 0
        self._said = -SAY_EVERY_S

    def recent(self, peer: str) -> int:
        """The peer's failures still in the window."""
        times = self.peers.get(peer)
        if times is None:
            return 0
        horizon = self.clock.monotonic() - WINDOW_S
        while times and times[0] <= horizon:
            times.popleft()
        if not times:
            del self.peers[peer]
        return len(times)

    def failed(self, peer: str) -> int:
        """Count one failure of the peer; its failures in the window, this one included."""
        self.total += 1
        self._unsaid += 1
        times = self.peers.pop(peer, None) or collections.deque()
        times.append(self.clock.monotonic())
        self.peers[peer] = times  # the most recent last: the oldest is forgotten first
        while len(self.peers) > MAX_PEERS:
            self.peers.popitem(last=False)
        count = self.recent(peer)
        self._say(peer, count)
        return count

    def succeeded(self, peer: str) -> None:
        self.peers.pop(peer, None)

    def _say(self, peer: str, count: int) -> None:
        now = self.clock.monotonic()
        if now - self._said < SAY_EVERY_S:
            return
        log.warning(
            "%d failed authentication(s) since the last such line; the latest from %s, "
            "its %d in the last %g s (%d in all)",
            self._unsaid, peer, count, WINDOW_S, self.total,
            extra={"client": peer},
        )  # fmt: skip
        self._said, self._unsaid = now, 0


def delay_s(failures: int) -> float:
    """How long the answer to a peer's ``failures``-th failure waits."""
    return min(max(failures - SLOW_AFTER, 0) * DELAY_STEP_S, MAX_DELAY_S)


def authenticate(
    tokens: TokenSet, failures: AuthFailures, request: web.Request, *, scope: str
) -> Token | None:
    """The request's token, if it is one of the set and buys ``scope``; None when it is
    none of the set (the caller awaits `refuse`); raises InsufficientScope. No coroutine
    on the way of a right token: every request of a burst takes it."""
    token = tokens.match(request.headers.get(hdrs.AUTHORIZATION, ""))
    if token is None:
        return None
    failures.succeeded(request.remote or "unknown")
    request[TOKEN_KEY] = token
    if not token.grants(scope):
        raise InsufficientScope(
            scope=token.scope, needed=scope, verb=f"{request.method} {request.path}"
        )
    return token


async def refuse(failures: AuthFailures, peer: str) -> NoReturn:
    """Count the failure, wait the peer's delay, raise its 401 or 429."""
    count = failures.failed(peer)
    delay = delay_s(count)
    if delay > 0:
        if failures.waiting[peer] >= MAX_WAITING:
            raise TooManyAuthFailures(failures=count, window_s=WINDOW_S)
        failures.waiting[peer] += 1
        try:
            await failures.clock.sleep(delay)
        finally:
            failures.waiting[peer] -= 1
            if failures.waiting[peer] <= 0:
                del failures.waiting[peer]
    if count >= REFUSE_AFTER:
        raise TooManyAuthFailures(failures=count, window_s=WINDOW_S)
    raise Unauthorized()
