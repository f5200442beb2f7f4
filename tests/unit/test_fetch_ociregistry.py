"""The OCI registry's manifest checks (`fetch.ociregistry`), against canned answers: a
reference by digest gets only a document of that digest, an index is followed to this
machine's linux manifest alone, every layer names a sha256 and a size, a manifest of
another kind is refused, and a refusal says why without a credential.

Fast, no socket (issue 52: the layer and manifest checks had only slow tests, against a
registry of the tests' own: tests/unit/test_jobs_volumes_fills_oci.py)."""

from __future__ import annotations

import hashlib
import json
import platform
from collections.abc import Mapping
from typing import Any, cast

import pytest

from tuneplane_node.errors import VolumeFillFailed
from tuneplane_node.fetch.fetching import Answer, Fetcher, Session
from tuneplane_node.fetch.ociregistry import Layer, Manifest, OciRegistry
from tuneplane_node.fetch.registry import ARCHITECTURES
from tuneplane_node.wire.values import RegistryAuth

REPO = "registry.test/models/base"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
ARCH = ARCHITECTURES.get(platform.machine(), platform.machine())
LAYER = {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": "sha256:" + "a" * 64}


def manifest(*layers: Mapping[str, Any], kind: str | None = OCI_MANIFEST) -> bytes:
    document: dict[str, Any] = {"schemaVersion": 2, "layers": list(layers)}
    if kind is not None:
        document["mediaType"] = kind
    return json.dumps(document).encode()


def digest_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


class Canned:
    """A registry's answers by the URL's tail (``manifests/<reference>``)."""

    def __init__(self, **answers: tuple[int, bytes]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    async def request(self, method: str, url: str, **_: Any) -> Answer:
        tail = url.rpartition("/manifests/")[2]
        self.asked.append(tail)
        status, body = self.answers.get(tail, (404, b""))
        return Answer(status, {}, body)


async def read(source: str, registry: Canned, auth: RegistryAuth | None = None) -> Manifest:
    oci = OciRegistry(Fetcher(stall_s=1.0))
    return await oci.manifest(cast(Session, registry), source, auth)


async def test_a_manifest_lists_its_layers_by_sha256_and_size() -> None:
    body = manifest({**LAYER, "size": 10}, {**LAYER, "digest": "sha256:" + "b" * 64, "size": 0})
    found = await read(f"{REPO}:v1", Canned(v1=(200, body)))
    assert found.layers == (
        Layer("a" * 64, 10, LAYER["mediaType"]),
        Layer("b" * 64, 0, LAYER["mediaType"]),
    )
    assert found.size == 10


async def test_a_reference_by_digest_takes_only_a_document_of_that_digest() -> None:
    body = manifest({**LAYER, "size": 10})
    pinned = digest_of(body)
    assert (await read(f"{REPO}@{pinned}", Canned(**{pinned: (200, body)}))).size == 10
    other = manifest({**LAYER, "size": 11})  # the registry answers another document
    with pytest.raises(VolumeFillFailed, match=f"the registry's manifest is not {pinned}"):
        await read(f"{REPO}@{pinned}", Canned(**{pinned: (200, other)}))


async def test_an_index_is_followed_to_this_machines_linux_manifest_alone() -> None:
    mine, theirs = manifest({**LAYER, "size": 1}), manifest({**LAYER, "size": 2})
    entries = [
        {"digest": digest_of(theirs), "platform": {"os": "windows", "architecture": ARCH}},
        {"digest": digest_of(theirs), "platform": {"os": "linux", "architecture": "s390x"}},
        {"digest": digest_of(mine), "platform": {"os": "linux", "architecture": ARCH}},
    ]
    index = json.dumps({"mediaType": OCI_INDEX, "manifests": entries}).encode()
    registry = Canned(v1=(200, index), **{digest_of(mine): (200, mine)})
    assert (await read(f"{REPO}:v1", registry)).size == 1
    assert registry.asked == ["v1", digest_of(mine)]
    elsewhere = json.dumps({"mediaType": OCI_INDEX, "manifests": entries[:2]}).encode()
    with pytest.raises(VolumeFillFailed, match=f"names no manifest for linux/{ARCH}"):
        await read(f"{REPO}:v1", Canned(v1=(200, elsewhere)))


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"not json", "not a JSON object"),
        (b"[]", "not a JSON object"),
        (manifest(kind="application/vnd.docker.distribution.manifest.v1+json"), "is not served"),
        (json.dumps({"mediaType": OCI_MANIFEST}).encode(), "lists no layers"),
        (manifest({**LAYER}), "a layer without a sha256 and size"),
        (manifest({**LAYER, "size": -1}), "a layer without a sha256 and size"),
        (manifest({**LAYER, "size": True}), "a layer without a sha256 and size"),
        (manifest({**LAYER, "size": "10"}), "a layer without a sha256 and size"),
        (manifest({**LAYER, "size": 1, "digest": "sha512:" + "a" * 128}), "without a sha256"),
        (manifest({**LAYER, "size": 1, "digest": "sha256:" + "A" * 64}), "without a sha256"),
        (manifest("layer"), "a layer without a sha256 and size"),  # type: ignore[arg-type]
    ],
)
async def test_a_manifest_the_node_cannot_trust_is_refused_with_its_reason(
    body: bytes, said: str
) -> None:
    with pytest.raises(VolumeFillFailed, match=said):
        await read(f"{REPO}:v1", Canned(v1=(200, body)))


@pytest.mark.parametrize(
    ("status", "said", "retryable"),
    [
        (401, "the registry refused it with the launch credentials (401)", False),
        (403, "the registry refused it with the launch credentials (403)", False),
        (404, "the registry has no such manifest (404)", False),
        (503, "the registry answered 503", True),
    ],
)
async def test_a_registrys_refusal_says_why_and_never_the_credential(
    status: int, said: str, retryable: bool
) -> None:
    auth = RegistryAuth(username="ci", password="s3cret-of-the-launch", source="launch")
    with pytest.raises(VolumeFillFailed) as refused:
        await read(f"{REPO}:v1", Canned(v1=(status, b"")), auth)
    assert said in refused.value.message and "s3cret" not in refused.value.message
    assert refused.value.retryable is retryable
