"""OciRegistry: a volume's OCI reference resolved to its manifest, and its layer blobs
opened for the fills (the distribution API v2), on the event loop.

The node speaks to the registry itself, through the fills' `Fetcher`, rather than asking
the engine (docker 20.10 has no image volumes): one path for every engine. A reference
resolves to the sha256 of the manifest document it names (an index too: the console pins
what it names), checked against the bytes; an index is followed to this machine's
``linux`` manifest, or refused. Every answer is bounded (`MAX_MANIFEST_BYTES`).

A registry that wants credentials answers 401 with a challenge: ``Basic`` takes the user
and password on the next request; ``Bearer`` sends the node to its token service (the
user and password as Basic there, or an identity token as an OAuth2 refresh token, as
docker asks), whose token is kept until it expires for the registry, the repository and
the credential that got it (a salted fingerprint; anonymous is a credential of its own):
a request is sent only what its own credentials earned, never another tenant's login.
The scheme is https; plain http only for the ``host:port`` the operator listed
(``TUNEPLANE_VOLUME_INSECURE_HOSTS``), a token service's too. Every request goes
through the caller's `Session` (its reach, no shared connection or cookie). No secret
reaches an error: they say the status, never a header.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import platform
import re
import secrets
import time
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from tuneplane_node.errors import VolumeFillFailed
from tuneplane_node.fetch.fetching import Answer, Download, Fetcher, Session
from tuneplane_node.fetch.registry import ARCHITECTURES, DOCKER_HUB_HOST
from tuneplane_node.references import DOCKER_HUB, ImageName
from tuneplane_node.wire.values import RegistryAuth

log = logging.getLogger(__name__)
MAX_MANIFEST_BYTES = 4 * 2**20  # registries refuse manifests past 4 MiB
MAX_TOKEN_BYTES = 2**20
TOKEN_S = 60.0  # a token whose service gave no lifetime: the spec's default
INDEXES = frozenset({
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
})  # fmt: skip
MANIFESTS = frozenset({
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
})  # fmt: skip
ACCEPT = ", ".join(sorted(INDEXES | MANIFESTS))
CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
DIGEST = re.compile(r"sha256:([0-9a-f]{64})")


def is_oci(source: str) -> bool:
    """Whether a volume's source is a registry reference (else a URL)."""
    return "://" not in source


def by_digest(source: str, digest: str) -> str:
    """``registry/repo@sha256:<digest>``: the reference of exactly that content."""
    return f"{ImageName.parse(source).repository}@sha256:{digest}"


@dataclass(frozen=True)
class Layer:
    digest: str  # hex
    size: int
    media_type: str


@dataclass(frozen=True)
class Manifest:
    """The layers of what a reference names, for this machine, bottom first."""

    layers: tuple[Layer, ...]

    @property
    def size(self) -> int:
        return sum(layer.size for layer in self.layers)


@dataclass
class _Token:
    header: str
    until: float


