"""The private-image recheck against a registry stand-in on loopback: a manifest HEAD with
Basic auth, or through a token service (Bearer), as registry API v2 has it. No engine:
a small HTTP server in a thread answers as the registry would."""

from __future__ import annotations

import base64
import json
import platform
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tuneplane_node.fetch import registry
from tuneplane_node.wire.values import RegistryAuth

# Slow: an HTTP registry stand-in on loopback, with its token service.
pytestmark = pytest.mark.slow

USER, PASSWORD, TOKEN = "ci", "right-password", "refresh-token"
PATH = "/v2/team/trainer/manifests/1"


class Registry(BaseHTTPRequestHandler):
    scheme = "Basic"  # the challenge this stand-in answers with
    seen: list[tuple[str, str]] = []  # (method, path) of every request

    def log_message(self, *args: Any) -> None:  # quiet: pytest shows stderr
        return

    def _basic_ok(self) -> bool:
        expected = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        return self.headers.get("Authorization") == f"Basic {expected}"

    def _bearer_ok(self) -> bool:
        return self.headers.get("Authorization") == "Bearer pull-ok"

    def _answer(self, status: int, headers: dict[str, str], body: bytes = b"") -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self.seen.append(("HEAD", self.path))
        if self.path != PATH:
            self._answer(404, {})
        elif self._basic_ok() if self.scheme == "Basic" else self._bearer_ok():
            self._answer(200, {})
        else:
            host = f"http://{self.headers['Host']}"
            challenge = (
                'Basic realm="test"'
                if self.scheme == "Basic"
                else f'Bearer realm="{host}/token",service="test"'
            )
            self._answer(401, {"WWW-Authenticate": challenge})

    def do_GET(self) -> None:  # the token service, user and password as Basic
        self.seen.append(("GET", self.path))
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
        if query.get("scope") == ["repository:team/trainer:pull"] and self._basic_ok():
            self._answer(200, {}, json.dumps({"token": "pull-ok"}).encode())
        else:
            self._answer(401, {})

    def do_POST(self) -> None:  # the token service, an identity token as a refresh token
        self.seen.append(("POST", self.path))
        length = int(self.headers.get("Content-Length", 0))
        form = urllib.parse.parse_qs(self.rfile.read(length).decode())
        if form.get("grant_type") == ["refresh_token"] and form.get("refresh_token") == [TOKEN]:
            self._answer(200, {}, json.dumps({"access_token": "pull-ok"}).encode())
        else:
            self._answer(401, {})


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A stand-in registry on a free loopback port; its ``host:port``. (bench/registry.py
    serves `Manifests` with it too.)"""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def served() -> Iterator[str]:
    Registry.seen = []
    with serving(Registry) as host:
        yield host


@pytest.mark.parametrize("scheme", ["Basic", "Bearer"])
def test_the_registry_accepts_the_right_password_and_refuses_a_wrong_one(
    served: str, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Registry, "scheme", scheme)
    image = f"{served}/team/trainer:1"
    assert registry.accepts(image, RegistryAuth(USER, PASSWORD), timeout=5)
    assert not registry.accepts(image, RegistryAuth(USER, "wrong"), timeout=5)
    assert not registry.accepts(f"{served}/team/other:1", RegistryAuth(USER, PASSWORD), timeout=5)
    assert all(method != "GET" or "/token" in path for method, path in Registry.seen)
    assert ("HEAD", PATH) in Registry.seen  # a manifest HEAD: nothing is downloaded


def test_an_identity_token_is_a_refresh_token_at_the_token_service(
    served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Registry, "scheme", "Bearer")
    image = f"{served}/team/trainer:1"
    assert registry.accepts(image, RegistryAuth(identity_token=TOKEN), timeout=5)
    assert not registry.accepts(image, RegistryAuth(identity_token="stale"), timeout=5)


def test_a_registry_that_does_not_answer_is_unreachable_not_a_no() -> None:
    with pytest.raises(registry.RegistryUnreachable, match=r"127\.0\.0\.1:9"):
        registry.accepts("127.0.0.1:9/team/trainer:1", RegistryAuth(USER, PASSWORD), timeout=2)


# --- the size of a pull (the image GC's pull gate, issue 21) --------------------------------

ARCH = registry.ARCHITECTURES.get(platform.machine(), platform.machine())
INDEX = {
    "schemaVersion": 2,
    "mediaType": "application/vnd.oci.image.index.v1+json",
    "manifests": [
        {"digest": "sha256:other", "platform": {"os": "linux", "architecture": "s390x-not"}},
        {"digest": "sha256:ours", "platform": {"os": "linux", "architecture": ARCH}},
    ],
}
MANIFEST = {
    "schemaVersion": 2,
    "config": {"size": 1000},
    "layers": [{"size": 7_000_000}, {"size": 2_461_458}],
}


class Manifests(BaseHTTPRequestHandler):
    """A registry holding team/big:1 as an index, behind a token service that gives
    anonymous pulls a token, and its manifest for this platform by digest."""

    seen: list[str] = []

    def log_message(self, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self.seen.append(self.path)
        if self.path.startswith("/token"):
            body = json.dumps({"token": "anonymous-pull"}).encode()
            return self._answer(200, body)
        if self.headers.get("Authorization") != "Bearer anonymous-pull":
            host = f"http://{self.headers['Host']}"
            challenge = f'Bearer realm="{host}/token",service="test"'
            return self._answer(401, b"", {"WWW-Authenticate": challenge})
        documents = {
            "/v2/team/big/manifests/1": INDEX,
            "/v2/team/big/manifests/sha256:ours": MANIFEST,
            "/v2/team/flat/manifests/1": MANIFEST,
        }
        document = documents.get(self.path)
        if document is None:
            return self._answer(404, b"")
        return self._answer(200, json.dumps(document).encode())

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def manifests() -> Iterator[str]:
    Manifests.seen = []
    with serving(Manifests) as host:
        yield host


def test_a_pulls_size_is_its_platforms_layers_and_config_and_no_blob_is_asked_for(
    manifests: str,
) -> None:
    size = registry.compressed_size(f"{manifests}/team/big:1", None, timeout=5)
    assert size == 1000 + 7_000_000 + 2_461_458
    assert "/v2/team/big/manifests/sha256:ours" in Manifests.seen
    assert not [path for path in Manifests.seen if "/blobs/" in path]
    assert registry.compressed_size(f"{manifests}/team/flat:1", None, timeout=5) == size


def test_a_registry_that_does_not_say_sizes_nothing(manifests: str) -> None:
    assert registry.compressed_size(f"{manifests}/team/none:1", None, timeout=5) is None
    assert registry.compressed_size("127.0.0.1:9/team/big:1", None, timeout=2) is None


def test_checks_share_one_tls_context_across_requests_and_threads(
    manifests: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each https request built a context before, loading the CA bundle (50 ms of CPU)
    for each of a check's requests (bench/registry.py)."""
    built: list[ssl.SSLContext] = []
    create = ssl.create_default_context

    def counted() -> ssl.SSLContext:
        built.append(create())
        return built[-1]

    def size(_: int) -> int | None:
        return registry.compressed_size(f"{manifests}/team/big:1", None, timeout=5)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    registry._loaded_tls.cache_clear()
    try:
        with ThreadPoolExecutor(4) as pool:
            sizes = list(pool.map(size, range(8)))
    finally:
        registry._loaded_tls.cache_clear()
    assert sizes == [1000 + 7_000_000 + 2_461_458] * 8
    assert len(built) == 1
