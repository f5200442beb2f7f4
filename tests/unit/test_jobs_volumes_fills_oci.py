"""OCI volumes filled from a fake registry in the test's loop: resolved by digest, layers
checked and unpacked, fetched once, the registry's challenges answered, indexes followed
to this machine's manifest, and every refusal clear."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.ocilayers import Item, file, tarball
from tests.ociserver import IDENTITY, PASSWORD, USER, Registry, hexdigest
from tests.volumeserver import local_fetcher
from tuneplane_node.errors import VolumeFillFailed
from tuneplane_node.fetch.fetching import Fetcher
from tuneplane_node.fetch.ociregistry import OciRegistry, by_digest
from tuneplane_node.jobs.volumes.fills import MAX_ENTRIES, VolumeFills, budget_of
from tuneplane_node.jobs.volumes.sources import VolumeSources
from tuneplane_node.jobs.volumes.store import VolumeStore
from tuneplane_node.jobs.words import partial_key
from tuneplane_node.wire.values import RegistryAuth, Volume

# A real server on a socket (tests' own loop): slow by the suite's rule.
pytestmark = pytest.mark.slow

AUTH = RegistryAuth(USER, PASSWORD)
WEIGHTS = tarball(Item("models", kind="dir"), file("models/w.bin", b"W" * 70000))
TOKENIZER = tarball(file("tokenizer.json", "{}"), file("models/.wh.w.bin"), gzipped=False)


def fills_of(root: Path, registry: Registry) -> VolumeFills:
    fetcher = local_fetcher(insecure=[registry.host])
    client = OciRegistry(fetcher)
    return VolumeFills(VolumeStore(root), fetcher, registry=client, limit=2, backoff_s=0.01)


async def resolved(
    client: OciRegistry, ref: str, auth: RegistryAuth | None = None, *, fetcher: Fetcher
) -> str:
    """The digest ``ref`` names, asked in a session of its own."""
    async with fetcher.session() as http:
        return await client.resolve(http, ref, auth)


@pytest.fixture
async def fills(tmp_path: Path, oci_registry: Registry) -> AsyncIterator[VolumeFills]:
    made = fills_of(tmp_path / "volumes", oci_registry)
    yield made
    await made.close()


async def filled(fills: VolumeFills, ref: str, auth: RegistryAuth | None = None) -> Path:
    assert fills.registry is not None
    digest = await resolved(fills.registry, ref, auth, fetcher=fills.fetcher)
    entry = await fills.ensure(digest, by_digest(ref, digest), auth)
    return entry.path


async def test_two_tags_of_one_artifact_are_one_entry_fetched_once(
    oci_registry: Registry, fills: VolumeFills
) -> None:
    digest = oci_registry.push("models/base", "v1", [WEIGHTS])
    oci_registry.push("models/base", "latest", [WEIGHTS])

    paths = await asyncio.gather(
        *(filled(fills, oci_registry.ref("models/base", tag)) for tag in ("v1", "latest", "v1"))
    )

    assert set(paths) == {fills.store.root / "sha256" / digest}
    assert (paths[0] / "models/w.bin").read_bytes() == b"W" * 70000
    assert oci_registry.blob_bytes[hexdigest(WEIGHTS)] == len(WEIGHTS)
    assert sorted(p.name for p in (fills.store.root / "partial").iterdir()) == []


async def test_layers_apply_in_order_and_a_whiteout_removes_the_lower_file(
    oci_registry: Registry, fills: VolumeFills
) -> None:
    oci_registry.push("models/base", "v2", [WEIGHTS, TOKENIZER])

    tree = await filled(fills, oci_registry.ref("models/base", "v2"))

    assert sorted(str(p.relative_to(tree)) for p in tree.rglob("*")) == [
        "models",
        "tokenizer.json",
    ]


async def test_a_layer_of_other_bytes_is_no_entry_and_says_which(
    oci_registry: Registry, fills: VolumeFills
) -> None:
    digest = oci_registry.push("models/base", "v1", [WEIGHTS])
    oci_registry.wrong.add(hexdigest(WEIGHTS))

    with pytest.raises(VolumeFillFailed, match=f"match the sha256:{hexdigest(WEIGHTS)}"):
        await filled(fills, oci_registry.ref("models/base", "v1"))

    assert fills.store.entry(digest) is None
    assert list((fills.store.root / "partial").iterdir()) == []


async def test_a_blob_longer_than_its_manifest_says_is_cut_off_and_fails_the_fill(
    oci_registry: Registry, fills: VolumeFills
) -> None:
    oci_registry.push("models/base", "v1", [WEIGHTS], short=100)

    with pytest.raises(VolumeFillFailed, match="longer than its manifest's"):
        await filled(fills, oci_registry.ref("models/base", "v1"))

    assert list((fills.store.root / "partial").iterdir()) == []


async def test_a_hostile_layer_fails_the_fill_and_leaves_nothing(
    oci_registry: Registry, fills: VolumeFills, tmp_path: Path
) -> None:
    evil = tarball(Item("out", kind="symlink", target=str(tmp_path)), file("out/planted"))
    oci_registry.push("models/evil", "v1", [evil])

    with pytest.raises(VolumeFillFailed, match="through a link"):
        await filled(fills, oci_registry.ref("models/evil", "v1"))

    assert not (tmp_path / "planted").exists()
    assert list((fills.store.root / "partial").iterdir()) == []


async def test_a_layer_of_more_entries_than_its_size_allows_fails_and_leaves_nothing(
    oci_registry: Registry, fills: VolumeFills
) -> None:
    """Issue 50: 1.4 MB of layer unpacked to 63,921 inodes, under the 2^20 cap."""
    empty = [file(f"d/{i}", b"") for i in range(15_000)]
    layer = tarball(Item("d", kind="dir"), *empty)
    assert budget_of(len(layer)).entries < 15_000 < MAX_ENTRIES  # small: its headers gzip
    oci_registry.push("data/many", "v1", [layer])

    with pytest.raises(VolumeFillFailed, match="more entries than its budget of"):
        await filled(fills, oci_registry.ref("data/many", "v1"))

    assert list((fills.store.root / "partial").iterdir()) == []
    assert fills.store.entries() == []


async def test_a_digest_the_registry_serves_other_bytes_for_is_refused(
    oci_registry: Registry, fills: VolumeFills
) -> None:
    digest = oci_registry.push("models/base", "v1", [WEIGHTS])
    manifests = oci_registry.manifests
    manifests[f"models/base@sha256:{'0' * 64}"] = manifests["models/base:v1"]
    assert fills.registry is not None

    with pytest.raises(VolumeFillFailed, match="manifest is not sha256:0000"):
        ref = f"{oci_registry.host}/models/base@sha256:{'0' * 64}"
        await resolved(fills.registry, ref, fetcher=fills.fetcher)
    assert digest != "0" * 64


@pytest.mark.parametrize("scheme", ["basic", "bearer"])
async def test_a_registry_that_wants_credentials_gets_them_and_never_sees_them_logged(
    oci_registry: Registry, fills: VolumeFills, scheme: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    oci_registry.auth = scheme
    oci_registry.push("private/data", "v1", [WEIGHTS])
    ref = oci_registry.ref("private/data", "v1")

    with pytest.raises(VolumeFillFailed, match=r"refused it without credentials \(401\)"):
        await filled(fills, ref)
    with pytest.raises(VolumeFillFailed, match=r"refused it with the launch credentials"):
        await filled(fills, ref, RegistryAuth(USER, "wrong"))
    tree = await filled(fills, ref, AUTH)

    assert (tree / "models/w.bin").exists()
    assert PASSWORD not in caplog.text


async def test_an_identity_token_is_a_refresh_token_grant_of_the_token_service(
    oci_registry: Registry, fills: VolumeFills, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    oci_registry.auth = "bearer"
    oci_registry.push("private/data", "v1", [WEIGHTS])

    tree = await filled(
        fills, oci_registry.ref("private/data", "v1"), RegistryAuth(identity_token=IDENTITY)
    )

    assert (tree / "models/w.bin").exists()
    assert IDENTITY not in caplog.text


async def test_an_index_is_followed_to_this_machines_linux_manifest(
    oci_registry: Registry, fills: VolumeFills
) -> None:
    amd = oci_registry.push("multi/arch", "amd", [WEIGHTS])
    arm = oci_registry.push("multi/arch", "arm", [TOKENIZER])
    index = oci_registry.push_index("multi/arch", "v1", {"linux/amd64": amd, "linux/arm64": arm})

    tree = await filled(fills, oci_registry.ref("multi/arch", "v1"))

    assert tree.name == index  # the entry is named by what the reference names
    assert (tree / "models/w.bin").exists()


async def test_an_index_without_this_machines_platform_is_refused_clearly(
    oci_registry: Registry, fills: VolumeFills
) -> None:
    arm = oci_registry.push("multi/arch", "arm", [TOKENIZER])
    oci_registry.push_index("multi/arch", "v1", {"linux/arm64": arm, "windows/amd64": arm})

    with pytest.raises(VolumeFillFailed, match="names no manifest for linux/amd64"):
        await filled(fills, oci_registry.ref("multi/arch", "v1"))


async def test_zstd_layers_and_unknown_references_are_refused_clearly(
    oci_registry: Registry, fills: VolumeFills
) -> None:
    zstd = b"\x28\xb5\x2f\xfd" + b"\0" * 32
    oci_registry.push("models/z", "v1", [zstd], media="application/vnd.oci.image.layer.v1.tar+zstd")

    with pytest.raises(VolumeFillFailed, match="zstd layer is not served"):
        await filled(fills, oci_registry.ref("models/z", "v1"))
    with pytest.raises(VolumeFillFailed, match="no such manifest"):
        await filled(fills, oci_registry.ref("models/none", "v1"))


async def test_plain_http_is_never_tried_for_a_host_not_listed(
    oci_registry: Registry, tmp_path: Path
) -> None:
    oci_registry.push("models/base", "v1", [WEIGHTS])
    fetcher = local_fetcher(stall_s=5.0)
    with pytest.raises(VolumeFillFailed):  # https to a plain server: no answer
        await resolved(OciRegistry(fetcher), oci_registry.ref("models/base", "v1"), fetcher=fetcher)
    assert oci_registry.requests == []


async def test_a_layer_a_killed_fill_left_half_of_resumes_from_where_it_stopped(
    oci_registry: Registry, fills: VolumeFills
) -> None:
    digest = oci_registry.push("models/base", "v1", [WEIGHTS])
    half = len(WEIGHTS) // 2
    ref = oci_registry.ref("models/base", "v1")
    key = partial_key(digest, fills.accesses.of(by_digest(ref, digest)))
    fills.store.partial(f"{key}.{hexdigest(WEIGHTS)}").write_bytes(WEIGHTS[:half])
    (fills.store.partial(f"{key}.d") / "stale").mkdir(parents=True)  # an unpacking cut off

    tree = await filled(fills, oci_registry.ref("models/base", "v1"))

    assert oci_registry.blob_bytes[hexdigest(WEIGHTS)] == len(WEIGHTS) - half
    assert sorted(p.name for p in tree.iterdir()) == ["models"]  # unpacked afresh


async def test_a_tag_that_names_another_digest_than_the_one_given_is_refused(
    oci_registry: Registry, tmp_path: Path
) -> None:
    oci_registry.push("models/base", "v1", [WEIGHTS])
    fills = fills_of(tmp_path / "volumes", oci_registry)
    assert fills.registry is not None
    sources = VolumeSources(fills.registry, fills)
    asked = Volume(oci_registry.ref("models/base", "v1"), "/m", "e" * 64)

    try:
        with pytest.raises(VolumeFillFailed, match=f"not the sha256:{'e' * 64} asked"):
            await sources.resolved([asked])
    finally:
        await fills.close()


async def test_an_evicted_directory_entry_goes_with_all_it_holds(
    oci_registry: Registry, fills: VolumeFills
) -> None:
    digest = oci_registry.push("models/base", "v1", [WEIGHTS])
    tree = await filled(fills, oci_registry.ref("models/base", "v1"))
    entry = fills.store.entry(digest)
    assert entry is not None and entry.size == 70000
    assert fills.store.used_bytes() == 70000

    taken = fills.store.take_out(digest)
    assert taken is not None and fills.store.entry(digest) is None
    fills.store.removed(taken)

    assert not taken.exists() and not tree.exists() and fills.store.used_bytes() == 0


@pytest.mark.parametrize("scheme", ["basic", "bearer"])
async def test_a_token_one_credential_got_never_serves_another_request(
    oci_registry: Registry, fills: VolumeFills, scheme: str
) -> None:
    """Finding 2 of issue 49: tenant B filled ``weights:1`` with its credentials; tenant
    A, without any, was sent B's Authorization for ``weights:2``, which B never fetched."""
    oci_registry.auth = scheme
    oci_registry.push("private/weights", "1", [WEIGHTS])
    oci_registry.push("private/weights", "2", [TOKENIZER])
    await filled(fills, oci_registry.ref("private/weights", "1"), AUTH)
    seen = len(oci_registry.authorizations)

    with pytest.raises(VolumeFillFailed, match=r"refused it without credentials \(401\)"):
        await filled(fills, oci_registry.ref("private/weights", "2"))
    with pytest.raises(VolumeFillFailed, match=r"with the launch credentials"):
        await filled(fills, oci_registry.ref("private/weights", "2"), RegistryAuth(USER, "x"))

    assert oci_registry.authorizations[seen] == ""  # A's first request: no one's login