class OciRegistry:
    """The registries of the volume store's fills, asked through the fetcher's rules
    (its reach, the hosts asked over plain http)."""

    def __init__(self, fetcher: Fetcher) -> None:
        self.fetcher = fetcher
        # (registry, repository, credential) -> its Authorization header; the salt is
        # the process's: nothing of a credential is kept past it.
        self._tokens: dict[tuple[str, str], _Token] = {}
        self._salt = secrets.token_bytes(32)

    def url(self, name: ImageName, tail: str) -> str:
        host = DOCKER_HUB_HOST if name.registry == DOCKER_HUB else name.registry
        hostname, _, port = host.partition(":")
        insecure = self.fetcher.insecure_host(hostname, int(port) if port else None)
        return f"{'http' if insecure else 'https'}://{host}/v2/{name.path}/{tail}"

    def _key(self, name: ImageName, auth: RegistryAuth | None) -> tuple[str, str]:
        """The token's owner: the repository (its registry in it) and the credential."""
        return name.repository, "" if auth is None else auth.fingerprint(self._salt)

    async def resolve(self, http: Session, source: str, auth: RegistryAuth | None) -> str:
        """The sha256 (hex) of the manifest document ``source`` names."""
        name = ImageName.parse(source)
        return _hex(await self._document(http, source, name, name.reference, auth))

    async def manifest(self, http: Session, source: str, auth: RegistryAuth | None) -> Manifest:
        """The layers ``source`` names (by digest: checked), this machine's where it
        names an index."""
        name = ImageName.parse(source)
        body = await self._document(http, source, name, name.reference, auth)
        document = _parsed(source, body)
        if document.get("mediaType") in INDEXES or "manifests" in document:
            chosen = _platform(source, document)
            document = _parsed(source, await self._document(http, source, name, chosen, auth))
        return _layers(source, document)

    def blob(
        self, http: Session, source: str, layer: Layer, auth: RegistryAuth | None, *, offset: int
    ) -> AbstractAsyncContextManager[Download]:
        """The layer's blob from ``offset``, with the token these credentials hold."""
        name = ImageName.parse(source)
        url = self.url(name, f"blobs/sha256:{layer.digest}")
        return http.open(url, offset=offset, headers=self._held(name, auth))

    async def authorize(self, http: Session, source: str, auth: RegistryAuth | None) -> None:
        """A fresh token for ``source``'s repository and these credentials when the kept
        one expired: a big fill outlives a registry's 5-minute tokens."""
        name = ImageName.parse(source)
        token = self._tokens.get(self._key(name, auth))
        if token is not None and token.until <= time.monotonic():
            await self._document(http, source, name, name.reference, auth)

    def _held(self, name: ImageName, auth: RegistryAuth | None) -> dict[str, str]:
        """The Authorization header these credentials got for the repository, if it is
        still good: another credential's (an anonymous request's none) never."""
        key = self._key(name, auth)
        token = self._tokens.get(key)
        if token is not None and token.until <= time.monotonic():
            del self._tokens[key]
            token = None
        return {"Authorization": token.header} if token is not None else {}

    async def _document(
        self,
        http: Session,
        source: str,
        name: ImageName,
        reference: str,
        auth: RegistryAuth | None,
    ) -> bytes:
        """The manifest (or index) document of ``reference``, its digest checked when
        the reference is one; through the registry's challenge."""
        url = self.url(name, f"manifests/{reference}")
        headers = {"Accept": ACCEPT, **self._held(name, auth)}
        answer = await http.request("GET", url, headers=headers, limit=MAX_MANIFEST_BYTES)
        if answer.status == 401:
            header = await self._challenged(http, source, name, answer, auth)
            headers = {"Accept": ACCEPT, "Authorization": header}
            answer = await http.request("GET", url, headers=headers, limit=MAX_MANIFEST_BYTES)
        if answer.status != 200:
            raise _refused(source, answer.status, auth)
        found = DIGEST.fullmatch(reference)
        if found is not None and _hex(answer.body) != found[1]:
            raise VolumeFillFailed(
                source=source, reason=f"the registry's manifest is not {reference}"
            )
        return answer.body

    async def _challenged(
        self,
        http: Session,
        source: str,
        name: ImageName,
        answer: Answer,
        auth: RegistryAuth | None,
    ) -> str:
        """The Authorization header the challenge asks for, kept for the repository and
        these credentials."""
        scheme, _, rest = answer.headers.get("WWW-Authenticate", "").partition(" ")
        params = dict(CHALLENGE.findall(rest))
        if scheme.lower() == "basic" and auth is not None and auth.username:
            header, lifetime = _basic(auth), float("inf")
        elif scheme.lower() == "bearer" and "realm" in params:
            header, lifetime = await self._token(http, source, name, params, auth)
        else:
            raise _refused(source, 401, auth)
        self._tokens[self._key(name, auth)] = _Token(header, time.monotonic() + lifetime)
        return header

    async def _token(
        self,
        http: Session,
        source: str,
        name: ImageName,
        params: Mapping[str, str],
        auth: RegistryAuth | None,
    ) -> tuple[str, float]:
        """A pull token of the registry's token service, and its lifetime."""
        realm = params["realm"]
        parts = urlsplit(realm)
        if parts.scheme != "https" and not (
            parts.scheme == "http" and self.fetcher.insecure_host(parts.hostname or "", parts.port)
        ):
            raise VolumeFillFailed(
                source=source, reason="its token service is not https, nor an insecure host"
            )
        query = {"service": params.get("service", ""), "scope": f"repository:{name.path}:pull"}
        answer = await self._asked(http, realm, query, auth)
        if answer.status != 200:
            raise _refused(source, answer.status, auth)
        try:
            found = json.loads(answer.body)
            token = str(found.get("token") or found.get("access_token") or "")
            lifetime = float(found.get("expires_in") or TOKEN_S)
        except (ValueError, AttributeError, TypeError):
            token, lifetime = "", 0.0
        if not token:
            raise VolumeFillFailed(source=source, reason="its token service gave no token")
        return f"Bearer {token}", max(0.0, lifetime - 10)  # renewed before it lapses

    @staticmethod
    async def _asked(
        http: Session, realm: str, query: Mapping[str, str], auth: RegistryAuth | None
    ) -> Answer:
        """The token service's answer: a refresh-token grant for an identity token (as
        docker asks), else a GET with the user and password as Basic, or anonymous."""
        if auth is not None and auth.identity_token:
            form = {**query, "grant_type": "refresh_token", "client_id": "tuneplane-node"}
            form["refresh_token"] = auth.identity_token
            return await http.request("POST", realm, headers={}, limit=MAX_TOKEN_BYTES, form=form)
        basic = auth is not None and auth.username
        headers = {"Authorization": _basic(auth)} if auth is not None and basic else {}
        url = f"{realm}?{urlencode(query)}"
        return await http.request("GET", url, headers=headers, limit=MAX_TOKEN_BYTES)


