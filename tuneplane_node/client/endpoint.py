"""Where and how to reach a node: its URL, the headers every call sends (the bearer
token and the protocol header), TLS, and the one place httpx's errors become ours
(`unreachable`), as httpx itself maps httpcore's in one place."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from tuneplane_node.client.errors import ConfigError, Unreachable, refusal

PROTOCOL = 1
"""The wire protocol this client speaks (the node's `tuneplane_node.wire.PROTOCOL`)."""
PROTOCOL_HEADER = "X-TunePlane-Node-Protocol"
TIMEOUT_S = 30.0
"""Seconds to connect and for each answer, unless a call says otherwise (a blocking
query waits its ``wait`` more; a followed log as long as the job runs)."""


@dataclass(frozen=True)
class Tls:
    """``cacert``: the CA that signed the node's certificate (else the system's CAs);
    ``cert`` and ``key``: this client's, for a node that asks for one (mutual TLS)."""

    cacert: Path | str | None = None
    cert: Path | str | None = None
    key: Path | str | None = None

    def given(self) -> bool:
        return any((self.cacert, self.cert, self.key))

    def context(self) -> ssl.SSLContext:
        if not self.given():
            return system_context()
        if self.key is not None and self.cert is None:
            raise ConfigError("a TLS key needs its certificate (cert)")
        try:
            context = ssl.create_default_context(cafile=self.cacert)
            if self.cert is not None:
                context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot use the TLS files: {reason(exc)}") from exc
        return context


NO_TLS = Tls()


@functools.cache
def system_context() -> ssl.SSLContext:
    """The system's CAs, loaded once for every client of the process. A context per
    client read a bundle again each time, 40 ms and 830 KiB per node a console talks to
    (bench/clients.py), and httpx makes one even for an http:// URL unless given one.
    Shared safely while no client speaks HTTP/2: httpcore sets the context's ALPN on each
    connection, to the same ``http/1.1`` for every client."""
    return ssl.create_default_context()


class Endpoint:
    """A node's base URL and what every request to it carries."""

    def __init__(self, url: str, *, token: str, tls: Tls = Tls()) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"{url}: must be http://host[:port] or https://host[:port]")
        if tls.given() and parts.scheme != "https":
            raise ConfigError(f"{url}: a CA, certificate or key need an https:// URL")
        try:
            parts.port  # noqa: B018 (reading it is the check)
        except ValueError:
            raise ConfigError(f"{url}: bad port") from None
        if not token or any(c in token for c in "\r\n"):
            raise ConfigError("the token must be one non-empty line")
        self.url = url.rstrip("/")
        self.verify = tls.context() if parts.scheme == "https" else system_context()
        self.headers = {
            "Authorization": f"Bearer {token}",
            PROTOCOL_HEADER: str(PROTOCOL),
            "User-Agent": f"tuneplane-node-sdk (protocol {PROTOCOL})",
        }

    def __repr__(self) -> str:  # never the token
        return f"Endpoint({self.url!r})"

    def options(self, timeout: float) -> dict[str, Any]:
        """httpx.Client's and httpx.AsyncClient's arguments."""
        return {
            "base_url": self.url,
            "headers": self.headers,
            "verify": self.verify,
            "timeout": timeout,
            "follow_redirects": False,  # a redirect would carry the token elsewhere
        }

    def answer(self, status: int, raw: bytes) -> Any:
        """A 2xx answer's JSON; else the node's refusal, raised."""
        if 200 <= status < 300:
            try:
                return json.loads(raw)
            except ValueError:
                raise Unreachable(f"the node at {self.url} answered with no JSON") from None
        raise refusal(status, raw, url=self.url)

    @contextlib.contextmanager
    def unreachable(self) -> Iterator[None]:
        """httpx's failures as `Unreachable`, with the cause chained."""
        try:
            yield
        except httpx.TimeoutException as exc:
            raise Unreachable(f"the node at {self.url} did not answer in time") from exc
        except httpx.ConnectError as exc:
            raise Unreachable(f"cannot reach the node at {self.url}: {reason(exc)}") from exc
        except httpx.RemoteProtocolError as exc:  # closed with no answer, or not HTTP's
            parts = urlsplit(self.url)
            if parts.scheme == "http" and speaks_tls(parts.hostname or "", parts.port or 80):
                https = parts._replace(scheme="https").geturl()
                raise Unreachable(
                    f"the node at {self.url} speaks TLS: call {https} (with its CA: "
                    "--cacert, Tls(cacert=...))"
                ) from exc
            raise Unreachable(f"the node at {self.url} broke off: {reason(exc)}") from exc
        except httpx.HTTPError as exc:  # a read or write broken off
            raise Unreachable(f"the node at {self.url} broke off: {reason(exc)}") from exc


PROBE_S = 2.0
"""How long the TLS probe may take, connecting and shaking hands (a node answers a
handshake in milliseconds)."""


def speaks_tls(host: str, port: int) -> bool:
    """Whether ``host:port`` completes a TLS handshake, or answers one with a TLS alert
    (a node asking for a client certificate): asked only when a plain ``http://`` call
    was closed without an answer, which is what a TLS node does to one. Blocking, for
    at most `PROBE_S`, on that failure alone (the async client's too)."""
    context = ssl.create_default_context()  # who answers, not trust: nothing is sent
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, port), timeout=PROBE_S) as raw,
            context.wrap_socket(raw, server_hostname=host or None),
        ):
            return True
    except ssl.SSLError as exc:
        return "ALERT" in (exc.reason or "")  # TLS's own refusal; not "wrong version"
    except OSError:
        return False


def reason(exc: BaseException) -> str:
    """An error as a sentence: the OS's or TLS's words from deepest in its chain."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return f"TLS: {seen.verify_message}"
        if isinstance(seen, OSError) and (seen.errno or seen.strerror):
            # asyncio's own words ("Connect call failed (...)") say less than the errno's
            said = os.strerror(seen.errno) if seen.errno else str(seen.strerror)
            return f"{said}: {seen.filename}" if seen.filename else said
        seen = seen.__cause__ or seen.__context__
    return str(exc) or type(exc).__name__
