"""What a registry says of an image, asked as the engines would (registry API v2): whether
it accepts credentials for it (a HEAD of its manifest), and how many bytes a pull of it
downloads (its manifest's layer sizes, for this machine's platform). Requests, never a
blob download.

A registry that wants credentials answers 401 with a challenge: ``Basic`` takes the user
and password on the next request; ``Bearer`` sends the node to its token service (the
user and password as Basic there, or an identity token as a refresh token, as docker
does), whose token the next request carries. Standard library only, blocking: callers
run it off the loop.

The scheme is https; a registry on a loopback address that does not speak TLS is asked
over plain http, which is what both engines allow by default for loopback.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import platform
import re
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from tuneplane_node.references import DOCKER_HUB, ImageName
from tuneplane_node.wire.values import RegistryAuth

log = logging.getLogger(__name__)
TIMEOUT_S = 10.0
DOCKER_HUB_HOST = "registry-1.docker.io"
LOOPBACK = ("127.", "localhost", "[::1]")
MANIFESTS = ", ".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))  # fmt: skip
CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
MAX_MANIFEST_BYTES = 4 * 2**20  # registries refuse manifests past 4 MiB
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386"}


_TLS_LOCK = threading.Lock()


def system_tls() -> ssl.SSLContext:
    """The system's CAs, loaded once per process: building a context reads the whole
    bundle (40 ms of CPU on the development machine), and each document a check reads
    takes up to three requests (the challenge, the token, the document). One context
    serves every pool thread at once, as OpenSSL allows; a CA added to the system needs
    a restart, as it does for the engines' own pulls."""
    with _TLS_LOCK:  # the first checks can come at once, from several pool threads
        return _loaded_tls()


@functools.cache
def _loaded_tls() -> ssl.SSLContext:
    return ssl.create_default_context()


class RegistryUnreachable(OSError):
    """The registry gave no answer: nothing is known of the credentials."""


def accepts(image: str, auth: RegistryAuth, *, timeout: float = TIMEOUT_S) -> bool:
    """Whether the registry of ``image`` serves its manifest to these credentials.
    False for 401, 403 and 404 alike (registries blur them on purpose);
    `RegistryUnreachable` when it does not answer."""
    name = ImageName.parse(image)
    host = DOCKER_HUB_HOST if name.registry == DOCKER_HUB else name.registry
    path = f"/v2/{name.path}/manifests/{name.reference}"
    try:
        return _request("HEAD", f"https://{host}{path}", name, auth, timeout)[0] == 200
    except (ssl.SSLError, urllib.error.URLError, ConnectionError) as exc:
        if not host.startswith(LOOPBACK):
            raise RegistryUnreachable(f"{host}: {_why(exc)}") from None
    try:
        return _request("HEAD", f"http://{host}{path}", name, auth, timeout)[0] == 200
    except (urllib.error.URLError, ConnectionError) as exc:
        raise RegistryUnreachable(f"{host}: {_why(exc)}") from None


def compressed_size(
    image: str, auth: RegistryAuth | None, *, timeout: float = TIMEOUT_S
) -> int | None:
    """The bytes a pull of ``image`` downloads: its config and layers as the manifest
    states them, the one for this platform when it names an index. None when the
    registry does not say (unreachable, refused, a manifest of another kind)."""
    name = ImageName.parse(image)
    try:
        manifest = _manifest(name, name.reference, auth, timeout)
        if manifest is not None and "manifests" in manifest:
            digest = _platform_digest(manifest)
            manifest = _manifest(name, digest, auth, timeout) if digest else None
    except (OSError, ValueError) as exc:
        log.info("the registry of %s gave no size (%s): the pull is not sized", image, exc)
        return None
    if manifest is None or not isinstance(manifest.get("layers"), list):
        return None
    blobs = [*manifest["layers"], manifest.get("config") or {}]
    return sum(int(blob.get("size") or 0) for blob in blobs if isinstance(blob, dict))


