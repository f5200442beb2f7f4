"""The daemon's logs of what clients do wrong, one line a second at most: a failing
``accept()`` (`QuietAccept`) and a request aiohttp could not parse (`QuietBadRequests`).
A flood of either must not fill the disk, nor quote a request's bytes (a token may be
in them)."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from typing import Any

from aiohttp.http_exceptions import HttpProcessingError

from tuneplane_node.clock import SYSTEM_CLOCK, Clock

QUIET_S = 1.0
"""At most one line this often of each kind (the connection guard's shed too)."""


class QuietAccept:
    """The loop's exception handler, with a failing accept() said once a second.

    Out of file descriptors, asyncio reports every failed accept with a traceback; a
    flood of connections would fill the disk with them.
    """

    def __init__(
        self,
        fallback: Callable[[dict[str, Any]], None],
        log: logging.Logger,
        *,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.fallback, self.log = fallback, log
        self.clock = clock
        self.said = -QUIET_S
        self.dropped = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if "accept" not in str(context.get("message", "")):
            self.fallback(context)
            return
        now = self.clock.monotonic()
        if now - self.said < QUIET_S:
            self.dropped += 1
            return
        self.log.error(
            "accept() failed: %s (%d more not logged)", context.get("exception"), self.dropped
        )
        self.said, self.dropped = now, 0


class QuietBadRequests(logging.LoggerAdapter):  # type: ignore[type-arg] # generic at 3.11 only
    """aiohttp's log of the requests it could not parse, one line a second at most.

    aiohttp logs each with a traceback quoting the bad line: 16 KB a request, a token
    in it when the bad line was an ``Authorization`` header. This says the peer and the
    error's kind, never the bytes; other errors pass through as they are.
    """

    def __init__(self, logger: logging.Logger, *, clock: Clock = SYSTEM_CLOCK) -> None:
        super().__init__(logger, {})
        self.clock = clock
        self.said = -QUIET_S
        self.dropped = 0

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        error = kwargs.get("exc_info")
        if error is True:
            error = sys.exc_info()[1]
        if not isinstance(error, HttpProcessingError):
            super().log(level, msg, *args, **kwargs)
            return
        if not self.logger.isEnabledFor(level):
            return
        now = self.clock.monotonic()
        if now - self.said < QUIET_S:
            self.dropped += 1
            return
        peer = args[0] if args else "?"
        self.logger.log(
            min(level, logging.WARNING),  # a client's fault, not the node's
            "malformed request from %s (%s, answered %s; %d more not logged)",
            peer, type(error).__name__, error.code, self.dropped,
        )  # fmt: skip
        self.said, self.dropped = now, 0
