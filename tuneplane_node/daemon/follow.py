"""Streaming a followed log to its client: chunked text/plain, until the job stops or
the client goes.

A quiet job gives the handler no write to fail on: so the wait for the next chunk looks
at the connection (`presence`), and a client gone (or one that took nothing for
`WRITE_STALL_S`) ends the stream, which releases the engine's stream, its thread and the
follow slot at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from aiohttp import web

from tuneplane_node.clock import within
from tuneplane_node.daemon.presence import unless_gone
from tuneplane_node.errors import NodeError

if TYPE_CHECKING:
    from tuneplane_node.runtime.base import LogStream

log = logging.getLogger(__name__)
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
        chunk = await unless_gone(request, anext(chunks, b""))
        if chunk is None or not chunk:
            return
        try:
            await within(response.write(chunk), WRITE_STALL_S)
        except (ConnectionError, asyncio.TimeoutError):
            _drop(request)
            return


def _drop(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.abort()