def _manifest(
    name: ImageName, reference: str, auth: RegistryAuth | None, timeout: float
) -> dict[str, Any] | None:
    """The manifest document (GET), or None when the registry refuses it."""
    path = f"/v2/{name.path}/manifests/{reference}"
    host = DOCKER_HUB_HOST if name.registry == DOCKER_HUB else name.registry
    try:
        status, body = _request("GET", f"https://{host}{path}", name, auth, timeout)
    except (ssl.SSLError, urllib.error.URLError, ConnectionError):
        if not host.startswith(LOOPBACK):
            raise
        status, body = _request("GET", f"http://{host}{path}", name, auth, timeout)
    if status != 200:
        return None
    document = json.loads(body)
    return document if isinstance(document, dict) else None


def _request(
    method: str, url: str, name: ImageName, auth: RegistryAuth | None, timeout: float
) -> tuple[int, bytes]:
    """The status and body of a request for a manifest, through the registry's
    challenge: Basic takes the user and password, Bearer a token of its service."""
    status, challenge, body = _fetch(method, url, {}, timeout)
    if status != 401 or not challenge:
        return status, body
    scheme, _, rest = challenge.partition(" ")
    params = dict(CHALLENGE.findall(rest))
    if scheme.lower() == "basic" and auth is not None and auth.username:
        status, _, body = _fetch(method, url, {"Authorization": _basic(auth)}, timeout)
    elif scheme.lower() == "bearer" and "realm" in params:
        token = _token(params, name, auth, timeout)
        if token is None:
            return 401, b""
        status, _, body = _fetch(method, url, {"Authorization": f"Bearer {token}"}, timeout)
    return status, body


def _fetch(
    method: str, url: str, headers: Mapping[str, str], timeout: float
) -> tuple[int, str, bytes]:
    """The status, the challenge of a 401, and the body (a manifest at most)."""
    request = urllib.request.Request(url, method=method, headers={"Accept": MANIFESTS, **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=system_tls()) as response:
            return response.status, "", response.read(MAX_MANIFEST_BYTES)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("WWW-Authenticate", "") if exc.headers else "", b""


def _platform_digest(index: Mapping[str, Any]) -> str | None:
    """The digest of the index's manifest for this machine (linux, its architecture)."""
    arch = ARCHITECTURES.get(platform.machine(), platform.machine())
    for entry in index.get("manifests") or ():
        wanted = entry.get("platform") or {}
        if wanted.get("os") == "linux" and wanted.get("architecture") == arch:
            return str(entry.get("digest") or "") or None
    return None


def _why(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc) or type(exc).__name__


def _basic(auth: RegistryAuth) -> str:
    pair = f"{auth.username}:{auth.password}".encode()
    return f"Basic {base64.b64encode(pair).decode('ascii')}"


def _token(
    params: Mapping[str, str], name: ImageName, auth: RegistryAuth | None, timeout: float
) -> str | None:
    """A pull token from the registry's token service (anonymous without credentials);
    None when it refuses."""
    query = {"service": params.get("service", ""), "scope": f"repository:{name.path}:pull"}
    if auth is None:
        request = urllib.request.Request(f"{params['realm']}?{urllib.parse.urlencode(query)}")
    elif auth.identity_token:  # docker's OAuth2 refresh-token grant
        form = {**query, "grant_type": "refresh_token", "refresh_token": auth.identity_token}
        form["client_id"] = "tuneplane-node"
        data = urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(params["realm"], data=data, method="POST")
    else:
        url = f"{params['realm']}?{urllib.parse.urlencode(query)}"
        request = urllib.request.Request(url, headers={"Authorization": _basic(auth)})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=system_tls()) as response:
            answer = json.loads(response.read(1 << 20))
    except urllib.error.HTTPError as exc:
        log.debug("token service of %s answered %d", name.registry, exc.code)
        return None
    except ValueError:
        return None
    token = answer.get("token") or answer.get("access_token") if isinstance(answer, dict) else None
    return str(token) if token else None
