"""Whether a request's client is still there, for the handlers that wait long.

aiohttp does not cancel a handler whose client went away (cancelling every handler
would cut a launch or a stop in half), and a handler that only waits gives it no write
to fail on. So a long wait (a followed log's next line, a watch query) looks at the
connection every `CHECK_S` and is cancelled once it closed: what it held (a follow
slot, a watch slot, the engine's stream and its thread) is let go within a second, not
after the wait the client asked for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from aiohttp import web

CHECK_S = 0.5
"""How often a waiting handler checks that its client is there."""
GONE = 499
"""The status a request whose client went away is counted with (nginx's "client closed
request"); nobody reads it."""
T = TypeVar("T")


async def unless_gone(request: web.Request, waited: Awaitable[T]) -> T | None:
    """``waited``'s result; None once the client's connection closed first, ``waited``
    then cancelled and awaited (its ``finally`` has run)."""
    step = asyncio.ensure_future(waited)
    try:
        while True:
            done, _ = await asyncio.wait({step}, timeout=CHECK_S)
            if done:
                return step.result()
            if gone(request):
                return None
    finally:
        if not step.done():
            step.cancel()
            await asyncio.wait({step})


def gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()
