"""Following a log: one pool thread reads the engine's stream into a small spool, the
loop takes from it; closing the stream shuts its socket so the thread stops at once.
The thread alone closes the response: a close from the loop while the thread reads
would hand one HTTP connection back to the SDK's pool twice (podman's then answers
another call on it with ``ResponseNotReady``).

The thread waits for room in the spool, so a reader slower than the job leaves the
engine's stream unread (the engine waits) and the node holds one spool, never more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

from tuneplane_node.clock import within
from tuneplane_node.errors import EngineUnavailable
from tuneplane_node.runtime.pool import BlockingPool

log = logging.getLogger(__name__)
SPOOL_BYTES = 64 * 1024
"""Bytes held between the reading thread and the loop, and the largest chunk handed on."""
RELEASE_S = 5.0
"""How long a close waits for the reading thread to notice its socket is shut."""

Reader = Callable[["LogRelay"], None]
"""Runs on a pool thread: opens the stream, `attach`es it, `put`s its pieces."""


def _socket(response: Any) -> Any | None:
    """The socket under a streamed requests response (http.client, unix, TCP or TLS);
    None once its body ended (http.client lets go of its file there)."""
    with contextlib.suppress(Exception):
        return response.raw._fp.fp.raw._sock
    return None


def unbound_reads(response: Any) -> None:
    """Let a streamed response wait for data as long as it takes, once its headers came
    within the deadline: a job may be quiet for hours. A close shuts it (the loop's)."""
    sock = _socket(response)
    if sock is not None:
        sock.settimeout(None)


ONE_USE = {"Connection": "close"}
"""A streamed request's header: the engine closes the connection once the stream ends, so
the socket a watcher shuts down (`shut`) is never one the SDK's pool hands to another
call (a stream read to its end would otherwise give its live socket back to the pool)."""


def opened(response: Any, check: Callable[[Any], object] | None = None) -> Any:
    """A streamed response that ``check`` (the SDK's status check; by default its own
    ``raise_for_status``) let through; one it refused is closed first, here, by the
    thread that holds it (`shut`): left to the garbage collector, its connection was
    closed on whatever thread that ran."""
    try:
        if check is None:
            response.raise_for_status()
        else:
            check(response)
    except BaseException:
        with contextlib.suppress(Exception):
            response.close()
        raise
    return response


def shut(response: Any) -> None:
    """Wake the thread reading the response, from any thread: its read fails at once.

    Never a close from here: the reading thread closes it once it has stopped. A close
    from another thread races that thread's own (or urllib3's at the body's end), and
    one connection goes back to the SDK's pool twice or is closed while another call
    uses it (``ResponseNotReady`` after a cancelled podman pull, seen in CI). No socket
    found: the body has ended, nothing is blocked on it."""
    sock = _socket(response)
    if sock is not None:
        with contextlib.suppress(Exception):
            sock.shutdown(socket.SHUT_RDWR)


class LogRelay:
    """A `LogStream` read by one thread of the engine's pool."""

    def __init__(self, *, engine: str, limit: int = SPOOL_BYTES) -> None:
        self.engine = engine
        self.limit = limit
        self.loop = asyncio.get_running_loop()
        self._room = threading.Condition()
        self._data = bytearray()
        self._ended = False
        self._error: BaseException | None = None
        self._closed = False
        self._response: Any = None
        self._ready = asyncio.Event()
        self.opened: asyncio.Future[bool] = self.loop.create_future()
        self._thread: asyncio.Future[None] | None = None

    # --- the reading thread -------------------------------------------------------------

    def attach(self, response: Any | None) -> bool:
        """The stream is open (None: the container is missing); False when the relay was
        closed meanwhile: stop, and close the response."""
        with self._room:
            self._response, closed = response, self._closed
        self._signal(lambda: _settle(self.opened, response is not None))
        return not closed and response is not None

    def put(self, piece: bytes) -> bool:
        """Hand a piece on, waiting for room; False once the relay is closed."""
        with self._room:
            while len(self._data) >= self.limit and not self._closed:
                self._room.wait()
            if self._closed:
                return False
            was_empty = not self._data
            self._data += piece
        if was_empty:
            self._signal(self._ready.set)
        return True

    def _end(self, error: BaseException | None) -> None:
        with self._room:
            self._ended, self._error = True, None if self._closed else error
        self._signal(self._ready.set)
        self._signal(lambda: _settle(self.opened, error))

    def _signal(self, fn: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closing: nobody waits
            self.loop.call_soon_threadsafe(fn)

    # --- the loop -----------------------------------------------------------------------

    async def start(self, pool: BlockingPool, read: Reader, *, deadline_s: float) -> bool:
        """Open the stream on a pool thread; False when the container is missing. An
        engine that does not answer within the deadline is `EngineUnavailable`."""
        self._thread = asyncio.ensure_future(pool.call(self._read_followed, read))
        try:
            return await within(asyncio.shield(self.opened), deadline_s)
        except asyncio.TimeoutError:
            await self.aclose()
            reason = f"no answer within {deadline_s:g} s (follow a log)"
            raise EngineUnavailable(engine=self.engine, reason=reason) from None
        except BaseException:
            await self.aclose()
            raise

    def _read_followed(self, read: Reader) -> None:
        try:
            read(self)
        except BaseException as exc:
            self._end(exc)
        else:
            self._end(None)

    def __aiter__(self) -> LogRelay:
        return self

    async def __anext__(self) -> bytes:
        while True:
            with self._room:
                if self._data:
                    chunk = bytes(self._data)
                    self._data.clear()
                    self._room.notify()
                    return chunk
                if self._ended or self._closed:
                    error, self._error = self._error, None
                    if error is not None:
                        raise error
                    raise StopAsyncIteration
                self._ready.clear()
            await self._ready.wait()

    async def aclose(self) -> None:
        """Shut the engine's stream and wait (a bounded while) for the thread to let go."""
        with self._room:
            self._closed = True
            self._data.clear()
            response = self._response
            self._room.notify_all()
        _settle(self.opened, False)  # a late open finds the relay closed, and shuts itself
        if response is not None:
            shut(response)
        if self._thread is None:
            return
        done, _ = await asyncio.wait({self._thread}, timeout=RELEASE_S)
        if not done:
            log.warning("a followed log's thread still reads %g s after its close", RELEASE_S)
        self._thread.add_done_callback(_quiet)


def _settle(future: asyncio.Future[bool], outcome: bool | BaseException | None) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(bool(outcome))


def _quiet(future: asyncio.Future[None]) -> None:
    """The thread's own error is the relay's to report: the future's is read here."""
    if not future.cancelled():
        future.exception()
