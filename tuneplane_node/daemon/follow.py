"""Streaming a followed log to its client: chunked text/plain, until the job stops or
the client goes.

aiohttp does not cancel a handler whose client went away, and a quiet job gives it no
write to fail on: so the wait for the next chunk looks at the connection every
`WATCH_S`, and a client gone (or one that took nothing for `WRITE_STALL_S`) ends the
stream, which releases the engine's stream, its thread and the follow slot at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from aiohttp import web

from tuneplane_node.errors import NodeError

if TYPE_CHECKING:
    from tuneplane_node.runtime.base import LogStream

log = logging.getLogger(__name__)
WATCH_S = 0.5
"""How often a stream waiting for the job's next line checks that its client is there."""
WRITE_STALL_S = 60.0
"""A client that takes nothing for this long is gone: the stream ends (follow again,
with ``since``, to go on)."""
HEADERS = {
    "Content-Type": "text/plain; charset=utf-8",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}


async def stream_log(
    request: web.Request, follow: AbstractAsyncContextManager[LogStream]
) -> web.StreamResponse:
    """Send the stream's chunks as they come. A refusal (a 429, the engine down) comes
    from entering ``follow``, before the headers: a JSON error like any other."""
    async with follow as chunks:
        response = web.StreamResponse(headers=HEADERS)
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            await _relay(request, response, chunks)
        except NodeError as exc:
            # The headers said 200: cut the connection, so the client sees an answer
            # broken off, never a clean end it would take for the job's exit.
            log.warning("following the logs broke off: %s", exc.message)
            _drop(request)
            return response
    with contextlib.suppress(ConnectionError):
        await response.write_eof()
    return response


async def _relay(request: web.Request, response: web.StreamResponse, chunks: LogStream) -> None:
    """Write each chunk once the client has room: the next is read only after it."""
    while True:
        step = asyncio.ensure_future(anext(chunks, b""))
        try:
            chunk = await _while_connected(request, step)
        finally:
            if not step.done():
                step.cancel()
                await asyncio.wait({step})
        if chunk is None or not chunk:
            return
        try:
            await asyncio.wait_for(response.write(chunk), WRITE_STALL_S)
        except (ConnectionError, asyncio.TimeoutError):
            _drop(request)
            return


async def _while_connected(request: web.Request, step: asyncio.Future[bytes]) -> bytes | None:
    """The step's chunk; None when the client went away first."""
    while True:
        done, _ = await asyncio.wait({step}, timeout=WATCH_S)
        if done:
            return step.result()
        transport = request.transport
        if transport is None or transport.is_closing():
            return None


def _drop(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()
