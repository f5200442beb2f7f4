"""A slow, stalled or wedged peer: a throttling proxy in front of the registry, and a
unix socket in front of an engine's that can wedge it."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from tests.support.images import forget_image
from tuneplane_node.runtime.base import ContainerRuntime

PROXY_PORTS = range(5001, 5010)  # engines.sh marks these as insecure registries for podman


class _Relay:
    """Copies bytes between a client and an upstream; ``pause`` stops the flow back to the
    client (connections stay open and nothing answers), ``resume`` restarts it."""

    rate = 0  # bytes per second back to the client; 0 is unthrottled

    def __init__(self) -> None:
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.connections = 0
        self.open_connections = 0
        self.bytes_sent = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def pause(self) -> None:
        self.flowing.clear()

    def resume(self) -> None:
        self.flowing.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        raise NotImplementedError

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await self._upstream()
            await asyncio.gather(
                self._pump(reader, up_writer, back=False),
                self._pump(up_reader, writer, back=True),
            )
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self.open_connections -= 1
            self._tasks.discard(task)
            writer.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, back: bool
    ) -> None:
        throttle = back and self.rate > 0
        chunk_size = max(1024, self.rate // 20) if throttle else 65536
        try:
            while data := await reader.read(chunk_size):
                if back:
                    await self.flowing.wait()
                    self.bytes_sent += len(data)
                if throttle:
                    await asyncio.sleep(len(data) / self.rate)
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()


class ThrottlingProxy(_Relay):
    """A TCP proxy on loopback in front of the local registry, which sends registry bytes
    back at ``rate`` bytes per second and can stall outright (``pause``)."""

    def __init__(self, *, upstream_port: int = 5000, rate: int = 200_000) -> None:
        super().__init__()
        self.upstream_port = upstream_port
        self.rate = rate
        self.port = 0

    async def start(self) -> ThrottlingProxy:
        for port in PROXY_PORTS:
            with contextlib.suppress(OSError):
                self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
                self.port = port
                return self
        raise RuntimeError("no free proxy port in 5001-5009")

    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def big_image(self, runtime: ContainerRuntime, *, rate: int) -> str:
        """The registry's big image reached through this proxy at ``rate`` bytes a
        second, removed from ``runtime`` first so that a launch or a pull downloads it."""
        self.rate = rate
        image = f"{self.address()}/tuneplane-test/big:1"
        await forget_image(runtime, image)
        return image

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.upstream_port)


class WedgeProxy(_Relay):
    """A unix socket in front of an engine's; ``pause`` wedges the engine (connections are
    accepted and never answered)."""

    def __init__(self, path: Path, upstream: Path) -> None:
        super().__init__()
        self.path = path
        self.upstream = upstream

    async def start(self) -> WedgeProxy:
        self._server = await asyncio.start_unix_server(self._serve, str(self.path))
        return self

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(str(self.upstream))
