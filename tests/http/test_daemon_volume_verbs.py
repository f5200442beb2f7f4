"""The volume store's verbs through the API, in front of the fake engine (issue 39):
``POST /node/v1/volumes/pull`` answers 200 present, 202 filling (with the fill's
progress), 507 ``volume_store_full`` before a byte, 502 ``volume_fill_failed`` when it
waits, 422 naming the field; ``POST /node/v1/volumes/gc`` evicts the least recently used
entry no job binds; ``GET /node/v1/volumes`` shows last use, users, pins and the store.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeFakeNode
from tests.fakes.runtime import FakeRuntime
from tests.scrapes import scrape
from tests.support.images import IMAGE
from tests.volumeserver import LOOPBACK, FileServer, sha256
from tuneplane_node.jobs.volumes.access import Accesses
from tuneplane_node.runtime.spec import ContainerSpec

DATA = os.urandom(2**20 + 3)
PULL = "/node/v1/volumes/pull"


def root_of(tmp_path: Path) -> Path:
    return tmp_path / "volumes"


def insecure(server: FileServer) -> dict[str, Any]:
    return {"volume_insecure_hosts": [server.host], "volume_allowed_networks": LOOPBACK}


def put(tmp_path: Path, data: bytes, used_at: float, *, source: str = "https://h/w") -> str:
    """An entry already in the store (as a past fill from ``source`` left it, its
    access recorded), last used at ``used_at``."""
    entries = root_of(tmp_path) / "sha256"
    entries.mkdir(parents=True, exist_ok=True)
    digest = sha256(data)
    (entries / digest).write_bytes(data)
    os.utime(entries / digest, (used_at, used_at))
    accesses = Accesses(root_of(tmp_path))
    accesses.record(digest, accesses.of(source))
    return digest


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"sha256": "a" * 64}, "source"),
        ({"source": "ftp://h/w", "sha256": "a" * 64}, "source"),
        ({"source": "https://h/w"}, "sha256"),
        ({"source": "https://h/w", "sha256": "xyz"}, "sha256"),
        ({"source": "https://h/w", "sha256": "a" * 64, "wait": "yes"}, "wait"),
        ({"source": "https://h/w", "sha256": "a" * 64, "path": "/w"}, "path"),
        ({"source": "http://10.0.0.1:80/w", "sha256": "a" * 64}, "source"),  # not listed
        ({"source": "https://h:99999/w", "sha256": "a" * 64}, "source"),
        ({"source": "https://:443/w", "sha256": "a" * 64}, "source"),
        # Hosts no DNS name spells are refused before any lookup (issue 52, the fuzzer's).
        ({"source": "https://ij\u2039wnl1|+rp/w", "sha256": "a" * 64}, "source"),
        ({"source": "https://ij|+rp.example/w", "sha256": "a" * 64}, "source"),
        ({"source": "https://127.1/w", "sha256": "a" * 64}, "source"),  # legacy inet_aton
        ({"source": "https://a..b/w", "sha256": "a" * 64}, "source"),
        ({"source": "https://-a.example/w", "sha256": "a" * 64}, "source"),
        ({"source": "https://[::zz]/w", "sha256": "a" * 64}, "source"),
    ],
)
async def test_a_bad_pull_is_a_422_naming_its_field(
    fake_node: MakeFakeNode, tmp_path: Path, body: dict[str, Any], field: str
) -> None:
    node = await fake_node(volume_root=root_of(tmp_path))
    status, answer = await node.call("POST", PULL, json=body)
    assert status == 422, answer
    assert answer["errors"][0]["field"] == field, answer


async def test_a_pull_of_an_entry_here_is_200_present_and_pins_it(
    fake_node: MakeFakeNode, tmp_path: Path
) -> None:
    digest = put(tmp_path, DATA, 100.0, source="https://h/w?sig=s3cr3t")
    node = await fake_node(volume_root=root_of(tmp_path))

    status, answer = await node.call(
        "POST", PULL, json={"source": "https://h/w?sig=s3cr3t", "sha256": f"sha256:{digest}"}
    )

    assert status == 200, answer
    assert (answer["phase"], answer["size_bytes"], answer["fill"]) == ("present", len(DATA), None)
    listed = await node.ok("GET", "/node/v1/volumes")
    [entry] = listed["entries"]
    assert entry["pin_expires_at"] == answer["pin_expires_at"], listed
    assert entry["in_use_by"] == [] and entry["phase"] == "present", entry
    store = listed["volume_store"]
    assert store["used_bytes"] == len(DATA) and store["total_bytes"] > 0, store
    assert (store["high_percent"], store["low_percent"]) == (85, 80), store


async def test_gc_evicts_the_least_recently_used_entry_no_job_binds_and_no_pin_holds(
    fake_node: MakeFakeNode, fake: FakeRuntime, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    oldest = put(tmp_path, b"a" * 1000, 100.0)
    bound = put(tmp_path, b"b" * 1000, 50.0)  # older still, but a job binds it
    pinned = put(tmp_path, b"c" * 1000, 10.0, source="https://h/c")
    newest = put(tmp_path, b"d" * 1000, 200.0)
    # Any real disk is above 1%: every entry no rule keeps goes.
    node = await fake_node(
        volume_root=root_of(tmp_path), volume_gc_high_percent=1, volume_gc_low_percent=0
    )
    spec = ContainerSpec(
        name="job-b", image=IMAGE, command=("sleep", "1"),
        labels={"tuneplane.run-id": "b", "tuneplane.volumes": bound},
    )  # fmt: skip
    await fake.run(spec)
    await node.ok("POST", PULL, json={"source": "https://h/c", "sha256": pinned})
    caplog.set_level(logging.INFO)

    run = await node.ok("POST", "/node/v1/volumes/gc", json={})

    assert [each["sha256"] for each in run["removed"]] == [oldest, newest], run
    assert run["freed_bytes"] == 2000 and run["volume_store"]["used_bytes"] == 2000, run
    listed = await node.ok("GET", "/node/v1/volumes")
    users = {each["sha256"]: each["in_use_by"] for each in listed["entries"]}
    assert users == {bound: ["job-b"], pinned: []}, listed
    assert f"audit: volume gc sha256={oldest} size_bytes=1000 by node: removed" in caplog.text
    samples = await scrape(node)
    assert samples[("tuneplane_node_volume_evictions_total", ())] == 2, samples
    status, answer = await node.call("POST", "/node/v1/volumes/gc", json={"x": 1})
    assert (status, answer["errors"][0]["field"]) == (422, "x"), answer


async def test_a_fill_that_cannot_fit_is_a_507_before_its_first_byte(
    fake_node: MakeFakeNode, file_server: FileServer, tmp_path: Path
) -> None:
    source = file_server.add("weights", DATA) + "?sig=s3cr3t"
    node = await fake_node(
        volume_root=root_of(tmp_path), volume_gc_high_percent=1, volume_gc_low_percent=0,
        **insecure(file_server),
    )  # fmt: skip

    status, answer = await node.call("POST", PULL, json={"source": source, "sha256": sha256(DATA)})

    assert (status, answer["code"]) == (507, "volume_store_full"), answer
    assert answer["needed_bytes"] == len(DATA) and answer["freeable_bytes"] is None, answer
    assert "s3cr3t" not in str(answer)
    assert file_server.sent["weights"] <= 1  # the size probe's byte at most: no body
    assert not (root_of(tmp_path) / "sha256" / sha256(DATA)).exists()


async def test_a_pull_is_202_filling_with_its_progress_then_present(
    fake_node: MakeFakeNode, file_server: FileServer, tmp_path: Path
) -> None:
    source = file_server.add("weights", DATA) + "?sig=s3cr3t"
    file_server.stall["weights"] = asyncio.Event()
    node = await fake_node(volume_root=root_of(tmp_path), **insecure(file_server))
    body = {"source": source, "sha256": sha256(DATA)}

    status, answer = await node.call("POST", PULL, json=body)

    assert (status, answer["phase"]) == (202, "filling"), answer
    fill = answer["fill"]
    assert (fill["bytes_total"], fill["waiting"], fill["phase"]) == (len(DATA), 1, "filling")
    assert "s3cr3t" not in str(answer)
    again = await node.call("POST", PULL, json=body)  # joins: one download
    assert again[0] == 202, again
    file_server.stall["weights"].set()
    status, answer = await node.call("POST", PULL, json={**body, "wait": True})
    assert (status, answer["phase"], answer["size_bytes"]) == (200, "present", len(DATA))
    assert file_server.sent["weights"] == len(DATA) + 1  # the body once, a probe's byte
    listed = await node.ok("GET", "/node/v1/volumes")
    assert listed["fills"] == [] and listed["entries"][0]["pin_expires_at"], listed
    samples = await scrape(node)
    assert samples[("tuneplane_node_volume_fetched_bytes_total", ())] == len(DATA), samples


async def test_a_fill_that_fails_while_the_pull_waits_is_a_502_and_stays_listed(
    fake_node: MakeFakeNode, file_server: FileServer, tmp_path: Path
) -> None:
    source = file_server.add("weights", DATA)
    file_server.wrong.add("weights")
    node = await fake_node(volume_root=root_of(tmp_path), **insecure(file_server))
    body = {"source": source, "sha256": sha256(DATA), "wait": True}

    status, answer = await node.call("POST", PULL, json=body)

    assert (status, answer["code"]) == (502, "volume_fill_failed"), answer
    assert "bytes do not match the sha256:" in answer["detail"], answer
    served = sha256(bytes([DATA[0] ^ 0xFF]) + DATA[1:])  # what the source sent hashes to
    [failed] = (await node.ok("GET", "/node/v1/volumes"))["fills"]
    assert (failed["phase"], failed["sha256"]) == ("failed", sha256(DATA)), failed
    assert "bytes do not match" in failed["error"], failed
    assert served not in str(answer) and served not in str(failed)  # issue 49, finding 1
    missing = await node.call(
        "POST", PULL, json={"source": file_server.url + "/nothing", "sha256": "e" * 64}
    )
    assert (missing[0], missing[1]["code"]) == (502, "volume_fill_failed"), missing
