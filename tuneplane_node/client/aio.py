"""AsyncNodeClient: the node's API for a console on asyncio, one method per verb."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx

from tuneplane_node.client import answers, calls
from tuneplane_node.client.calls import Call, Container
from tuneplane_node.client.endpoint import NO_TLS, TIMEOUT_S, Endpoint, Tls
from tuneplane_node.client.errors import NodeError
from tuneplane_node.client.images import ImageGc, Images, Prefetch
from tuneplane_node.client.retry import Retry, tuned
from tuneplane_node.client.volumes import VolumeGc, VolumePull, Volumes
from tuneplane_node.client.watch import DEFAULT_WAIT_S, Backoff, Watch

T = TypeVar("T")


class AsyncNodeClient:
    """A node at ``url`` (``http://host:port`` or ``https://...``), asked with ``token``.

    Use it as ``async with AsyncNodeClient(...) as node:``, or `aclose` it: it keeps
    its connections to the node open between calls. Every failure is a
    `tuneplane_node.client.errors.NodeError`. ``transport``: httpx's, for a test or a
    proxy."""

    def __init__(
        self,
        url: str,
        *,
        token: str,
        tls: Tls = NO_TLS,
        timeout: float = TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: Retry = Retry(),  # noqa: B008 (frozen: one shared default is safe)
    ) -> None:
        self.endpoint = Endpoint(url, token=token, tls=tls)
        self.timeout = timeout
        self.retry = retry
        self._http = httpx.AsyncClient(**self.endpoint.options(timeout), transport=transport)

    async def __aenter__(self) -> AsyncNodeClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client's connections.

        Example: ``await await node.aclose()``."""
        await self._http.aclose()

    async def call(self, call: Call[T]) -> T:
        """Send one call and read its answer (every verb below is one); a safe verb that
        failed saying nothing was done is asked again as ``retry`` says (`retry`).

        Example: ``(await node.call(calls.health())).ok``."""
        delays = self.retry.delays()
        while True:
            try:
                return await self._ask(call)
            except NodeError as error:
                delay = next(delays, None)
                if delay is None or not self.retry.covers(call.path, error):
                    raise
            await asyncio.sleep(delay)

    def options(
        self, *, timeout: float | None = None, retry: Retry | None = None
    ) -> AsyncNodeClient:
        """This client with another timeout or retry policy, for the calls made through
        it; it shares this client's connections (close this one, not it).

        Example: ``node.options(timeout=2.0, retry=NO_RETRY).health()``."""
        return tuned(self, timeout=timeout, retry=retry)

    async def _ask(self, call: Call[T]) -> T:
        with self.endpoint.unreachable():
            response = await self._http.request(
                call.method,
                call.path,
                json=call.body,
                params=call.query,
                timeout=self.timeout + call.wait_s,
            )
        return call.read(self.endpoint.answer(response.status_code, response.content))

    # --- the verbs ------------------------------------------------------------------------

    async def launch(
        self,
        run_id: str,
        container: Container | Mapping[str, Any],
        *,
        requested_gpus: int | None = None,
        relaunch: bool | None = None,
    ) -> answers.Launched:
        """``relaunch=False``: an exited job of the run is the answer (phase ``exited``),
        never launched again; None: the node's default (relaunch).

        Example: ``await node.launch("run-1", Container(image="trainer:1"))``."""
        return await self.call(calls.launch(run_id, container, requested_gpus, relaunch))

    async def observe(self, refs: Sequence[str]) -> dict[str, answers.JobState]:
        """Each ref's state: a container, a pending launch, or ``exists`` False.

        Example: ``(await node.observe(["tuneplane-run-1"]))["tuneplane-run-1"].status``."""
        return await self.call(calls.observe(refs))

    async def jobs(self) -> answers.Jobs:
        """Every job of the node, and the index to watch from.

        Example: ``(await node.jobs()).jobs``."""
        return await self.call(calls.jobs())

    async def changes(self, index: str, *, wait: float | None = None) -> answers.Jobs:
        """One blocking query: what changed since ``index``, within ``wait`` seconds.

        Example: ``(await node.changes(listed.index, wait=30)).removed``."""
        return await self.call(calls.jobs(index, wait))

    async def stats(self, refs: Sequence[str] | None = None) -> dict[str, answers.Usage]:
        """What the jobs use; ``None``: every running job.

        Example: ``(await node.stats(["tuneplane-run-1"]))["tuneplane-run-1"].cpu_ratio``."""
        return await self.call(calls.stats(refs))

    async def stop(
        self,
        ref: str,
        *,
        timeout: float | None = None,
        signal: str | None = None,
        warn_signal: str | None = None,
        warn_s: float | None = None,
    ) -> None:
        """Stop a job: ``warn_signal`` first if given, then its stop signal, then SIGKILL
        after ``timeout``; the answer comes once it has ended.

        Example: ``await node.stop("tuneplane-run-1", timeout=60, warn_signal="SIGUSR1")``."""
        call = calls.stop(
            ref, timeout=timeout, signal=signal, warn_signal=warn_signal, warn_s=warn_s
        )
        await self.call(call)

    async def signal(self, ref: str, signal: str) -> None:
        """Send a running job a signal (`NotRunning` if it is not).

        Example: ``await node.signal("tuneplane-run-1", "SIGUSR1")``."""
        await self.call(calls.signal(ref, signal))

    async def remove(self, ref: str) -> None:
        """Remove a job's container (stopped first if it runs).

        Example: ``await node.remove("tuneplane-run-1")``."""
        await self.call(calls.remove(ref))

    async def reap(self, *, max_age_s: float | None = None) -> int:
        """Remove the node's jobs that ended ``max_age_s`` ago; how many it removed.

        Example: ``await node.reap(max_age_s=3600)``."""
        return await self.call(calls.reap(max_age_s))

    async def logs(
        self, ref: str, *, tail: int | None = None, since: float | str | datetime | None = None
    ) -> answers.Logs:
        """A job's output so far: its last ``tail`` lines, those after ``since``.

        Example: ``(await node.logs("tuneplane-run-1", tail=100)).logs``."""
        return await self.call(calls.logs(ref, tail=tail, since=since))

    async def follow(
        self, ref: str, *, tail: int | None = None, since: float | str | datetime | None = None
    ) -> AsyncIterator[str]:
        """A job's output as it comes, until the job exits (text chunks, not lines).

        Example: ``async for chunk in node.follow("tuneplane-run-1"): print(chunk, end="")``."""
        call = calls.logs(ref, tail=tail, since=since, follow=True)
        forever = httpx.Timeout(self.timeout, read=None)
        with self.endpoint.unreachable():
            async with self._http.stream(
                "GET", call.path, params=call.query, timeout=forever
            ) as response:
                if response.status_code >= 300 or "json" in response.headers.get(
                    "content-type", ""
                ):
                    raw = await response.aread()  # an error, or a node that does not stream
                    yield call.read(self.endpoint.answer(response.status_code, raw)).logs
                    return
                async for text in response.aiter_text():
                    yield text

    async def images(self) -> Images:
        """The node's images, and its pulls with their progress.

        Example: ``(await node.images()).pulls``."""
        return await self.call(calls.images())

    async def pull_image(
        self, image: str, *, registry_auth: Mapping[str, str] | None = None, pull_policy: str = ""
    ) -> Prefetch:
        """Prefetch an image: ``phase`` pulling (in the background) or present.

        Example: ``(await node.pull_image("registry/trainer:1")).phase``."""
        return await self.call(calls.pull_image(image, registry_auth, pull_policy))

    async def volumes(self) -> Volumes:
        """The volume store's entries (size, last use, users, pin), its fills with their
        progress, and the store.

        Example: ``(await node.volumes()).entries``."""
        return await self.call(calls.volumes())

    async def pull_volume(self, source: str, sha256: str = "", *, wait: bool = False) -> VolumePull:
        """Prefetch a volume: ``phase`` filling (in the background) or present; pinned
        against eviction. ``wait``: until the fill has ended (its error raised).

        Example: ``(await node.pull_volume("https://models/w", "9f2c...")).phase``."""
        return await self.call(calls.pull_volume(source, sha256, wait=wait))

    async def volume_gc(self) -> VolumeGc:
        """Run the volume store's eviction now: what it removed, and the store after.

        Example: ``(await node.volume_gc()).freed_bytes``."""
        return await self.call(calls.volume_gc())

    async def image_gc(self) -> ImageGc:
        """Run the image GC now: what it removed, and the store after.

        Example: ``(await node.image_gc()).freed_bytes``."""
        return await self.call(calls.image_gc())

    async def health(self) -> answers.Health:
        """The node's health: ok, its cards, whether card jobs can run, its disk.

        Example: ``(await node.health()).gpus_free``."""
        return await self.call(calls.health())

    async def inventory(self) -> answers.Inventory:
        """What the machine has: cards, CPUs, memory, storage, fabrics.

        Example: ``(await node.inventory()).accelerator_count``."""
        return await self.call(calls.inventory())

    async def cordon(self, reason: str) -> answers.NodeState:
        """Take no more launches (jobs that run go on).

        Example: ``(await node.cordon("kernel upgrade")).state``."""
        return await self.call(calls.cordon(reason))

    async def reset_breaker(self) -> answers.Breaker:
        """Reset the GPU circuit breaker (an ``operate`` token): the hour's count starts
        again; the faulted cards it kept in stay in, no longer counted.

        Example: ``(await node.reset_breaker()).tripped``."""
        return await self.call(calls.reset_breaker())

    async def uncordon(self) -> answers.NodeState:
        """Take launches again.

        Example: ``(await node.uncordon()).state``."""
        return await self.call(calls.uncordon())

    async def drain(
        self,
        reason: str,
        *,
        grace_s: float | None = None,
        warn_signal: str | None = None,
        warn_s: float | None = None,
    ) -> answers.NodeState:
        """Cordon, then stop every job (warned first if ``warn_signal``).

        Example: ``(await node.drain("maintenance", grace_s=120)).state``."""
        return await self.call(
            calls.drain(reason, grace_s=grace_s, warn_signal=warn_signal, warn_s=warn_s)
        )

    async def watch(
        self, *, wait: float = DEFAULT_WAIT_S, index: str = "", backoff: Backoff | None = None
    ) -> AsyncIterator[answers.Jobs]:
        """Every job (``full``), then each change as it happens, from blocking queries
        of ``wait`` seconds; keep a copy with ``answer.apply(copy)``. ``index``: go on
        from an earlier answer's instead of listing first. Outlives an engine outage and
        a daemon restart (`tuneplane_node.client.watch`); ends on any other error.

        Example: ``async for answer in node.watch(): answer.apply(jobs)``."""
        watch = Watch(wait=wait, index=index, backoff=backoff or Backoff())
        while True:
            started = time.monotonic()
            try:
                answer = await self.call(watch.call())
            except NodeError as error:
                await asyncio.sleep(watch.failed(error))
                continue
            handed = watch.answered(answer, elapsed=time.monotonic() - started)
            if isinstance(handed, answers.Jobs):
                yield handed
            elif handed:
                await asyncio.sleep(handed)


def _json(response: httpx.Response) -> bool:
    return "json" in response.headers.get("content-type", "")
