"""The seam every engine SDK call passes through (`EngineSeam`): on the pool, within the
deadline; how one SDK's exceptions become the node's (`ErrorTable`, as httpx maps
httpcore's in one place), and which of them say the connection broke before the engine
answered, so that a read is asked once more. Nothing here imports an SDK.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tuneplane_node.clock import within
from tuneplane_node.errors import (
    EngineConflict,
    EngineRefused,
    EngineUnavailable,
    NodeError,
    SpecRefused,
    is_name_conflict,
)
from tuneplane_node.runtime.pool import BlockingPool

log = logging.getLogger(__name__)
T = TypeVar("T")
BROKEN = (http.client.ResponseNotReady, ConnectionResetError, BrokenPipeError)
"""A connection that broke before the engine answered: a pooled one the engine had
closed meanwhile (``RemoteDisconnected`` is a reset), or one left unready by an earlier
answer. Never ``ConnectionRefusedError``: an engine that is down is said at once."""


@dataclass(frozen=True)
class ErrorTable:
    """How one SDK's exceptions map onto the node's errors.

    ``unreachable``: transport failures, the engine did not answer (503). ``api_error``:
    the engine answered no (502, or 409 for a name in use); its ``status_code`` and
    ``explanation`` carry the engine's words. An api_error without an HTTP response is
    a transport failure the SDK wrapped (podman-py does). ``not_found``: no such
    container or image, which is never an error to the node (`EngineRuntime._or`).
    ``stopped``: the engine's words for a container that was not running when a signal
    (a kill, a forced remove's) reached it, or stopped as it did (`ended`).
    """

    engine: str
    unreachable: tuple[type[BaseException], ...]
    api_error: type[Exception]
    not_found: type[Exception]
    stopped: tuple[str, ...]

    def missing(self, exc: BaseException) -> bool:
        """No such container or image. podman 4 says so with a 500 when a container goes
        between its lookup and its inspect: that is a removal, not a failing engine."""
        if isinstance(exc, self.not_found):
            return True
        return isinstance(exc, self.api_error) and "no such container" in words(exc).lower()

    def ended(self, answer: BaseException | str) -> bool:
        """The engine's refusal (an error, or an answer's text) says the container had
        stopped: a signal that met a job already ended, the job's own end won the race."""
        said = answer if isinstance(answer, str) else words(answer)
        return any(phrase in said for phrase in self.stopped)

    def guarded(self, action: str, fn: Callable[..., T], *args: Any, read: bool = False) -> T:
        """``fn(*args)``, its errors the node's (`translated`). A read (an inspect, a list,
        the version, info, stats) whose connection broke before the engine answered
        (`broke`) is asked once more, within the caller's deadline; a write never is (the
        engine may have done it), nor is an engine that refused the connection."""
        with self.translated(action):
            try:
                return fn(*args)
            except Exception as exc:
                if not (read and self.broke(exc)):
                    raise
                log.info("%s: the connection broke before an answer, asking again", action)
            return fn(*args)

    def or_missing(self, missing: T, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, or ``missing`` when the engine has no such container or image."""
        try:
            return fn(*args)
        except self.api_error as exc:
            if self.missing(exc):
                return missing
            raise

    @contextlib.contextmanager
    def translated(self, action: str) -> Iterator[None]:
        """The SDK's exceptions raised inside surface as the node's own (`translate`), as
        httpx maps httpcore's: the one place an engine's error becomes the node's."""
        try:
            yield
        except Exception as exc:
            raise self.translate(exc, action=action) from exc

    def broke(self, exc: BaseException) -> bool:
        """The connection broke before the engine answered (`BROKEN`, wrapped by the SDK
        and requests): a read may be asked once more, on another connection (the SDK's
        pool drops one that failed). An answer, or a refused connection, is not this."""
        if isinstance(exc, self.api_error) and getattr(exc, "response", None) is not None:
            return False  # the engine answered
        if not isinstance(exc, (*self.unreachable, self.api_error)):
            return False
        return any(isinstance(each, BROKEN) for each in causes(exc))

    def translate(self, exc: BaseException, *, action: str) -> NodeError:
        if isinstance(exc, NodeError):
            return exc
        # api_error first: SDK errors derive from requests' errors, which are OSErrors.
        if isinstance(exc, self.api_error):
            if getattr(exc, "response", None) is None:
                cause = exc.__cause__ or exc
                return EngineUnavailable(engine=self.engine, reason=str(cause) or _name(cause))
            reason = words(exc)
            status = getattr(exc, "status_code", None)
            if is_name_conflict(status, reason):
                return EngineConflict(engine=self.engine, action=action, reason=reason)
            field = blamed_field(reason) if action.startswith("run ") else None
            if field is not None:
                return SpecRefused(engine=self.engine, action=action, reason=reason, field=field)
            return EngineRefused(engine=self.engine, action=action, reason=reason)
        if isinstance(exc, self.unreachable):
            return EngineUnavailable(engine=self.engine, reason=str(exc) or _name(exc))
        return EngineRefused(engine=self.engine, action=action, reason=describe(exc))


# What an engine says when a container cannot be made or started because of one of its
# fields (docker 20.10+ and podman 4 words), and the field of the request to blame.
BLAME = (
    (re.compile(r"unable to find (user|group)|no matching entries in (passwd|group) file"), "user"),
    (re.compile(r"executable file not found|exec format error"), "command"),
    (re.compile(r"exec: \"[^\"]*\": (stat|permission)"), "command"),
    (re.compile(r"working directory|chdir to cwd"), "workdir"),
    (re.compile(r"bind source path|invalid mount config"), "mounts"),
    (re.compile(r"[Mm]inimum memory limit"), "memory_limit"),
    (re.compile(r"[Rr]ange of CPUs"), "cpu_limit"),
)  # fmt: skip


def blamed_field(reason: str) -> str | None:
    """``container.<field>`` when the engine's refusal names a field of the request."""
    for pattern, field in BLAME:
        if pattern.search(reason):
            return f"container.{field}"
    return None


def _name(exc: BaseException) -> str:
    return type(exc).__name__


def words(exc: BaseException) -> str:
    """The engine's own words in an SDK error: its explanation, else the error's text."""
    return str(getattr(exc, "explanation", None) or exc)


def describe(exc: BaseException) -> str:
    """``Type: message``, even for SDK exceptions whose __str__ itself fails."""
    try:
        return f"{_name(exc)}: {exc}"
    except Exception:
        return _name(exc)


def causes(exc: BaseException, *, most: int = 16) -> Iterator[BaseException]:
    """``exc`` and what it wraps: its cause and context, and the exceptions among its
    arguments (requests' ``ConnectionError(ProtocolError('Connection aborted.', e))``)."""
    todo, seen = [exc], 0
    while todo and seen < most:
        each = todo.pop()
        seen += 1
        yield each
        inner = [each.__cause__, each.__context__, *each.args, getattr(each, "reason", None)]
        todo.extend(one for one in inner if isinstance(one, BaseException))


class EngineSeam:
    """Every SDK call of an engine runtime passes here: on the pool, within the deadline,
    its errors the node's (`ErrorTable`). `EngineRuntime` makes one and hands it to each
    of its helpers in their constructors (as Nomad's docker driver hands its dangling
    reconciler ``getClient``), with the two facts of the engine they all ask: a
    container's inspect document, and whether the engine is this machine's."""

    def __init__(
        self,
        errors: ErrorTable,
        pool: BlockingPool,
        *,
        deadline_s: float,
        document: Callable[[str], Mapping[str, Any]],
        local: Callable[[], bool],
    ) -> None:
        self.errors, self.pool, self.deadline_s = errors, pool, deadline_s
        self.document = document  # the engine's inspect document of a container (blocking)
        self.local = local  # whether the engine runs on this machine (a unix socket)

    async def call(self, action: str, fn: Callable[..., T], *args: Any, read: bool = False) -> T:
        """Run ``fn`` on the pool, within the deadline: a wedged engine may hold the
        thread until the SDK's own timeout, never the caller. ``read``: ``fn`` only reads,
        and may be asked twice (`ErrorTable.guarded`)."""
        return await self.deadlined(action, fn.__name__, functools.partial(fn, *args), read=read)

    async def call_or(
        self, action: str, missing: T, fn: Callable[..., T], *args: Any, read: bool = False
    ) -> T:
        """`call`, with ``missing`` for an answer where the engine has no such container
        or image (`ErrorTable.or_missing`)."""
        call = functools.partial(self.errors.or_missing, missing, fn, *args)
        return await self.deadlined(action, fn.__name__, call, read=read)

    async def deadlined(
        self, action: str, name: str, call: Callable[[], T], *, read: bool = False
    ) -> T:
        """``call`` on the pool under the error table, within the deadline; ``name``, the
        SDK call's, is what the pool's metrics count it as."""
        guarded = self.pool.call_as(name, self.guarded, action, call, read=read)
        try:
            return await within(guarded, self.deadline_s)
        except asyncio.TimeoutError:
            reason = f"no answer within {self.deadline_s:g} s ({action})"
            raise EngineUnavailable(engine=self.errors.engine, reason=reason) from None

    def guarded(self, action: str, fn: Callable[..., T], *args: Any, read: bool = False) -> T:
        """On the calling thread: ``fn(*args)`` under the error table (`ErrorTable.guarded`)."""
        return self.errors.guarded(action, fn, *args, read=read)

    def or_missing(self, missing: T, fn: Callable[..., T], *args: Any) -> T:
        return self.errors.or_missing(missing, fn, *args)

    def translated(self, items: Iterator[T], *, action: str) -> Iterator[T]:
        """A stream whose SDK errors surface as the node's own."""
        with self.errors.translated(action):
            yield from items