def _hex(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _refused(source: str, status: int, auth: RegistryAuth | None) -> VolumeFillFailed:
    if status in (401, 403):
        said = "without credentials" if auth is None else f"with the {auth.source} credentials"
        reason = f"the registry refused it {said} ({status})"
    elif status == 404:
        reason = "the registry has no such manifest (404)"
    else:
        reason = f"the registry answered {status}"
    return VolumeFillFailed(source=source, reason=reason, retryable=status >= 500)


def _basic(auth: RegistryAuth) -> str:
    pair = f"{auth.username}:{auth.password}".encode()
    return f"Basic {base64.b64encode(pair).decode('ascii')}"


def _parsed(source: str, body: bytes) -> dict[str, Any]:
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise VolumeFillFailed(source=source, reason="its manifest is not a JSON object")
    return document


def _platform(source: str, index: Mapping[str, Any]) -> str:
    """The digest of the index's manifest for this machine (linux, its architecture)."""
    arch = ARCHITECTURES.get(platform.machine(), platform.machine())
    for entry in index.get("manifests") or ():
        if not isinstance(entry, dict) or not isinstance(entry.get("platform"), dict):
            continue
        wanted, digest = entry["platform"], str(entry.get("digest") or "")
        mine = wanted.get("os") == "linux" and wanted.get("architecture") == arch
        if mine and DIGEST.fullmatch(digest):
            return digest
    raise VolumeFillFailed(source=source, reason=f"its index names no manifest for linux/{arch}")


def _layers(source: str, document: Mapping[str, Any]) -> Manifest:
    kind = document.get("mediaType")
    if kind is not None and kind not in MANIFESTS:
        raise VolumeFillFailed(source=source, reason=f"a manifest of type {kind} is not served")
    layers = document.get("layers")
    if not isinstance(layers, list):
        raise VolumeFillFailed(source=source, reason="its manifest lists no layers")
    found: list[Layer] = []
    for layer in layers:
        digest = DIGEST.fullmatch(str(layer.get("digest", ""))) if isinstance(layer, dict) else None
        size = layer.get("size") if isinstance(layer, dict) else None
        if digest is None or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise VolumeFillFailed(source=source, reason="a layer without a sha256 and size")
        found.append(Layer(digest[1], size, str(layer.get("mediaType", ""))))
    return Manifest(tuple(found))
