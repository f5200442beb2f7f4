"""OCI volumes (issue 39) on docker AND podman against the dev registries: an artifact the
test pushes to 127.0.0.1:5000 (the registry API: blobs, then a manifest) is fetched once
for two launches, each job reads its files at ``path`` and gets EROFS on a write; one on
the password registry 127.0.0.1:5005 is fetched with the node file's credentials.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import MakeNode
from tests.engines.test_daemon_mounts import remove_directly
from tests.engines.test_daemon_scratch import logged
from tests.ocilayers import file, tarball
from tests.ociserver import LAYER, MANIFEST
from tests.scrapes import scrape
from tests.support.images import REGISTRY
from tests.support.jobs import unique
from tests.volumeserver import LOOPBACK

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]
PRIVATE_REGISTRY = "127.0.0.1:5005"
READ = "cat /data/hello.txt; echo x > /data/new; echo write-exit=$?; exec sleep 300"


def basic(login: dict[str, str]) -> str:
    pair = f"{login['username']}:{login['password']}".encode()
    return base64.b64encode(pair).decode()


async def push(
    registry: str, repo: str, layers: list[bytes], auth: str = "", *, tag: str = "1"
) -> str:
    """``layers`` and a manifest pushed as ``registry/repo:<tag>`` through the registry
    API (``auth``: a Basic pair); the reference."""
    config = b"{}"
    headers = {"Authorization": f"Basic {auth}"} if auth else {}
    async with aiohttp.ClientSession(headers=headers) as session:
        for blob in (config, *layers):
            digest = f"sha256:{hashlib.sha256(blob).hexdigest()}"
            async with session.post(f"http://{registry}/v2/{repo}/blobs/uploads/") as started:
                assert started.status == 202, await started.text()
                location = started.headers["Location"]
            if location.startswith("/"):
                location = f"http://{registry}{location}"
            glue = "&" if "?" in location else "?"
            async with session.put(f"{location}{glue}digest={digest}", data=blob) as put:
                assert put.status == 201, await put.text()
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": "application/vnd.oci.empty.v1+json",
                       "digest": f"sha256:{hashlib.sha256(config).hexdigest()}", "size": 2},
            "layers": [{"mediaType": LAYER, "size": len(layer),
                        "digest": f"sha256:{hashlib.sha256(layer).hexdigest()}"}
                       for layer in layers],
        }  # fmt: skip
        headers = {"Content-Type": MANIFEST}
        url = f"http://{registry}/v2/{repo}/manifests/{tag}"
        async with session.put(url, data=json.dumps(manifest), headers=headers) as put:
            assert put.status == 201, await put.text()
    return f"{registry}/{repo}:{tag}"


def artifact() -> tuple[bytes, str]:
    """A layer of its own (this run's words: no other test's entry) and those words."""
    words = f"hello from {unique('layer')}"
    layer = tarball(file("hello.txt", f"{words}\n"), file("weights.bin", os.urandom(65536)))
    return layer, words


@pytest.mark.parametrize("engine", ENGINES)
async def test_two_launches_of_one_oci_volume_fetch_it_once_and_read_it_read_only(
    make_node: MakeNode, engine: str
) -> None:
    layer, words = artifact()
    source = await push(REGISTRY, f"tuneplane-test/volume-{unique('v')}", [layer])
    node = await make_node(
        engine, volume_insecure_hosts=[REGISTRY], volume_allowed_networks=LOOPBACK
    )
    volume = {"source": source, "path": "/data"}
    names: list[str] = []
    try:
        for _ in range(2):
            ref, _ = await node.launch(["/bin/sh", "-c", READ], volumes=[volume])
            names.append(ref)
        for ref in names:
            said = await logged(node, ref, "write-exit=")
            assert words in said, said
            assert "Read-only file system" in said and "write-exit=1" in said, said
        samples = await scrape(node)
        assert samples[("tuneplane_node_volume_fetched_bytes_total", ())] == len(layer), samples
        [entry] = (await node.ok("GET", "/node/v1/volumes"))["entries"]
        assert sorted(entry["in_use_by"]) == sorted(names), entry
    finally:
        await remove_directly(engine, names)


@pytest.mark.parametrize("engine", ENGINES)
async def test_an_oci_volume_of_the_password_registry_is_fetched_with_the_node_files_login(
    make_node: MakeNode, engine: str, login: dict[str, str], tmp_path: Path
) -> None:
    layer, words = artifact()
    pair = basic(login)
    source = await push(PRIVATE_REGISTRY, f"tuneplane-test/volume-{unique('p')}", [layer], pair)
    auth_file = tmp_path / "auth.json"
    auth_file.write_text(json.dumps({"auths": {PRIVATE_REGISTRY: {"auth": pair}}}))
    auth_file.chmod(0o600)
    anonymous = await make_node(
        engine, volume_insecure_hosts=[PRIVATE_REGISTRY], volume_allowed_networks=LOOPBACK
    )
    _, refused = await anonymous.launch(["/bin/true"], volumes=[{"source": source, "path": "/d"}],
                                        expect=502)  # fmt: skip
    assert "refused it without credentials (401)" in refused["detail"], refused
    node = await make_node(
        engine,
        volume_insecure_hosts=[PRIVATE_REGISTRY],
        registry_auth_file=auth_file,
        volume_allowed_networks=LOOPBACK,
    )
    names: list[str] = []
    try:
        ref, _ = await node.launch(
            ["/bin/sh", "-c", READ], volumes=[{"source": source, "path": "/data"}]
        )
        names.append(ref)
        said = await logged(node, ref, "write-exit=")
        assert words in said and "write-exit=1" in said, said
        assert login["password"] not in json.dumps(await node.state(ref))
    finally:
        await remove_directly(engine, names)
