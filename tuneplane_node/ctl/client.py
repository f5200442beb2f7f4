"""NodeClient: the node's HTTP API as an operator's client sees it.

The standard library's ``http.client``: aiohttp is the daemon's, and a one-shot
command needs no event loop. Every failure becomes one of three errors, each with the
exit code the command ends with::

    CtlError (2: this side cannot even ask: no token, a bad TLS file, a bad URL)
    ├── Refused (1: the node answered 4xx; ``detail`` is its sentence)
    └── Unreachable (3: no answer, a failed TLS handshake, or a 5xx)
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from tuneplane_node.printable import printable
from tuneplane_node.wire import PROTOCOL, PROTOCOL_HEADER

DEFAULT_URL = "http://127.0.0.1:8470"
URL_ENV = "TUNEPLANE_CTL_URL"
TOKEN_ENV = "TUNEPLANE_NODE_TOKEN"
TIMEOUT_S = 30.0
"""Seconds to connect and for each answer (a followed log waits as long as the job runs)."""
CHUNK = 65536
MAX_DETAIL = 2000  # of a non-JSON error page: enough to read, not a whole HTML dump


class CtlError(Exception):
    exit_code = 2


class Refused(CtlError):
    exit_code = 1

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"the node refused ({status}): {detail}")
        self.status = status
        self.detail = detail


class Unreachable(CtlError):
    exit_code = 3


def read_token(token_file: Path | None) -> str:
    """The token: the file's first line that is neither blank nor a # comment, else
    ``TUNEPLANE_NODE_TOKEN``. Never echoed, not even in an error."""
    if token_file is None:
        token = os.environ.get(TOKEN_ENV, "").strip()
        if not token:
            raise CtlError(f"no token: give --token-file or set {TOKEN_ENV}")
        return token
    try:
        lines = token_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise CtlError(f"--token-file {token_file}: cannot read it: {_reason(exc)}") from None
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()
    raise CtlError(f"--token-file {token_file}: holds no token")


@dataclass(frozen=True)
class Tls:
    cacert: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def given(self) -> bool:
        return any((self.cacert, self.cert, self.key))

    def context(self) -> ssl.SSLContext:
        """Verifies the node against ``cacert`` (else the system's CAs); presents
        ``cert``/``key`` for mutual TLS."""
        if self.key is not None and self.cert is None:
            raise CtlError("--key needs --cert")
        try:
            context = ssl.create_default_context(cafile=self.cacert)
            if self.cert is not None:
                context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise CtlError(f"cannot use the TLS files: {_reason(exc)}") from None
        return context


class NodeClient:
    def __init__(self, url: str, *, token: str, tls: Tls = Tls()) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CtlError(f"--url {url}: must be http://host[:port] or https://host[:port]")
        if tls.given() and parts.scheme != "https":
            raise CtlError(f"--url {url}: --cacert, --cert and --key need an https:// URL")
        try:
            self.port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise CtlError(f"--url {url}: bad port") from None
        self.url = url.rstrip("/")
        self.host = parts.hostname
        self.prefix = parts.path.rstrip("/")
        self.context = tls.context() if parts.scheme == "https" else None
        # One request per connection: the node closes it after the answer, and so do we.
        self.headers = {
            "Authorization": f"Bearer {token}",
            PROTOCOL_HEADER: str(PROTOCOL),
            "Connection": "close",
        }

    def get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        with self._exchange("GET", path, query=query) as response:
            return self._answer(response)

    def post(self, path: str, body: Mapping[str, Any]) -> Any:
        with self._exchange("POST", path, body=body) as response:
            return self._answer(response)

    def stream(self, path: str, query: Mapping[str, str]) -> Iterator[bytes]:
        """The answer's bytes as they come, until the node ends it. A JSON answer (a
        node that does not stream) is given whole, as its ``logs`` text."""
        with self._exchange("GET", path, query=query, forever=True) as response:
            if response.status >= 300 or "json" in (response.getheader("Content-Type") or ""):
                yield str(self._answer(response).get("logs", "")).encode()
                return
            while chunk := self._read(response.read1, CHUNK):
                yield chunk

    def _exchange(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        forever: bool = False,
    ) -> http.client.HTTPResponse:
        """Send one request on a connection of its own; with ``forever`` the answer may
        take as long as it takes once its headers have come."""
        connection = self._connection()
        target = self.prefix + path + (f"?{urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode()
        headers = {**self.headers, "Content-Type": "application/json"} if data else self.headers
        try:
            connection.request(method, target, body=data, headers=headers)
            sock = connection.sock
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise Unreachable(f"cannot reach the node at {self.url}: {_reason(exc)}") from None
        if forever and isinstance(sock, socket.socket):
            sock.settimeout(None)
        return response

    def _connection(self) -> http.client.HTTPConnection:
        if self.context is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT_S)
        return http.client.HTTPSConnection(
            self.host, self.port, timeout=TIMEOUT_S, context=self.context
        )

    def _answer(self, response: http.client.HTTPResponse) -> Any:
        raw = self._read(response.read)
        if 200 <= response.status < 300:
            try:
                return json.loads(raw)
            except ValueError:
                raise Unreachable(f"the node at {self.url} answered with no JSON") from None
        detail = _detail(raw)
        if 400 <= response.status < 500:
            raise Refused(response.status, detail)
        raise Unreachable(f"the node at {self.url} failed ({response.status}): {detail}")

    def _read(self, read: Any, *args: int) -> bytes:
        try:
            data: bytes = read(*args)
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable(f"the node at {self.url} broke off: {_reason(exc)}") from None
        return data


def _detail(raw: bytes) -> str:
    """The error's ``detail``; a body that is not the node's JSON, shown as text."""
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = None
    detail = answer.get("detail") if isinstance(answer, dict) else None
    if isinstance(detail, str):
        return printable(detail)  # a registry's or engine's words, onto a terminal
    return printable(raw.decode("utf-8", "replace").strip()[:MAX_DETAIL]) or "(no detail)"


def _reason(exc: BaseException) -> str:
    """An OS or TLS error as a sentence: its strerror and file, not its repr."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: {exc.verify_message}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__
