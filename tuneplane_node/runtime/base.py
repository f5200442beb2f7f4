"""The runtime contract: job containers as plain data, and the async interface over an engine.

Nothing above `runtime/` sees an SDK object: the daemon speaks `ContainerSpec` in and
`ContainerState` out. Engine SDKs are synchronous, so every call goes through one
`BlockingPool`; image pulls stream through `drive_pull`, which owns the deadlines and
the cancellation for every engine alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple, Protocol, TypeVar

from tuneplane_node.errors import RuntimeFailure

log = logging.getLogger(__name__)
T = TypeVar("T")

LABEL_RUN_ID = "tuneplane.run-id"
LABEL_GPUS = "tuneplane.gpus"
LABEL_USER = "tuneplane.user"
LABEL_KIND = "tuneplane.kind"
LABEL_ATTEMPT = "tuneplane.attempt"

# A container in one of these holds its cards: it runs, or may run without asking us.
LIVE_STATUSES = frozenset({"running", "created", "paused", "restarting"})
NAME_PREFIX = "tuneplane-"
_UNSAFE = re.compile(r"[^a-zA-Z0-9_.-]")
_MAX_NAME = 120


def container_name(run_id: str) -> str:
    """``tuneplane-<safe id>``; ids that had to be changed get a hash so two never collide."""
    safe = _UNSAFE.sub("-", run_id)
    if safe == run_id and len(safe) <= _MAX_NAME:
        return NAME_PREFIX + safe
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:10]
    return f"{NAME_PREFIX}{safe[:_MAX_NAME]}-{digest}"


def format_gpus(gpus: Iterable[int]) -> str:
    return ",".join(str(g) for g in sorted(set(gpus)))


def parse_gpus(label: str | None) -> tuple[int, ...]:
    """Card indices from a ``tuneplane.gpus`` label; junk entries are dropped, loudly."""
    cards: set[int] = set()
    for part in (label or "").split(","):
        part = part.strip()
        if not part:
            continue
        if part.isdigit():
            cards.add(int(part))
        else:
            log.warning("ignoring bad entry %r in %s label %r", part, LABEL_GPUS, label)
    return tuple(sorted(cards))


def parse_time(value: str | None) -> datetime | None:
    """An engine timestamp (RFC 3339, nanoseconds allowed); the zero time is None."""
    if not value or value.startswith("0001-01-01"):
        return None
    text = value.strip().replace("Z", "+00:00")
    # Python takes at most microseconds: cut the fraction to 6 digits.
    text = re.sub(r"(\.\d{6})\d+", r"\1", text)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def pull_params(image: str) -> dict[str, str]:
    """Docker-API ``/images/create`` parameters: an untagged name means ``latest``.

    Without a tag the engine would pull EVERY tag of the repository.
    """
    last = image.rsplit("/", 1)[-1]
    if "@" in image or ":" in last:
        return {"fromImage": image}
    return {"fromImage": image, "tag": "latest"}


def iso(moment: datetime | None) -> str | None:
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z") if moment else None


class Mount(NamedTuple):
    host: str
    container: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """One job container. ``command`` is the entry argv: it replaces the image ENTRYPOINT."""

    name: str
    image: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[int, ...] = ()
    mounts: tuple[Mount, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    workdir: str | None = None
    shm_size: str | None = None
    cpu_limit: float | None = None
    memory_limit: str | None = None
    network: str = "host"
    user: str | None = None


def job_labels(spec: ContainerSpec) -> dict[str, str]:
    """The labels a job container carries: the spec's, and its cards, which every
    runtime writes itself so the label can never disagree with the devices."""
    return {**spec.labels, LABEL_GPUS: format_gpus(spec.gpus)}


@dataclass(frozen=True)
class ContainerState:
    """What an engine says about one container. Times are RFC 3339 strings or None."""

    name: str
    exists: bool
    status: str = ""
    exit_code: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    oom_killed: bool = False
    id: str | None = None

    @classmethod
    def missing(cls, name: str) -> ContainerState:
        return cls(name=name, exists=False)

    @functools.cached_property
    def gpus(self) -> tuple[int, ...]:
        """Parsed once per state: occupancy reads it for every container on every health."""
        return parse_gpus(self.labels.get(LABEL_GPUS))

    @property
    def run_id(self) -> str | None:
        return self.labels.get(LABEL_RUN_ID)

    @property
    def attempt(self) -> int | None:
        value = self.labels.get(LABEL_ATTEMPT, "")
        return int(value) if value.isdigit() else None

    @property
    def never_started(self) -> bool:
        return self.exists and self.started_at is None

    @property
    def live(self) -> bool:
        return self.exists and self.status in LIVE_STATUSES


@dataclass(frozen=True)
class RuntimeHealth:
    ok: bool
    engine: str
    version: str | None = None
    error: str | None = None


ProgressCallback = Callable[[int, int, int, int], None]


class ContainerRuntime(Protocol):
    """The verbs the daemon needs from an engine, all of them async."""

    name: str

    async def run(self, spec: ContainerSpec) -> str: ...
    async def inspect(self, name: str) -> ContainerState: ...
    async def logs(self, name: str, tail_lines: int) -> str: ...
    async def stop(self, name: str, timeout: float) -> None: ...
    async def remove(self, name: str) -> None: ...
    async def ps(self) -> list[ContainerState]: ...
    async def health(self) -> RuntimeHealth: ...
    async def image_exists(self, image: str) -> bool: ...
    async def pull(
        self,
        image: str,
        *,
        timeout: float,
        stall_timeout: float,
        on_progress: ProgressCallback | None = None,
    ) -> None: ...
    async def close(self) -> None: ...


class BlockingPool:
    """The one bounded thread pool that runs blocking engine calls off the event loop."""

    def __init__(self, threads: int, *, name: str) -> None:
        self.threads = threads
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        # Threads blocked in a call finish on their own; nothing new is started.
        self._executor.shutdown(wait=False, cancel_futures=True)


def close_http_stream(response: Any) -> None:
    """Unblock a thread reading a streamed HTTP response, from any other thread.

    ``response.close()`` alone does not wake a thread sitting in ``recv``; shutting the
    socket down does. The attribute path is requests over http.client (unix or TCP).
    """
    with contextlib.suppress(Exception):
        sock = response.raw._fp.fp.raw._sock
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(Exception):
        response.close()


class PullProgress:
    """Folds the docker-format progress stream into bytes and layers.

    ``moved`` changes whenever anything advances (download or extraction bytes, a layer
    done): that, not the bytes alone, is what the stall deadline watches.
    """

    _DONE = {"Download complete", "Pull complete", "Already exists"}

    def __init__(self) -> None:
        self._download: dict[str, tuple[int, int]] = {}
        self._extract: dict[str, int] = {}
        self._layers: set[str] = set()
        self._done: set[str] = set()
        self._downloaded: set[str] = set()
        self.moved = 0

    def update(self, message: Mapping[str, Any]) -> bool:
        """Fold one message in; True when it moved the pull forward."""
        layer, status = message.get("id"), str(message.get("status", ""))
        detail = message.get("progressDetail") or {}
        if not layer or not isinstance(layer, str) or status.startswith("Pulling from"):
            return False
        before = self.snapshot(), sum(self._extract.values()), len(self._done)
        self._layers.add(layer)
        current, total = int(detail.get("current") or 0), int(detail.get("total") or 0)
        if status == "Downloading" and total:
            self._download[layer] = (current, total)
        elif status == "Extracting":
            self._extract[layer] = current
        if status in self._DONE:
            (self._downloaded if status == "Download complete" else self._done).add(layer)
            size = self._download.get(layer, (0, 0))[1]
            if size:
                self._download[layer] = (size, size)
        changed = (self.snapshot(), sum(self._extract.values()), len(self._done)) != before
        self.moved += changed
        return changed

    def snapshot(self) -> tuple[int, int, int, int]:
        done = sum(c for c, _ in self._download.values())
        total = sum(t for _, t in self._download.values())
        # A layer counts once its bytes are here: podman's compat stream stops at
        # "Download complete", and docker's extraction shows up in `moved` instead.
        return done, total, len(self._done | self._downloaded), len(self._layers)


StreamOpener = Callable[[], tuple[Iterator[Mapping[str, Any]], Any]]


class _PullRun:
    """State shared between the reading thread and the watching coroutine."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.response: Any = None
        self.aborted = False
        self.progress = PullProgress()
        self.last_move = time.monotonic()

    def attach(self, response: Any) -> bool:
        with self.lock:
            self.response = response
            aborted = self.aborted
        if aborted:
            close_http_stream(response)
        return not aborted

    def abort(self) -> None:
        with self.lock:
            self.aborted = True
            response = self.response
        if response is not None:
            close_http_stream(response)


