"""A throttling TCP proxy on loopback, to make a slow or wedged registry in a test.

It forwards to the local registry; the registry-to-client direction is limited to
``rate`` bytes per second and can be paused outright (a stalled pull).
"""

from __future__ import annotations

import asyncio
import contextlib

# engines.sh marks 127.0.0.1:5001-5009 as insecure registries for podman.
PROXY_PORTS = range(5001, 5010)


class ThrottlingProxy:
    def __init__(self, *, upstream_port: int = 5000, rate: int = 200_000) -> None:
        self.upstream_port = upstream_port
        self.rate = rate
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.connections = 0
        self.open_connections = 0
        self.bytes_sent = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
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

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
            await asyncio.gather(
                self._pump(reader, up_writer, throttle=False),
                self._pump(up_reader, writer, throttle=True),
            )
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self.open_connections -= 1
            self._tasks.discard(task)
            writer.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, throttle: bool
    ) -> None:
        chunk_size = max(1024, self.rate // 20) if throttle else 65536
        try:
            while data := await reader.read(chunk_size):
                if throttle:
                    await self.flowing.wait()
                    await asyncio.sleep(len(data) / self.rate)
                    self.bytes_sent += len(data)
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()
