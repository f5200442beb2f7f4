"""Accesses: which request's right a kept volume is handed to (issue 49, the deputy).

A stored entry goes at once only to a request that fetches with an access it records;
what makes two requests one access is the whole of a URL (a signed URL's query is its
credential), or an OCI volume's repository and its credentials. Each test here is one
way a tenant could be handed another's bytes, or lose its own right across a restart.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tuneplane_node.jobs.volumes.access import MAX_KEPT, RECORDS, SALT_FILE, Accesses
from tuneplane_node.wire.values import RegistryAuth

SIGNED = "https://files.example/weights.tar?X-Amz-Signature=abc&X-Amz-Expires=600"
DIGEST = "a" * 64


def test_a_url_is_its_whole_text_query_included(tmp_path: Path) -> None:
    accesses = Accesses(tmp_path)
    assert accesses.of(SIGNED) == accesses.of(SIGNED)
    assert accesses.of(SIGNED) != accesses.of(SIGNED.replace("abc", "abd"))
    assert accesses.of(SIGNED) != accesses.of(SIGNED.split("?")[0])


def test_an_oci_volume_is_its_repository_and_its_credentials(tmp_path: Path) -> None:
    accesses = Accesses(tmp_path)
    alice = RegistryAuth(username="alice", password="s3cret-one")
    bob = RegistryAuth(username="bob", password="s3cret-two")
    repo = "registry.example/weights/llama"
    # the tag is not the right: the same repository's credentials are
    assert accesses.of(f"{repo}:v1", alice) == accesses.of(f"{repo}:v2", alice)
    assert accesses.of(f"{repo}:v1", alice) != accesses.of(f"{repo}:v1", bob)
    assert accesses.of(f"{repo}:v1", alice) != accesses.of(f"{repo}:v1")  # anonymous
    assert accesses.of(f"{repo}:v1", alice) != accesses.of("registry.example/other:v1", alice)
    # a URL and an OCI reference of one spelling are never one access
    assert accesses.of("https://registry.example/x") != accesses.of("registry.example/x")


def test_an_access_holds_no_secret_and_is_salted_per_store(tmp_path: Path) -> None:
    auth = RegistryAuth(username="alice", password="s3cret-one")
    here, there = Accesses(tmp_path / "a"), Accesses(tmp_path / "b")
    access = here.of("registry.example/weights:v1", auth)
    assert len(access) == 64 and "s3cret" not in access and "alice" not in access
    assert access != there.of("registry.example/weights:v1", auth)
    salt = tmp_path / "a" / SALT_FILE
    assert stat.S_IMODE(salt.stat().st_mode) == 0o600
    assert len(salt.read_bytes()) == 32


def test_the_salt_and_the_records_outlive_a_restart(tmp_path: Path) -> None:
    first = Accesses(tmp_path)
    access = first.of(SIGNED)
    first.record(DIGEST, access)
    again = Accesses(tmp_path)
    assert again.of(SIGNED) == access
    assert again.holds(DIGEST, access)
    assert not again.holds("b" * 64, access)
    record = tmp_path / RECORDS / DIGEST
    assert stat.S_IMODE(record.stat().st_mode) == 0o600


def test_an_entry_is_handed_to_what_it_recorded_only(tmp_path: Path) -> None:
    accesses = Accesses(tmp_path)
    mine, theirs = accesses.of(SIGNED), accesses.of(SIGNED + "x")
    assert not accesses.holds(DIGEST, mine)
    accesses.record(DIGEST, mine)
    accesses.record(DIGEST, mine)  # once
    assert accesses.recorded(DIGEST) == (mine,)
    assert accesses.holds(DIGEST, mine) and not accesses.holds(DIGEST, theirs)
    accesses.record(DIGEST, theirs)
    assert accesses.recorded(DIGEST) == (mine, theirs)
    assert Accesses(tmp_path).recorded(DIGEST) == (mine, theirs)


@pytest.mark.slow  # 67 records, each written and synced
def test_the_newest_are_kept_and_a_forgotten_entry_hands_over_nothing(tmp_path: Path) -> None:
    accesses = Accesses(tmp_path)
    made = [accesses.of(f"https://files.example/w?sig={n}") for n in range(MAX_KEPT + 3)]
    for access in made:
        accesses.record(DIGEST, access)
    assert accesses.recorded(DIGEST) == tuple(made[-MAX_KEPT:])
    assert Accesses(tmp_path).recorded(DIGEST) == tuple(made[-MAX_KEPT:])
    assert not accesses.holds(DIGEST, made[0])
    accesses.forget(DIGEST)
    assert not accesses.holds(DIGEST, made[-1])
    assert not (tmp_path / RECORDS / DIGEST).exists()
    assert Accesses(tmp_path).recorded(DIGEST) == ()
    accesses.forget(DIGEST)  # twice: nothing left to forget
    Accesses(tmp_path).forget("c" * 64)  # never read nor recorded


def test_a_record_file_of_other_lines_hands_over_nothing_else(tmp_path: Path) -> None:
    """A line that is not an access (cut short, or anything else) is no access."""
    accesses = Accesses(tmp_path)
    good = accesses.of(SIGNED)
    (tmp_path / RECORDS).mkdir(parents=True, exist_ok=True)
    (tmp_path / RECORDS / DIGEST).write_text(f"{good[:63]}\n\n{good}x\n{good}\n")
    assert Accesses(tmp_path).recorded(DIGEST) == (good,)
