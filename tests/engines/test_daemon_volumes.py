"""Volumes (issue 39) through the API on docker AND podman: launches naming one volume
that is not on the node answer ``phase: pulling`` at once, the file is downloaded once
for all of them (counted at the server), each job reads it and gets EROFS on write; a
fill of other bytes fails its launch with the reason and lets its cards go.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import MakeNode
from tests.engines.test_daemon_enginelock_engines import engine_settings_of, healthy
from tests.engines.test_daemon_mounts import post, remove_directly
from tests.engines.test_daemon_scratch import logged
from tests.scrapes import scrape
from tests.support.daemons import free_port, spawn_daemon
from tests.support.images import IMAGE
from tests.support.nodes import state_dir
from tests.volumeserver import LOOPBACK, FileServer, sha256
from tuneplane_node.jobs.mounts.staging import MountStaging
from tuneplane_node.jobs.volumes.access import Accesses
from tuneplane_node.jobs.words import partial_key

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]
# The scale (20 launches of one 500 MB volume) by hand: TUNEPLANE_TEST_VOLUME_
# LAUNCHES=20 TUNEPLANE_TEST_VOLUME_MIB=500; the suite runs 5 launches of 8 MiB.
LAUNCHES = int(os.environ.get("TUNEPLANE_TEST_VOLUME_LAUNCHES", "5"))
MIB = int(os.environ.get("TUNEPLANE_TEST_VOLUME_MIB", "8"))
DATA = os.urandom(MIB * 2**20 + 7)
READ = (
    "sha256sum /models/w; wc -c < /models/w; echo x > /models/w; echo write-exit=$?; exec sleep 300"
)


def insecure(server: FileServer) -> dict[str, object]:
    return {"volume_insecure_hosts": [server.host], "volume_allowed_networks": LOOPBACK}


def weights(server: FileServer) -> dict[str, str]:
    """DATA served as ``weights``, the volume naming it at /models/w."""
    source = server.add("weights", DATA) + "?sig=s3cr3t"  # a signed URL's token
    return {"source": source, "path": "/models/w", "sha256": sha256(DATA)}


@pytest.mark.parametrize("engine", ENGINES)
async def test_five_launches_of_one_volume_download_it_once_and_each_reads_it_read_only(
    make_node: MakeNode, file_server: FileServer, engine: str
) -> None:
    node = await make_node(engine, **insecure(file_server))
    volume = weights(file_server)
    file_server.stall["weights"] = asyncio.Event()  # held: every launch finds it missing
    names: list[str] = []
    try:
        for i in range(LAUNCHES):
            cards = int(i in (1, 3))
            ref, body = await node.launch(["/bin/sh", "-c", READ], gpus=cards, volumes=[volume])
            names.append(ref)
            assert body["phase"] == "pulling", body
        pending = await node.state(names[1])
        assert pending["pending_phase"] == "pulling", pending
        assert pending["pending_layers_total"] == 1, pending  # the volume: one progress
        # The cards of the pending launches are held: two of four.
        _, refused = await node.launch(["/bin/true"], gpus=3, expect=409)
        assert "reserved for pending launches" in refused["detail"], refused
        listed = await node.ok("GET", "/node/v1/volumes")
        [fill] = listed["fills"]
        assert (fill["sha256"], fill["waiting"], fill["bytes_total"]) == (
            sha256(DATA),
            LAUNCHES,
            len(DATA),
        ), fill
        assert fill["source"] == file_server.url + "/weights", fill  # no query: its token
        file_server.stall["weights"].set()
        for ref in names:  # every job hashes the whole file: minutes at the scale
            said = await logged(node, ref, "write-exit=", timeout=max(120, LAUNCHES * MIB))
            assert sha256(DATA) in said, said
            assert "Read-only file system" in said and "write-exit=1" in said, said
            assert f"{len(DATA)}" in said, said
        # One download for all of them: the body once, and one size probe's byte.
        assert file_server.sent["weights"] == len(DATA) + 1
        listed = await node.ok("GET", "/node/v1/volumes")
        assert listed["fills"] == [], listed
        assert [(e["sha256"], e["size_bytes"]) for e in listed["entries"]] == [
            (sha256(DATA), len(DATA))
        ], listed
        # Present now: a launch starts at once.
        ref, body = await node.launch(["/bin/sh", "-c", READ], volumes=[volume])
        names.append(ref)
        assert body.get("phase") != "pulling", body
    finally:
        await remove_directly(engine, names)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_fill_of_other_bytes_fails_its_launch_and_lets_its_cards_go(
    make_node: MakeNode, file_server: FileServer, engine: str
) -> None:
    node = await make_node(engine, **insecure(file_server))
    volume = weights(file_server)
    file_server.wrong.add("weights")
    file_server.stall["weights"] = asyncio.Event()
    names: list[str] = []
    try:
        ref, body = await node.launch(["/bin/true"], gpus=1, volumes=[volume])
        names.append(ref)
        assert body["phase"] == "pulling", body
        _, held = await node.launch(["/bin/true"], gpus=5, expect=409)  # more than there are
        assert "1 reserved for pending launches" in held["detail"], held
        file_server.stall["weights"].set()
        failed = await node.wait_for(ref, "pending_phase", "failed")
        assert "bytes do not match the sha256:" in failed["pending_error"], failed
        _, held = await node.launch(["/bin/true"], gpus=5, expect=409)
        assert "reserved for pending launches" not in held["detail"], held  # its card is free
    finally:
        await remove_directly(engine, names)


async def test_a_plain_http_volume_of_an_unlisted_host_is_a_422_naming_it(
    make_node: MakeNode, file_server: FileServer
) -> None:
    node = await make_node("docker")
    volume = {"source": file_server.add("w", DATA), "path": "/w", "sha256": sha256(DATA)}
    _, body = await node.launch(["/bin/true"], volumes=[volume], expect=422)
    assert body["errors"][0]["field"] == "container.volumes[0].source", body
    assert "TUNEPLANE_VOLUME_INSECURE_HOSTS" in body["detail"], body


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_fill_killed_at_half_resumes_after_a_restart_from_where_it_stopped(
    tmp_path: Path, file_server: FileServer, engine: str
) -> None:
    """The daemon SIGKILLed with half the file written; the console resubmits (a pending
    launch lives in memory only) and the restarted daemon asks for the rest with Range."""
    volume = weights(file_server)
    file_server.hold_after["weights"] = len(DATA) // 2
    settings = {
        **engine_settings_of(engine),
        "TUNEPLANE_DEV_SHARED_ENGINE": "true",
        "TUNEPLANE_VOLUME_INSECURE_HOSTS": json.dumps([file_server.host]),
        "TUNEPLANE_VOLUME_ALLOWED_NETWORKS": json.dumps(LOOPBACK),
    }
    port = free_port()
    run_id = f"volume-{os.getpid()}-{port}"
    container = {"image": IMAGE, "command": ["/bin/sh", "-c", READ], "volumes": [volume]}
    launch = {"run_id": run_id, "requested_gpus": 0, "container": container}
    daemon = spawn_daemon(tmp_path, port, settings_of=settings)
    try:
        await asyncio.to_thread(healthy, port, daemon, tmp_path / "serve.log")
        # Its name is the digest's and the URL's access (the store's salt is made at start).
        access = Accesses(state_dir(tmp_path) / "volumes").of(volume["source"])
        partial = state_dir(tmp_path) / "volumes" / "partial" / partial_key(sha256(DATA), access)
        status, body = await asyncio.to_thread(post, port, "/node/v1/launch", launch)
        assert (status, body.get("phase")) == (200, "pulling"), body
        await asyncio.wait_for(file_server.holding.wait(), 60)
        # Batches of at least a MiB are written: two of them are on disk before the hold.
        while not partial.exists() or partial.stat().st_size < 2**20 * 2:
            await asyncio.sleep(0.05)
        daemon.kill()
        await asyncio.to_thread(daemon.wait, 30)
        kept, sent = partial.stat().st_size, file_server.sent["weights"]
        file_server.stall["weights"].set()

        daemon = spawn_daemon(tmp_path, port, settings_of=settings)
        await asyncio.to_thread(healthy, port, daemon, tmp_path / "serve.log")
        status, body = await asyncio.to_thread(post, port, "/node/v1/launch", launch)
        assert status == 200, body
        ref = f"tuneplane-{run_id}"
        deadline = time.monotonic() + 120
        while True:
            _, observed = await asyncio.to_thread(post, port, "/node/v1/observe", {"refs": [ref]})
            if observed["states"][ref].get("status") == "running":
                break
            assert time.monotonic() < deadline, observed
            await asyncio.sleep(0.2)
        assert file_server.requests[-1] == ("weights", f"bytes={kept}-")
        assert file_server.sent["weights"] - sent == len(DATA) - kept + 1  # and a probe's byte
        entry = state_dir(tmp_path) / "volumes" / "sha256" / sha256(DATA)
        assert entry.read_bytes() == DATA and not partial.exists()
    finally:
        if daemon.poll() is None:  # removed through it: its staged mounts go too
            await asyncio.to_thread(post, port, "/node/v1/remove", {"ref": f"tuneplane-{run_id}"})
        daemon.terminate()
        await asyncio.to_thread(daemon.wait, 60)
        await remove_directly(engine, [f"tuneplane-{run_id}"])
        MountStaging(state_dir(tmp_path)).sweep(())


@pytest.mark.parametrize("engine", ["docker"])
async def test_an_entry_a_running_job_binds_survives_gc_and_an_unused_one_goes(
    make_node: MakeNode, tmp_path: Path, engine: str
) -> None:
    """Eviction reads the jobs' ``tuneplane.volumes`` labels back from the engine: the
    bound entry stays however old and however full the disk (any disk is above 1%)."""
    root = tmp_path / "volume-store"
    (root / "sha256").mkdir(parents=True)
    other = os.urandom(4096)
    for data, used_at in ((DATA, 1.0), (other, 2.0)):  # the bound one is the oldest
        (root / "sha256" / sha256(data)).write_bytes(data)
        os.utime(root / "sha256" / sha256(data), (used_at, used_at))
    accesses = Accesses(root)  # as the fill from that URL recorded it
    accesses.record(sha256(DATA), accesses.of("https://example.invalid/w"))
    node = await make_node(
        engine, volume_root=root, volume_gc_high_percent=1, volume_gc_low_percent=0
    )
    volume = {"source": "https://example.invalid/w", "path": "/models/w", "sha256": sha256(DATA)}
    names: list[str] = []
    try:
        ref, body = await node.launch(["/bin/sh", "-c", READ], volumes=[volume])
        names.append(ref)
        assert body.get("phase") != "pulling", body  # present: no fill, nothing fetched

        run = await node.ok("POST", "/node/v1/volumes/gc", json={})

        assert [each["sha256"] for each in run["removed"]] == [sha256(other)], run
        [entry] = (await node.ok("GET", "/node/v1/volumes"))["entries"]
        assert entry["sha256"] == sha256(DATA) and len(entry["in_use_by"]) == 1, entry
        said = await logged(node, ref, "write-exit=")
        assert sha256(DATA) in said and "write-exit=1" in said, said
        state = await node.state(ref)
        assert "tuneplane.volumes" not in str(state), state  # the node's own label: hidden
        samples = await scrape(node)
        assert samples[("tuneplane_node_volume_served_bytes_total", ())] == len(DATA), samples
        assert samples[("tuneplane_node_volume_evictions_total", ())] == 1, samples
    finally:
        await remove_directly(engine, names)


async def test_a_launch_whose_volume_cannot_fit_fails_with_the_reason_before_a_byte(
    make_node: MakeNode, file_server: FileServer
) -> None:
    """The size is known only once the server said it: the launch answers ``pulling``,
    then fails with ``volume_store_full``'s sentence, and nothing of the file came."""
    node = await make_node(
        "docker", volume_gc_high_percent=1, volume_gc_low_percent=0, **insecure(file_server)
    )  # any disk is above 1%: no room at all
    names: list[str] = []
    try:
        ref, body = await node.launch(["/bin/true"], gpus=1, volumes=[weights(file_server)])
        names.append(ref)
        assert body["phase"] == "pulling", body
        failed = await node.wait_for(ref, "pending_phase", "failed")
        assert "no room to fill volume" in failed["pending_error"], failed
        assert "s3cr3t" not in failed["pending_error"], failed
        assert file_server.sent["weights"] <= 1  # the size probe's byte at most
    finally:
        await remove_directly("docker", names)
