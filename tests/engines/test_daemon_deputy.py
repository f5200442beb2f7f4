"""The node as a deputy, on docker AND podman (issue 49): each finding of the issue run as
a hostile tenant would, against a daemon, is refused or harmless.

The "cloud" is this machine: a fake metadata service on 127.0.0.2 and one on another of
its addresses (a bridge's or the LAN's), each counting who connects; the tenants' servers
are https on 127.0.0.1 with a CA of the test's own (``TUNEPLANE_VOLUME_CA_FILE``), the
one network the daemon is told it may reach (``TUNEPLANE_VOLUME_ALLOWED_NETWORKS``); the
password registry is the dev one on 127.0.0.1:5005 (htpasswd, Basic).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeNode, open_runtime
from tests.deputy import Listener, Tenant, lan_address
from tests.engines.test_daemon_mounts import remove_directly
from tests.engines.test_daemon_scratch import logged
from tests.engines.test_daemon_volumes_oci_engines import (
    PRIVATE_REGISTRY,
    artifact,
    basic,
    push,
)
from tests.http.test_daemon_server import make_ca, make_cert
from tests.support.console import Console
from tests.support.jobs import unique
from tuneplane_node.jobs.volumes.possession import PROOF_BYTES, PROOF_RANGES

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]
TENANTS = ["127.0.0.1/32"]  # where the tenants' servers are; 127.0.0.2 stands for the node's
READ = "cat /v/w | sha256sum; exec sleep 300"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
async def ca(tmp_path: Path) -> Path:
    return make_ca(tmp_path, "tenants-ca")


@pytest.fixture
async def tenants(tmp_path: Path, ca: Path) -> AsyncIterator[list[Tenant]]:
    """Two tenants' https servers (B's first), closed at the end."""
    cert = make_cert(tmp_path, "tenant", ca, server=True)
    made = [Tenant(cert=cert, files={}, mine=os.urandom(200_000)) for _ in range(2)]
    for tenant in made:
        await tenant.start()
    yield made
    for tenant in made:
        await tenant.close()


@pytest.fixture
async def metadata() -> AsyncIterator[list[Listener]]:
    """Fake metadata services: on 127.0.0.2, and on another address of this machine."""
    made = [Listener(host) for host in ("127.0.0.2", lan_address()) if host is not None]
    for listener in made:
        await listener.start()
    yield made
    for listener in made:
        await listener.close()


async def deputy(make_node: MakeNode, engine: str, ca: Path, **more: Any) -> Console:
    return await make_node(engine, volume_allowed_networks=TENANTS, volume_ca_file=ca, **more)


async def failure_of(node: Console, volume: dict[str, str]) -> str:
    """The reason a launch naming ``volume`` failed (at once, or in its fill)."""
    status, body = await node.call("POST", "/node/v1/launch", json={
        "run_id": unique("deputy"), "requested_gpus": 0,
        "container": {"image": "tuneplane-test/busybox:1", "command": ["/bin/true"],
                      "volumes": [volume]},
    })  # fmt: skip
    if status != 200:
        return str(body["detail"])
    assert body["phase"] == "pulling", body
    failed = await node.failed(body["ref"])
    return str(failed["pending_error"])


@pytest.mark.parametrize("engine", ENGINES)
async def test_no_internal_answer_reaches_a_job_or_an_answer(
    make_node: MakeNode, engine: str, ca: Path, tenants: list[Tenant], metadata: list[Listener]
) -> None:
    """Finding 1: a redirect read the metadata service's answer into a job, and the
    failed fill told the hash that let the tenant launch again and bind it."""
    node = await deputy(make_node, engine, ca)
    [tenant, _] = tenants
    secret = sha256(b"secret-instance-role")  # what every fake metadata service answers
    refusals = (("http", "a redirect to plain http://"), ("https", "not one the node"))
    for listener in metadata:
        for scheme, refused in refusals:
            target = f"{scheme}://{listener.host}:{listener.port}/latest/meta-data/iam/"
            volume = {"source": f"{tenant.url}/redir?to={target}", "path": "/v", "sha256": secret}
            said = await failure_of(node, volume)
            assert refused in said, said
            assert listener.host not in said.replace(tenant.url, ""), said
    assert [listener.connections for listener in metadata] == [0] * len(metadata)
    # Loopback but the one listed network (the node's API, a registry there): refused.
    for target in (f"https://127.0.0.3:{metadata[0].port}/", f"https://[::1]:{metadata[0].port}/"):
        said = await failure_of(node, {"source": target, "path": "/v", "sha256": secret})
        assert "(loopback)" in said, said
    # Other bytes than asked: the answer and the list say so, never what they hash to.
    tenant.files["w"] = served = os.urandom(100_000)
    status, answer = await node.call("POST", "/node/v1/volumes/pull", json={
        "source": f"{tenant.url}/files/w", "sha256": "e" * 64, "wait": True,
    })  # fmt: skip
    assert (status, answer["code"]) == (502, "volume_fill_failed"), answer
    listed = await node.ok("GET", "/node/v1/volumes")
    assert sha256(served) not in str(answer) and sha256(served) not in str(listed)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_stored_volume_goes_only_to_a_source_that_shows_the_same_right(
    make_node: MakeNode, engine: str, ca: Path, tenants: list[Tenant]
) -> None:
    """Findings 4, 5 and 6: B's cookie does not serve A's fill; A squatting the public
    hash with a trickle holds only A's own launch; naming B's hash from a source that
    cannot show the bytes gets a 403, while a mirror proves them with a few ranges."""
    node = await deputy(make_node, engine, ca)
    b, a = tenants
    names: list[str] = []
    try:
        # B's signed URL, whose redirect sets the cookie its file needs: B's job reads it.
        mine = {"source": f"{b.url}/signed", "path": "/v/w", "sha256": sha256(b.mine)}
        ref, _ = await node.launch(["/bin/sh", "-c", READ], volumes=[mine])
        names.append(ref)
        assert sha256(b.mine) in await logged(node, ref, sha256(b.mine))
        # A names the cookie's file, and B's hash from nowhere: 403, nothing bound.
        for source in (f"{b.url}/mine", "https://no-such-host.invalid/x"):
            _, denied = await node.launch(volumes=[{**mine, "source": source}], expect=403)
            assert denied["code"] == "forbidden_volume" and sha256(b.mine) in denied["detail"]
        # A squats the public hash of weights B is about to use, with a trickle.
        weights = os.urandom(3 * 2**20)
        a.files["w"] = b.files["w"] = weights
        public = {"path": "/v/w", "sha256": sha256(weights)}
        squat, body = await node.launch(volumes=[{**public, "source": f"{a.url}/trickle"}])
        names.append(squat)
        assert body["phase"] == "pulling", body
        started = time.monotonic()
        ref, _ = await node.launch(
            ["/bin/sh", "-c", READ], volumes=[{**public, "source": f"{b.url}/files/w"}]
        )
        names.append(ref)
        assert sha256(weights) in await logged(node, ref, sha256(weights))
        assert time.monotonic() - started < 60  # its own fill: never the squatter's stall
        assert (await node.state(squat))["pending_phase"] == "pulling"  # A waits on A's
        # A mirror of the same weights proves it with a few ranges, and binds at once.
        mirror = Tenant(cert=b.cert, files={"w": weights})
        await mirror.start()
        try:
            ref, body = await node.launch(
                ["/bin/sh", "-c", READ], volumes=[{**public, "source": f"{mirror.url}/files/w"}]
            )
            names.append(ref)
            assert body.get("phase") != "pulling", body
            assert mirror.sent["/files/w"] <= PROOF_RANGES * PROOF_BYTES
        finally:
            await mirror.close()
    finally:
        await remove_directly(engine, names)


@pytest.mark.parametrize("engine", ENGINES)
async def test_one_tenants_registry_login_never_serves_another(
    make_node: MakeNode, engine: str, login: dict[str, str]
) -> None:
    """Finding 2: after B filled ``weights:1`` with its login, A without one read
    ``weights:2`` (B's login was sent for it), and that fill made the repository public."""
    repo = f"tuneplane-test/weights-{unique('w')}"
    pair = basic(login)
    layer, words = artifact()
    first = await push(PRIVATE_REGISTRY, repo, [layer], pair, tag="1")
    second = await push(PRIVATE_REGISTRY, repo, [artifact()[0]], pair, tag="2")
    node = await make_node(
        engine, volume_insecure_hosts=[PRIVATE_REGISTRY], volume_allowed_networks=TENANTS
    )
    names: list[str] = []
    try:
        ref, _ = await node.launch(
            ["/bin/sh", "-c", "cat /d/hello.txt; exec sleep 300"],
            image=f"{PRIVATE_REGISTRY}/tuneplane-test/trainer:1",
            registry_auth=login,
            volumes=[{"source": first, "path": "/d"}],
        )
        names.append(ref)
        assert words in await logged(node, ref, words)

        for tag in (second, first):  # B never fetched the second; the first is here
            _, refused = await node.launch(volumes=[{"source": tag, "path": "/d"}], expect=502)
            assert "refused it without credentials (401)" in refused["detail"], refused
        [entry] = (await node.ok("GET", "/node/v1/volumes"))["entries"]
        by_digest = f"{PRIVATE_REGISTRY}/{repo}@sha256:{entry['sha256']}"
        _, denied = await node.launch(volumes=[{"source": by_digest, "path": "/d"}], expect=403)
        assert denied["code"] == "forbidden_image", denied  # B's fill did not make it public
    finally:
        await remove_directly(engine, names)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_public_name_spelt_with_a_private_images_digest_is_not_that_image(
    make_node: MakeNode, engine: str, login: dict[str, str]
) -> None:
    """Finding 3: on podman ``docker.io/library/anything@sha256:<digest of a private
    image>`` resolved to that image by its digest alone; the name is not the image."""
    node = await make_node(engine)
    names: list[str] = []
    private = f"{PRIVATE_REGISTRY}/tuneplane-test/trainer:1"
    try:
        ref, _ = await node.launch(image=private, registry_auth=login)
        names.append(ref)
        await node.wait_for(ref, "status", "running", timeout=120)
        listed = await node.ok("GET", "/node/v1/images")
        [image] = [each for each in listed["images"] if each["image"] == private]
        digests = await digests_of(engine, image["id"])
        assert digests, image
        spelt = "docker.io/library/anything@" + digests[0].rpartition("@")[2]
        status, body = await node.call("POST", "/node/v1/launch", json={
            "run_id": unique("spelt"), "requested_gpus": 0,
            "container": {"image": spelt, "command": ["/bin/true"]},
        })  # fmt: skip
        if status == 200:  # not here: pulled from docker.io, which this machine cannot reach
            names.append(body["ref"])
            assert body["phase"] == "pulling", body
            failed = await node.failed(body["ref"])
            assert failed.get("exit_code") is None, failed
        else:
            assert body["code"] != "forbidden_image", body  # never asked about the other one
    finally:
        await remove_directly(engine, names)


async def digests_of(engine: str, image_id: str) -> list[str]:
    """The registry digests the engine holds for the image."""
    runtime = await open_runtime(engine)
    try:
        info = await runtime.image_info(image_id)
        return list(info.digests) if info is not None else []
    finally:
        await runtime.close()


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[Path]:
    """A 2 GiB ext4 of its own for the volume store (a sparse image, loop-mounted): its
    free space is what the test makes it."""
    image, root = tmp_path / "store.img", tmp_path / "store"
    with image.open("wb") as made:
        made.truncate(2 * 2**30)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    root.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(root)], check=True)
    try:
        yield root
    finally:
        subprocess.run(["umount", str(root)], check=True)


