"""The private-image recheck against a registry stand-in on loopback: a manifest HEAD with
Basic auth, or through a token service (Bearer), as registry API v2 has it. No engine:
a small HTTP server in a thread answers as the registry would."""

from __future__ import annotations

import base64
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tuneplane_node.runtime import registry
from tuneplane_node.runtime.base import RegistryAuth

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


@pytest.fixture
def served() -> Iterator[str]:
    """The stand-in on a free loopback port; its ``host:port``."""
    Registry.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


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
