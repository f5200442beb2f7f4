"""`NodeClient` and `SyncNodeClient`: the calls of `calls` sent over httpx, the answer
read, an error answer raised as `NodeRefused`, no answer as `Unreachable` (httpx's
errors are translated here only, the cause chained)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, TypeVar

import httpx

from tuneplane_node.client import answers, calls
from tuneplane_node.client.calls import Call
from tuneplane_node.client.errors import ClientError, NodeRefused, Unreachable

PROTOCOL = 1
"""The wire protocol this client speaks (the node's ``tuneplane_node.wire.PROTOCOL``)."""
PROTOCOL_HEADER = "X-TunePlane-Node-Protocol"
T = TypeVar("T")
Container = Mapping[str, Any]


def _options(url: str, *, token: str, timeout: float, verify: Any) -> dict[str, Any]:
    """What both clients give httpx: the node, its token and protocol, the bounds."""
    headers = {"Authorization": f"Bearer {token}", PROTOCOL_HEADER: str(PROTOCOL)}
    return {"base_url": url, "headers": headers, "timeout": timeout, "verify": verify}


def _request(call: Call[Any]) -> dict[str, Any]:
    request: dict[str, Any] = {"method": call.method, "url": call.path}
    if call.body is not None:
        request["json"] = call.body
    if call.query is not None:
        request["params"] = call.query
    return request


def _timeout(client: httpx.AsyncClient | httpx.Client, call: Call[Any]) -> httpx.Timeout:
    """The client's timeout, and for a blocking query the time the node may hold it."""
    base = client.timeout
    return httpx.Timeout(
        base.connect, read=(base.read or 0) + call.wait_s, write=base.write, pool=base.pool
    )


def _read(call: Call[T], response: httpx.Response) -> T:
    try:
        answer = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        answer = response.text
    if response.status_code >= 400:
        raise NodeRefused.of(response.status_code, answer)
    if not isinstance(answer, dict):
        raise ClientError(f"{call.method} {call.path}: the node answered no JSON object")
    return call.read(answer)


def _unreachable(exc: httpx.TransportError, url: httpx.URL) -> Unreachable:
    return Unreachable(f"no answer from the node at {url}: {type(exc).__name__}: {exc}")


class NodeClient:
    """The async client of one node. ``timeout``: seconds for each answer (a blocking
    query gets its wait on top); ``transport``: httpx's, for TLS options or a test."""

    def __init__(
        self,
        url: str,
        *,
        token: str,
        timeout: float = 30.0,
        verify: Any = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        options = _options(url, token=token, timeout=timeout, verify=verify)
        self.http = httpx.AsyncClient(**options, transport=transport)

    async def __aenter__(self) -> NodeClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def send(self, call: Call[T]) -> T:
        """One call's answer."""
        try:
            response = await self.http.request(**_request(call), timeout=_timeout(self.http, call))
        except httpx.TransportError as exc:
            raise _unreachable(exc, self.http.base_url) from exc
        return _read(call, response)

    async def launch(
        self, run_id: str, container: Container, *, requested_gpus: int | None = None
    ) -> answers.Launched:
        return await self.send(calls.launch(run_id, container, requested_gpus))

    async def observe(self, *refs: str) -> dict[str, answers.JobState]:
        return await self.send(calls.observe(refs))

    async def stats(self, refs: Iterable[str] | None = None) -> dict[str, answers.Usage]:
        return await self.send(calls.stats(refs))

    async def stop(self, ref: str, **plan: Any) -> None:
        """``timeout``, ``signal``, ``warn_signal``, ``warn_s`` as the stop verb takes them."""
        await self.send(calls.stop(ref, **plan))

    async def signal(self, ref: str, sent: str | int) -> None:
        await self.send(calls.signal(ref, sent))

    async def remove(self, ref: str) -> None:
        await self.send(calls.remove(ref))

    async def logs(
        self, ref: str, *, tail: int | None = None, since: str | None = None
    ) -> answers.Logs:
        return await self.send(calls.logs(ref, tail=tail, since=since))

    async def follow(self, ref: str, *, tail: int | None = None) -> AsyncGenerator[bytes, None]:
        """The job's output as it comes, until it exits."""
        call = calls.logs(ref, tail=tail)
        query = {**(call.query or {}), "follow": "1"}
        try:
            async with self.http.stream("GET", call.path, params=query, timeout=None) as got:
                if got.status_code >= 400:
                    await got.aread()
                    _read(call, got)
                async for chunk in got.aiter_bytes():
                    yield chunk
        except httpx.TransportError as exc:
            raise _unreachable(exc, self.http.base_url) from exc

    async def reap(self, max_age_s: float | None = None) -> int:
        return await self.send(calls.reap(max_age_s))

    async def health(self) -> answers.Health:
        return await self.send(calls.health())

    async def inventory(self) -> answers.Inventory:
        return await self.send(calls.inventory())

    async def cordon(self, reason: str | None = None) -> answers.NodeState:
        return await self.send(calls.cordon(reason))

    async def drain(self, reason: str | None = None, **plan: Any) -> answers.NodeState:
        """``grace_s``, ``warn_signal``, ``warn_s`` as the drain verb takes them."""
        return await self.send(calls.drain(reason, **plan))

    async def uncordon(self) -> answers.NodeState:
        return await self.send(calls.uncordon())

    async def jobs(self, index: str | None = None, *, wait_s: float = 60.0) -> answers.Jobs:
        return await self.send(calls.jobs(index, wait_s=wait_s))

    async def watch(self, *, wait_s: float = 60.0) -> AsyncGenerator[answers.Jobs, None]:
        """Every job first (``full``), then each change as the node reports it, from
        blocking queries on the cursor it keeps. A page with ``full`` (the node
        restarted, or the cursor fell out of its history) holds every job: replace the
        copy with it."""
        page = await self.jobs()
        while True:
            yield page
            page = await self.jobs(page.index, wait_s=wait_s)


class SyncNodeClient:
    """`NodeClient`'s verbs, blocking (a script, a console without an event loop)."""

    def __init__(
        self,
        url: str,
        *,
        token: str,
        timeout: float = 30.0,
        verify: Any = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        options = _options(url, token=token, timeout=timeout, verify=verify)
        self.http = httpx.Client(**options, transport=transport)

    def __enter__(self) -> SyncNodeClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    def send(self, call: Call[T]) -> T:
        try:
            response = self.http.request(**_request(call), timeout=_timeout(self.http, call))
        except httpx.TransportError as exc:
            raise _unreachable(exc, self.http.base_url) from exc
        return _read(call, response)

    def launch(
        self, run_id: str, container: Container, *, requested_gpus: int | None = None
    ) -> answers.Launched:
        return self.send(calls.launch(run_id, container, requested_gpus))

    def observe(self, *refs: str) -> dict[str, answers.JobState]:
        return self.send(calls.observe(refs))

    def stats(self, refs: Iterable[str] | None = None) -> dict[str, answers.Usage]:
        return self.send(calls.stats(refs))

    def stop(self, ref: str, **plan: Any) -> None:
        self.send(calls.stop(ref, **plan))

    def signal(self, ref: str, sent: str | int) -> None:
        self.send(calls.signal(ref, sent))

    def remove(self, ref: str) -> None:
        self.send(calls.remove(ref))

    def logs(self, ref: str, *, tail: int | None = None, since: str | None = None) -> answers.Logs:
        return self.send(calls.logs(ref, tail=tail, since=since))

    def follow(self, ref: str, *, tail: int | None = None) -> Iterator[bytes]:
        call = calls.logs(ref, tail=tail)
        query = {**(call.query or {}), "follow": "1"}
        try:
            with self.http.stream("GET", call.path, params=query, timeout=None) as got:
                if got.status_code >= 400:
                    got.read()
                    _read(call, got)
                yield from got.iter_bytes()
        except httpx.TransportError as exc:
            raise _unreachable(exc, self.http.base_url) from exc

    def reap(self, max_age_s: float | None = None) -> int:
        return self.send(calls.reap(max_age_s))

    def health(self) -> answers.Health:
        return self.send(calls.health())

    def inventory(self) -> answers.Inventory:
        return self.send(calls.inventory())

    def cordon(self, reason: str | None = None) -> answers.NodeState:
        return self.send(calls.cordon(reason))

    def drain(self, reason: str | None = None, **plan: Any) -> answers.NodeState:
        return self.send(calls.drain(reason, **plan))

    def uncordon(self) -> answers.NodeState:
        return self.send(calls.uncordon())

    def jobs(self, index: str | None = None, *, wait_s: float = 60.0) -> answers.Jobs:
        return self.send(calls.jobs(index, wait_s=wait_s))
