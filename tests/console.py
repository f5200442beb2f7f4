"""A console stand-in: speaks the node's wire protocol over a real socket."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp.test_utils import TestClient

from tests.engines import IMAGE, unique
from tuneplane_node.runtime.base import container_name
from tuneplane_node.wire import PROTOCOL, PROTOCOL_HEADER

TOKEN = "test-token-0123456789"
HEADERS = {"Authorization": f"Bearer {TOKEN}", PROTOCOL_HEADER: str(PROTOCOL)}


class Console:
    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.app = client.app

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
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
        body = {
            "run_id": run_id,
            "requested_gpus": gpus,
            "container": {
                "name": container_name(run_id),
                "image": image,
                "command": command or ["/bin/sleep", "300"],
                **container,
            },
        }
        status, answer = await self.call("POST", "/node/v1/launch", json=body)
        assert status == expect, (status, answer)
        return container_name(run_id), answer

    async def observe(self, *refs: str) -> dict[str, Any]:
        body = await self.ok("POST", "/node/v1/observe", json={"refs": list(refs)})
        return body["states"]  # type: ignore[no-any-return]

    async def state(self, ref: str) -> dict[str, Any]:
        return (await self.observe(ref))[ref]  # type: ignore[no-any-return]

    async def wait_for(
        self, ref: str, key: str, wanted: Any, timeout: float = 60
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            state = await self.state(ref)
            if state.get(key) == wanted:
                return state
            assert time.monotonic() < deadline, f"{ref}: {key} never became {wanted}: {state}"
            await asyncio.sleep(0.1)

    async def stop(self, ref: str, timeout: float | None = None) -> Any:
        body: dict[str, Any] = {"ref": ref}
        if timeout is not None:
            body["timeout"] = timeout
        return await self.ok("POST", "/node/v1/stop", json=body)

    async def remove(self, ref: str) -> Any:
        return await self.ok("POST", "/node/v1/remove", json={"ref": ref})

    async def health(self) -> dict[str, Any]:
        return await self.ok("GET", "/node/v1/health")  # type: ignore[no-any-return]

    async def logs(self, ref: str, tail: int | None = None) -> str:
        params = {"ref": ref} if tail is None else {"ref": ref, "tail": str(tail)}
        return (await self.ok("GET", "/node/v1/logs", params=params))["logs"]  # type: ignore[no-any-return]
