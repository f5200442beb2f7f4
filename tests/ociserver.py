"""A fake OCI registry for volume tests: manifests, indexes, blobs with Range, and the
Basic or Bearer challenge on demand, in the test's own loop on 127.0.0.1.

`push` stores layers and a manifest under a tag and returns the manifest's digest (hex);
`push_index` wraps manifests in an index. ``auth`` (``basic`` or ``bearer``) makes every
``/v2`` request want `USER`/`PASSWORD` (Bearer: through ``/token``, which takes
`IDENTITY` as a refresh-token grant too). `blob_bytes` counts
the body bytes served per layer digest; `wrong` serves other bytes for a layer.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, field

from aiohttp import web

USER, PASSWORD = "tester", "s3cret-volume-pass"
IDENTITY = "s3cret-refresh-token"  # an identity token, as a cloud registry's login gives
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
RANGE = re.compile(r"bytes=(\d+)-")


def hexdigest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Registry:
    auth: str = ""  # "", "basic" or "bearer"
    manifests: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # ref -> (type, body)
    blobs: dict[str, bytes] = field(default_factory=dict)  # hex -> bytes
    blob_bytes: Counter[str] = field(default_factory=Counter)
    wrong: set[str] = field(default_factory=set)
    requests: list[str] = field(default_factory=list)  # method and path of each
    authorizations: list[str] = field(default_factory=list)  # every Authorization seen
    runner: web.AppRunner | None = None
    host: str = ""  # 127.0.0.1:<port>

    def push(
        self, repo: str, tag: str, layers: list[bytes], *, media: str = LAYER, short: int = 0
    ) -> str:
        """``short``: the manifest says each layer is that many bytes shorter than it is."""
        for layer in layers:
            self.blobs[hexdigest(layer)] = layer
        config = b"{}"
        self.blobs[hexdigest(config)] = config
        body = json.dumps({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                       "digest": f"sha256:{hexdigest(config)}", "size": 2},
            "layers": [{"mediaType": media, "digest": f"sha256:{hexdigest(layer)}",
                        "size": len(layer) - short} for layer in layers],
        }).encode()  # fmt: skip
        return self._stored(repo, tag, MANIFEST, body)

    def push_index(self, repo: str, tag: str, platforms: dict[str, str]) -> str:
        """An index of the manifests (hex) by ``os/arch``."""
        entries = [
            {"mediaType": MANIFEST, "digest": f"sha256:{digest}", "size": 1,
             "platform": {"os": where.split("/")[0], "architecture": where.split("/")[1]}}
            for where, digest in platforms.items()
        ]  # fmt: skip
        body = json.dumps({"schemaVersion": 2, "mediaType": INDEX, "manifests": entries})
        return self._stored(repo, tag, INDEX, body.encode())

    def _stored(self, repo: str, tag: str, kind: str, body: bytes) -> str:
        digest = hexdigest(body)
        self.manifests[f"{repo}:{tag}"] = self.manifests[f"{repo}@sha256:{digest}"] = (kind, body)
        return digest

    def ref(self, repo: str, tag: str) -> str:
        return f"{self.host}/{repo}:{tag}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/token", self._token)
        app.router.add_post("/token", self._grant)
        app.router.add_route("*", "/v2/{repo:.+}/manifests/{ref}", self._manifest)
        app.router.add_get("/v2/{repo:.+}/blobs/sha256:{digest}", self._blob)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.host = f"127.0.0.1:{port}"

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def _basic_ok(self, header: str) -> bool:
        expected = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        return header == f"Basic {expected}"

    def _refused(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization", "")
        self.authorizations.append(header)
        if self.auth == "basic" and not self._basic_ok(header):
            challenge = 'Basic realm="fake"'
        elif self.auth == "bearer" and header != "Bearer good-token":
            challenge = f'Bearer realm="http://{self.host}/token",service="fake"'
        else:
            return None
        return web.Response(status=401, headers={"WWW-Authenticate": challenge})

    async def _token(self, request: web.Request) -> web.Response:
        if not self._basic_ok(request.headers.get("Authorization", "")):
            return web.Response(status=401)
        return web.json_response({"token": "good-token", "expires_in": 300})

    async def _grant(self, request: web.Request) -> web.Response:
        form = await request.post()
        if (form.get("grant_type"), form.get("refresh_token")) != ("refresh_token", IDENTITY):
            return web.Response(status=401)
        return web.json_response({"access_token": "good-token", "expires_in": 300})

    async def _manifest(self, request: web.Request) -> web.Response:
        self.requests.append(f"{request.method} {request.path}")
        if (refused := self._refused(request)) is not None:
            return refused
        repo, ref = request.match_info["repo"], request.match_info["ref"]
        found = self.manifests.get(f"{repo}{'@' if ref.startswith('sha256:') else ':'}{ref}")
        if found is None:
            return web.Response(status=404)
        kind, body = found
        headers = {"Docker-Content-Digest": f"sha256:{hexdigest(body)}"}
        return web.Response(body=body, content_type=kind, headers=headers)

    async def _blob(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path}")
        if (refused := self._refused(request)) is not None:
            return refused
        digest = request.match_info["digest"]
        data = self.blobs.get(digest)
        if data is None:
            return web.Response(status=404)
        if digest in self.wrong:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        found = RANGE.fullmatch(request.headers.get("Range", ""))
        start = int(found[1]) if found else 0
        response = web.StreamResponse(status=206 if found else 200)
        response.content_length = len(data) - start
        if found:
            response.headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        await response.prepare(request)
        await response.write(data[start:])
        self.blob_bytes[digest] += len(data) - start
        return response