async def drive_pull(
    pool: BlockingPool,
    *,
    engine: str,
    image: str,
    open_stream: StreamOpener,
    timeout: float,
    stall_timeout: float,
    on_progress: ProgressCallback | None,
) -> None:
    """Read a pull's progress stream on the pool, enforcing both deadlines.

    ``open_stream`` runs on the pool thread and returns (decoded messages, the HTTP
    response). Cancelling the awaiting task, or missing a deadline, closes the stream so
    the thread stops reading at once; the coroutine does not wait for the thread.
    """
    run = _PullRun()
    loop = asyncio.get_running_loop()

    def report() -> None:
        if on_progress is not None:
            on_progress(*run.progress.snapshot())

    def read() -> None:
        messages, response = open_stream()
        if not run.attach(response):
            return
        for message in messages:
            if run.aborted:
                return
            if message.get("error"):
                raise RuntimeFailure(
                    engine=engine, action=f"pull {image}", reason=str(message["error"])
                )
            if run.progress.update(message):
                run.last_move = time.monotonic()
                with contextlib.suppress(RuntimeError):  # the loop may be closing
                    loop.call_soon_threadsafe(report)

    future = asyncio.ensure_future(pool.call(read))
    started = time.monotonic()
    try:
        while True:
            done, _ = await asyncio.wait({future}, timeout=min(0.25, stall_timeout))
            if done:
                break
            now = time.monotonic()
            if now - started > timeout:
                raise RuntimeFailure(
                    engine=engine, action=f"pull {image}", reason=f"not done after {timeout:g} s"
                )
            if now - run.last_move > stall_timeout:
                raise RuntimeFailure(
                    engine=engine,
                    action=f"pull {image}",
                    reason=f"no progress for {stall_timeout:g} s",
                )
    except BaseException:
        run.abort()
        future.add_done_callback(_drain)
        raise
    future.result()
    report()


def _drain(future: asyncio.Future[Any]) -> None:
    """Swallow the error a deliberately aborted read ends with."""
    if not future.cancelled() and future.exception() is not None:
        log.debug("aborted pull stream ended with %r", future.exception())
