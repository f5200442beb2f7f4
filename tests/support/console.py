"""A console over a real socket: the stand-in that speaks the node's wire protocol, and
what a 0.3.15 console sends and expects."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tests.support.images import IMAGE
from tests.support.jobs import unique
from tuneplane_node.wire import PROTOCOL, PROTOCOL_HEADER
from tuneplane_node.wire.values import container_name

INVENTORY_KEYS = [
    "accelerator_series",
    "accelerator_name",
    "accelerator_count",
    "driver",
    "runtime",
    "storage_root_visible",
    "disk_free_bytes",
    "cpu_count",
    "memory_bytes",
    "node_id",
    "hostname",
    "agent_version",
    "cuda_version",
    "gpus",
    "storage",
    "local_disk",
    "fabrics",
    "node_state",  # added after every field of 0.3.15
    "cpu_affinity",
    "image_store",  # issue 21
    "conditions",  # issue 34
    "job_disk",
    "protocols",
    "features",
    "isolation",  # issue 37
    "volume_store",  # issue 39
    "gpus_draining",  # issue 53
]


def console_0315(run_id: str, requested: int = 2, **container: Any) -> dict[str, Any]:
    """A 0.3.15 console's launch: every field of its ContainerSpec, "" where it has none."""
    spec = {
        "name": "",
        "image": "registry/trainer:1",
        "command": ["python", "-m", "train"],
        "env": {},
        "gpus": [],
        "mounts": [],
        "labels": {},
        "workdir": "",
        "shm_size": "",
        "cpu_limit": "",
        "memory_limit": "",
        "network": "",
        "user": "",
    }
    return {"run_id": run_id, "requested_gpus": requested, "container": {**spec, **container}}


class ServedAsServe(TestServer):
    """aiohttp's test server without its handler cancellation, which `serve`'s runner
    does not have: what the node does about a client that went away is tested as it
    runs (aiohttp's test server cancels such a handler itself)."""

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        return web.AppRunner(self.app, **{**kwargs, "handler_cancellation": False})


TOKEN = "test-token-0123456789"
HEADERS = {"Authorization": f"Bearer {TOKEN}", PROTOCOL_HEADER: str(PROTOCOL)}


class Console:
    """A console stand-in: speaks the node's wire protocol over a real socket."""

    def __init__(
        self,
        client: TestClient[web.Request, web.Application],
        made: list[str] | None = None,
        *,
        settle: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.client = client
        self.app = client.app
        self.made = made  # names launched through it, for the fixture's clean-up
        # Awaited before each request: over the fake engine, until the node has taken
        # every event of what the test did to the engine (an engine's events take a
        # moment; the node must not be asked in between, or the test is a race).
        self.settle = settle

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        if self.settle is not None:
            await self.settle()
        kwargs.setdefault("headers", HEADERS)
        async with self.client.request(method, path, **kwargs) as response:
            return response.status, await response.json()

    async def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        status, body = await self.call(method, path, **kwargs)
        assert status == 200, (status, body)
        return body

    async def launch(
        self,
        command: list[str] | None = None,
        *,
        gpus: int = 0,
        image: str = IMAGE,
        run_id: str | None = None,
        expect: int = 200,
        **container: Any,
    ) -> tuple[str, Any]:
        run_id = run_id or unique("job")
        name = container.pop("name", container_name(run_id))
        body = {
            "run_id": run_id,
            "requested_gpus": gpus,
            "container": {
                "name": name,
                "image": image,
                "command": command or ["/bin/sleep", "300"],
                **container,
            },
        }
        if self.made is not None:
            self.made.append(name)
        status, answer = await self.call("POST", "/node/v1/launch", json=body)
        assert status == expect, (status, answer)
        return name, answer

    async def observe(self, *refs: str) -> dict[str, Any]:
        body = await self.ok("POST", "/node/v1/observe", json={"refs": list(refs)})
        return body["states"]  # type: ignore[no-any-return]

    async def state(self, ref: str) -> dict[str, Any]:
        return (await self.observe(ref))[ref]  # type: ignore[no-any-return]

    async def jobs(self) -> Any:
        """``GET /node/v1/jobs``: every job, and the index to watch from."""
        return await self.ok("GET", "/node/v1/jobs")

    async def watch(self, index: str, wait: float | None = None) -> Any:
        """One blocking query from ``index`` (``wait``: the node's default when None)."""
        params = {"index": index, **({} if wait is None else {"wait": f"{wait:g}"})}
        return await self.ok("GET", "/node/v1/jobs", params=params)

    async def failed(self, ref: str) -> Any:
        """The state of a launch once it failed; its cards are all free again (4 of 4)."""
        state = await self.wait_for(ref, "status", "dead")
        assert state["pending_phase"] == "failed"
        health = await self.answered_health()  # a loaded engine's silence: cards unknown
        assert (health["gpus_reserved"], health["gpus_free"]) == (0, 4)  # released
        return state

    async def wait_for(self, ref: str, key: str, wanted: Any, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            state = await self.state(ref)
            if state.get(key) == wanted:
                return state
            assert time.monotonic() < deadline, f"{ref}: {key} never became {wanted}: {state}"
            await asyncio.sleep(0.05)

    async def stopping(self, refs: list[str], timeout: float = 30) -> dict[str, Any]:
        """The states of ``refs`` once each shows a stop under way (its first signal sent),
        asked in one observe at a time; fails the test after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            states = await self.observe(*refs)
            if all("stopping" in state for state in states.values()):
                return states
            waiting = [ref for ref, state in states.items() if "stopping" not in state]
            assert time.monotonic() < deadline, f"no stop under way for {waiting}"
            await asyncio.sleep(0.1)

    async def stop(self, ref: str, timeout: float | None = None, **fields: Any) -> Any:
        """A stop; ``fields``: its others (``signal``, ``warn_signal``, ``warn_s``)."""
        body: dict[str, Any] = {"ref": ref, **fields}
        if timeout is not None:
            body["timeout"] = timeout
        return await self.ok("POST", "/node/v1/stop", json=body)

    async def signal(self, ref: str, signal: object) -> tuple[int, Any]:
        """The signal verb's (status, answer)."""
        return await self.call("POST", "/node/v1/signal", json={"ref": ref, "signal": signal})

    async def remove(self, ref: str) -> Any:
        return await self.ok("POST", "/node/v1/remove", json={"ref": ref})

    async def health(self) -> Any:
        return await self.ok("GET", "/node/v1/health")

    async def answered_health(self, timeout: float = 30) -> Any:
        """Health once the engine has answered it. Health waits 1.5 s for the engine
        (its version, once per sync; an unanswered heartbeat) and else says it is silent,
        the cards unknown: on a loaded machine a test of what the cards are waits for
        the engine's word, as a console polls again."""
        deadline = time.monotonic() + timeout
        while not (health := await self.health())["ok"] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return health

    async def logs(self, ref: str, tail: int | None = None) -> str:
        params = {"ref": ref} if tail is None else {"ref": ref, "tail": str(tail)}
        return (await self.ok("GET", "/node/v1/logs", params=params))["logs"]  # type: ignore[no-any-return]

    async def follow(self, ref: str, *, tail: int | None = None, timeout: float = 60) -> str:
        """A followed log, read whole: the stream ends when the job does."""
        params = {"ref": ref, "follow": "1", **({"tail": str(tail)} if tail else {})}
        if self.settle is not None:
            await self.settle()
        async with self.client.get("/node/v1/logs", params=params, headers=HEADERS) as response:
            assert response.status == 200, (response.status, await response.text())
            assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
            return await asyncio.wait_for(response.text(), timeout)
