"""Whether a registry accepts credentials for an image, asked as the engines would: a
HEAD of the image's manifest (registry API v2), a request and not a download.

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
import json
import logging
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping

from tuneplane_node.runtime.base import RegistryAuth
from tuneplane_node.runtime.dockerformat import DOCKER_HUB, ImageName

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
        return _ask(f"https://{host}{path}", name, auth, timeout)
    except (ssl.SSLError, urllib.error.URLError, ConnectionError) as exc:
        if not host.startswith(LOOPBACK):
            raise RegistryUnreachable(f"{host}: {_why(exc)}") from None
    try:
        return _ask(f"http://{host}{path}", name, auth, timeout)
    except (urllib.error.URLError, ConnectionError) as exc:
        raise RegistryUnreachable(f"{host}: {_why(exc)}") from None


def _why(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return str(reason or exc) or type(exc).__name__


def _ask(url: str, name: ImageName, auth: RegistryAuth, timeout: float) -> bool:
    status, challenge = _head(url, {}, timeout)
    if status != 401 or not challenge:
        return status == 200
    scheme, _, rest = challenge.partition(" ")
    params = dict(CHALLENGE.findall(rest))
    if scheme.lower() == "basic":
        if not auth.username:
            return False  # an identity token is for a token service
        status, _ = _head(url, {"Authorization": _basic(auth)}, timeout)
        return status == 200
    if scheme.lower() != "bearer" or "realm" not in params:
        return False
    token = _token(params, name, auth, timeout)
    if token is None:
        return False
    status, _ = _head(url, {"Authorization": f"Bearer {token}"}, timeout)
    return status == 200


def _basic(auth: RegistryAuth) -> str:
    pair = f"{auth.username}:{auth.password}".encode()
    return f"Basic {base64.b64encode(pair).decode('ascii')}"


def _head(url: str, headers: Mapping[str, str], timeout: float) -> tuple[int, str]:
    """The status of a HEAD, and the challenge of a 401."""
    request = urllib.request.Request(url, method="HEAD", headers={"Accept": MANIFESTS, **headers})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("WWW-Authenticate", "") if exc.headers else ""


def _token(
    params: Mapping[str, str], name: ImageName, auth: RegistryAuth, timeout: float
) -> str | None:
    """A pull token from the registry's token service; None when it refuses."""
    query = {"service": params.get("service", ""), "scope": f"repository:{name.path}:pull"}
    if auth.identity_token:  # docker's OAuth2 refresh-token grant
        form = {**query, "grant_type": "refresh_token", "refresh_token": auth.identity_token}
        form["client_id"] = "tuneplane-node"
        data = urllib.parse.urlencode(form).encode()
        request = urllib.request.Request(params["realm"], data=data, method="POST")
    else:
        url = f"{params['realm']}?{urllib.parse.urlencode(query)}"
        request = urllib.request.Request(url, headers={"Authorization": _basic(auth)})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.loads(response.read(1 << 20))
    except urllib.error.HTTPError as exc:
        log.debug("token service of %s answered %d", name.registry, exc.code)
        return None
    except ValueError:
        return None
    token = answer.get("token") or answer.get("access_token") if isinstance(answer, dict) else None
    return str(token) if token else None
