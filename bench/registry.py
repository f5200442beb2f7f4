"""registry: what one credentials or size check of an image costs the node, against the
standard library's own per request.

Before it pulls an image with credentials, the node asks the registry whether they are
accepted (`registry.accepts`), and before a pull it asks how many bytes it will download
(`registry.compressed_size`, the image GC's pull gate). Each is one to three requests,
https first. The node's variant uses its shared TLS context (`registry.system_tls`); the
peer builds one per request, which is what `urllib.request.urlopen` does without a
context and what the node did before. A stand-in registry on loopback answers plain
http behind a Bearer token service, so every check also makes the https attempt that
loopback registries fall back from. No engine, no daemon.
"""

from __future__ import annotations

import argparse
import json
import platform
import ssl
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import harness  # noqa: F401  (it puts the checkout on sys.path)

from tuneplane_node.runtime import registry

MANIFEST = json.dumps({"config": {"size": 1000}, "layers": [{"size": 7_000_000}]}).encode()


class Registry(BaseHTTPRequestHandler):
    """team/big:1 behind a token service that gives anonymous pulls a token."""

    def log_message(self, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        if self.path.startswith("/token"):
            return self._answer(200, json.dumps({"token": "t"}).encode())
        if self.headers.get("Authorization") != "Bearer t":
            realm = f'Bearer realm="http://{self.headers["Host"]}/token",service="bench"'
            return self._answer(401, b"", {"WWW-Authenticate": realm})
        return self._answer(200, MANIFEST)

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@contextmanager
def served() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def measured(check: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of one check."""
    walls, cpus = [], []
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        check()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="checks per variant")
    args = parser.parse_args()
    print(f"machine: python {platform.python_version()}, {ssl.OPENSSL_VERSION}")
    shared = registry.system_tls
    with served() as host:
        image = f"{host}/team/big:1"

        def check() -> int | None:
            return registry.compressed_size(image, None, timeout=5)

        assert check() == 7_001_000
        for variant in ("node", "peer", "node"):  # the node twice: noise shows
            use = shared if variant == "node" else ssl.create_default_context
            registry.system_tls = use  # the peer: a context per request
            wall, cpu = measured(check, args.rounds)
            print(f"{variant}: {wall:6.2f} ms a size check, {cpu:6.2f} ms of CPU")
    registry.system_tls = shared


if __name__ == "__main__":
    main()
