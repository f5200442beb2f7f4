"""OCI volumes through the API, in front of the fake engine and a fake registry in the
test's loop (issue 39): a launch naming a tag answers ``pulling``, starts once the
layers are unpacked, and binds the directory by its manifest's digest; a volume pulled
with credentials is private for every later launch, by tag or by digest; malformed
sources and digests are 422s naming their field.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeFakeNode
from tests.fakes.runtime import FakeRuntime
from tests.http.test_daemon_volume_verbs import PULL, root_of
from tests.ocilayers import file, tarball
from tests.ociserver import PASSWORD, USER, Registry
from tests.support.console import Console
from tests.volumeserver import LOOPBACK
from tuneplane_node.runtime.facts import STAGED

# A real server on a socket (tests' own loop): slow by the suite's rule.
pytestmark = pytest.mark.slow

IMAGE = "registry.test/trainer:1"  # the fake engine's
LAYER = tarball(file("config.json", '{"layers": 2}'), file("weights/w.bin", b"W" * 5000))
AUTH = {"username": USER, "password": PASSWORD}


def settings_of(registry: Registry, tmp_path: Path) -> dict[str, Any]:
    return {
        "volume_root": root_of(tmp_path),
        "volume_insecure_hosts": [registry.host],
        "volume_allowed_networks": LOOPBACK,
    }


@pytest.fixture
async def node(
    fake_node: MakeFakeNode, fake: FakeRuntime, oci_registry: Registry, tmp_path: Path
) -> AsyncIterator[Console]:
    """A node in front of the fake engine, which is handed staged binds (real ones:
    root); every job it launched is removed through it at the end, its binds released."""
    fake.mount_mode = STAGED
    made = await fake_node(**settings_of(oci_registry, tmp_path))
    yield made
    for name in list(fake.containers):
        await made.call("POST", "/node/v1/remove", json={"ref": name})


async def test_a_launch_naming_a_tag_pulls_then_binds_the_directory_by_digest(
    node: Console, fake: FakeRuntime, oci_registry: Registry, tmp_path: Path
) -> None:
    digest = oci_registry.push("models/base", "v1", [LAYER])
    oci_registry.push("models/base", "latest", [LAYER])
    volume = {"source": oci_registry.ref("models/base", "v1"), "path": "/models/base", "sha256": ""}

    ref, body = await node.launch(image=IMAGE, volumes=[volume])
    assert body["phase"] == "pulling", body
    await node.wait_for(ref, "status", "running")
    other, body = await node.launch(
        image=IMAGE, volumes=[{"source": oci_registry.ref("models/base", "latest"), "path": "/m"}]
    )

    assert body.get("phase") != "pulling", body  # the other tag: the same entry, present
    tree = root_of(tmp_path) / "sha256" / digest
    assert (tree / "weights/w.bin").read_bytes() == b"W" * 5000
    for name in (ref, other):
        made = fake.containers[name]
        assert made.labels["tuneplane.volumes"] == digest, made.labels
        [mount] = made.spec.mounts
        assert mount.read_only and Path(mount.host, "config.json").exists(), mount
    listed = await node.ok("GET", "/node/v1/volumes")
    assert [(e["sha256"], e["size_bytes"]) for e in listed["entries"]] == [
        (digest, 5000 + len('{"layers": 2}'))
    ], listed


async def test_a_volume_pulled_with_credentials_is_private_by_tag_and_by_digest(
    node: Console, fake: FakeRuntime, oci_registry: Registry
) -> None:
    oci_registry.auth = "bearer"
    digest = oci_registry.push("private/data", "v1", [LAYER])
    by_tag = {"source": oci_registry.ref("private/data", "v1"), "path": "/data"}
    by_digest = {"source": f"{oci_registry.host}/private/data@sha256:{digest}", "path": "/data"}
    image = f"{oci_registry.host}/trainer:1"  # the volume's registry: the launch's own credentials
    fake.arrived(image)

    _, refused = await node.launch(image=IMAGE, volumes=[by_tag], expect=502)
    assert refused["code"] == "volume_fill_failed", refused
    assert "refused it without credentials (401)" in refused["detail"], refused
    ref, body = await node.launch(image=image, volumes=[by_tag], registry_auth=AUTH)
    assert body["phase"] == "pulling", body
    await node.wait_for(ref, "status", "running")

    for volume in (by_digest, {**by_tag, "sha256": digest}):
        _, denied = await node.launch(image=IMAGE, volumes=[volume], expect=403)
        assert denied["code"] == "forbidden_image", denied
    wrong = {"username": USER, "password": "not-it"}
    _, denied = await node.launch(image=image, volumes=[by_digest], registry_auth=wrong, expect=403)
    assert denied["code"] == "forbidden_image", denied
    _, body = await node.launch(image=image, volumes=[by_digest], registry_auth=AUTH)
    assert body.get("phase") != "pulling", body
    assert PASSWORD not in str(denied) and PASSWORD not in str(refused)
    # Its digest spelt as a URL's file, which no registry's credentials guard: refused,
    # the entry never bound.
    by_url = {"source": "https://elsewhere.test/data", "path": "/data", "sha256": digest}
    _, denied = await node.launch(image=IMAGE, volumes=[by_url], expect=422)
    assert denied["code"] == "invalid_field", denied
    assert denied["errors"][0]["field"] == "container.volumes[0]", denied
    assert "registry volume" in denied["detail"], denied
    # A prefetch asks with the node file's credentials: none here.
    status, answer = await node.call("POST", PULL, json={"source": by_digest["source"]})
    assert (status, answer["code"]) == (403, "forbidden_image"), answer


@pytest.mark.parametrize(
    ("volume", "field"),
    [
        ({"source": "Registry/UPPER:1", "path": "/m"}, "container.volumes[0].source"),
        ({"source": "reg.io/repo@md5:abc", "path": "/m"}, "container.volumes[0].source"),
        ({"source": "sha256:" + "a" * 64, "path": "/m"}, "container.volumes[0].source"),
        ({"source": "reg.io/" + "a" * 1100, "path": "/m"}, "container.volumes[0].source"),
        ({"source": "reg.io/repo:1", "path": "/m", "sha256": "xyz"},
         "container.volumes[0].sha256"),
        ({"source": f"reg.io/repo@sha256:{'a' * 64}", "path": "/m", "sha256": "b" * 64},
         "container.volumes[0].sha256"),
        ({"source": "https://h/w", "path": "/m", "sha256": ""}, "container.volumes[0].sha256"),
    ],
)  # fmt: skip
async def test_a_malformed_oci_volume_is_a_422_naming_its_field(
    fake_node: MakeFakeNode, tmp_path: Path, volume: dict[str, str], field: str
) -> None:
    node = await fake_node(volume_root=root_of(tmp_path))
    _, body = await node.launch(volumes=[volume], expect=422)
    assert body["errors"][0]["field"] == field, body
    assert body["code"] == "invalid_field", body


async def test_a_prefetch_of_a_tag_fills_the_entry_its_digest_names(
    fake_node: MakeFakeNode, oci_registry: Registry, tmp_path: Path
) -> None:
    digest = oci_registry.push("models/base", "v1", [LAYER])
    node = await fake_node(**settings_of(oci_registry, tmp_path))

    answer = await node.ok(
        "POST", PULL, json={"source": oci_registry.ref("models/base", "v1"), "wait": True}
    )

    assert (answer["phase"], answer["sha256"]) == ("present", digest), answer
    assert (root_of(tmp_path) / "sha256" / digest / "config.json").exists()


async def test_a_launchs_credentials_never_reach_another_registry_than_its_images(
    node: Console, oci_registry: Registry
) -> None:
    oci_registry.auth = "basic"
    oci_registry.push("private/data", "v1", [LAYER])
    volume = {"source": oci_registry.ref("private/data", "v1"), "path": "/data"}

    _, refused = await node.launch(image=IMAGE, volumes=[volume], registry_auth=AUTH, expect=502)

    assert "refused it without credentials (401)" in refused["detail"], refused
    assert set(oci_registry.authorizations) == {""}, oci_registry.authorizations