def allocated(path: Path, size: int) -> None:
    """A file of ``size`` bytes of blocks, written by nobody (fallocate: instant)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as made:
        os.posix_fallocate(made.fileno(), 0, size)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_size_claim_that_just_fits_evicts_nothing_its_bytes_did_not_need(
    make_node: MakeNode, engine: str, ca: Path, tenants: list[Tenant], small_store: Path
) -> None:
    """Finding 7: a size claim of the room left plus what eviction could free emptied the
    cache before the fill failed. Entries go as bytes come, 64 MiB ahead of them: a
    source that claims 350 MiB and sends a MiB at a time removes nothing."""
    mib = 2**20
    total = os.statvfs(small_store).f_blocks * os.statvfs(small_store).f_frsize
    cached = ["a" * 64, "b" * 64]  # two tenants' entries, 150 MiB each
    for digest in cached:
        allocated(small_store / "sha256" / digest, 150 * mib)
    used = total - os.statvfs(small_store).f_bavail * os.statvfs(small_store).f_frsize
    allocated(small_store / "other", total * 85 // 100 - used - 100 * mib)  # room: 100 MiB
    node = await deputy(make_node, engine, ca, volume_root=small_store)
    liar = tenants[1]
    liar.claims = 350 * mib  # fits only with both entries gone

    said = await failure_of(node, {"source": f"{liar.url}/liar", "path": "/v", "sha256": "e" * 64})

    assert "cannot be filled" in said, said
    assert sorted(path.name for path in (small_store / "sha256").iterdir()) == cached
    assert liar.sent["/liar"] >= mib  # it was admitted, and its bytes came
