"""Docker-format documents read into the contract: inspect, list, events, pull progress.

The documents are trimmed copies of what docker 20.10 and podman 4's compat endpoints
answer; the adapters' real-engine tests check the same fields come back alive.
"""

from __future__ import annotations

import io
from typing import Any

import pytest

from tuneplane_node.runtime.base import Brief, EngineEvent, PullProgress
from tuneplane_node.runtime.engines.dockerformat import (
    LogFold,
    ProgressFold,
    brief_from_list,
    event_from_docker,
    event_labels,
    image_from_inspect,
    json_lines,
    log_pieces,
    names_by_digest,
    pull_params,
    state_from_inspect,
)
from tuneplane_node.runtime.facts import ImageInfo

DOCKER_EXITED = {
    "Id": "f" * 64,
    "Created": "2026-11-29T21:21:54.164779123Z",
    "Name": "/tuneplane-r1",
    "State": {
        "Status": "exited",
        "ExitCode": 137,
        "OOMKilled": True,
        "StartedAt": "2026-11-29T21:21:54.333280456Z",
        "FinishedAt": "2026-11-29T21:22:04.305352789Z",
    },
    "Config": {"Labels": {"tuneplane.run-id": "r1", "tuneplane.gpus": "0,1"}},
}


def test_an_exited_container_reads_with_its_code_times_and_labels() -> None:
    state = state_from_inspect(DOCKER_EXITED)

    assert (state.name, state.status, state.exit_code, state.oom_killed) == (
        "tuneplane-r1",
        "exited",
        137,
        True,
    )
    assert state.created_at == "2026-11-29T21:21:54.164779Z"
    assert state.started_at == "2026-11-29T21:21:54.333280Z"
    assert state.finished_at == "2026-11-29T21:22:04.305352Z"
    assert (state.run_id, state.gpus, state.id) == ("r1", (0, 1), "f" * 64)


def test_a_running_container_has_no_exit_code_and_no_finish() -> None:
    running = {
        "Name": "/a",
        "State": {"Status": "running", "ExitCode": 0, "FinishedAt": "0001-01-01T00:00:00Z"},
    }
    state = state_from_inspect(running)
    assert (state.status, state.exit_code, state.finished_at) == ("running", None, None)
    assert state.labels == {}


@pytest.mark.parametrize(
    ("libpod", "docker"),
    [("configured", "created"), ("initialized", "created"), ("stopped", "exited")],
)
def test_libpods_own_words_read_as_dockers(libpod: str, docker: str) -> None:
    state = state_from_inspect({"Name": "a", "State": {"Status": libpod, "ExitCode": 3}})
    assert state.status == docker
    assert state.exit_code == (3 if docker == "exited" else None)


def test_a_list_entry_gives_the_exit_code_from_its_status_line() -> None:
    entry = {
        "Id": "abc",
        "Names": ["/tuneplane-r1"],
        "State": "exited",
        "Status": "Exited (3) 2 minutes ago",
    }
    assert brief_from_list(entry) == Brief("abc", "tuneplane-r1", ("exited", 3))
    running = {"Id": "def", "Names": ["/x"], "State": "running", "Status": "Up 2 seconds"}
    assert brief_from_list(running).signature == ("running", None)
    assert brief_from_list({"Id": "g", "State": "configured"}).signature == ("created", None)


def test_a_list_entry_gives_a_partial_state_with_its_labels_and_creation() -> None:
    entry = {
        "Id": "abc",
        "Names": ["/tuneplane-r1"],
        "State": "running",
        "Status": "Up 2 minutes",
        "Labels": {"tuneplane.run-id": "r1", "tuneplane.gpus": "0,1"},
        "Created": 1764496800,
    }
    state = brief_from_list(entry).partial_state()
    assert (state.name, state.id, state.status, state.gpus) == (
        "tuneplane-r1",
        "abc",
        "running",
        (0, 1),
    )
    assert state.created_at == "2025-11-30T10:00:00Z"
    assert state.started_at is None  # the list does not say: a read asks the engine


def test_a_die_event_carries_its_exit_code_and_time() -> None:
    event = event_from_docker(
        {
            "Action": "die",
            "id": "abc",
            "Actor": {"ID": "abc", "Attributes": {"exitCode": "137", "tuneplane.run-id": "r"}},
            "timeNano": 1_795_987_084_207_204_451,
        }
    )
    assert event == EngineEvent("abc", "die", 137, "2026-11-29T21:18:04.207204Z")
    assert event_from_docker({"status": "start", "id": "x"}) == EngineEvent("x", "start")
    assert event_labels({"Actor": {"Attributes": {"tuneplane.run-id": "r"}}}) == {
        "tuneplane.run-id": "r"
    }


@pytest.mark.parametrize(
    ("image", "params"),
    [
        ("busybox", {"fromImage": "busybox", "tag": "latest"}),
        ("127.0.0.1:5000/a/b", {"fromImage": "127.0.0.1:5000/a/b", "tag": "latest"}),
        ("127.0.0.1:5000/a/b:1", {"fromImage": "127.0.0.1:5000/a/b:1"}),
        ("a/b@sha256:00", {"fromImage": "a/b@sha256:00"}),
    ],
)
def test_an_untagged_pull_means_latest_not_every_tag(image: str, params: dict[str, str]) -> None:
    assert pull_params(image) == params


def test_pull_progress_counts_bytes_layers_and_extraction() -> None:
    fold = ProgressFold()
    messages: list[dict[str, Any]] = [
        {"status": "Pulling from a/b", "id": "1"},
        {"status": "Pulling fs layer", "id": "l1"},
        {"status": "Pulling fs layer", "id": "l2"},
        {"status": "Downloading", "id": "l1", "progressDetail": {"current": 50, "total": 100}},
        {"status": "Downloading", "id": "l2", "progressDetail": {"current": 10, "total": 300}},
        {"status": "Download complete", "id": "l1"},
    ]
    moved = [fold.update(message) for message in messages]
    assert fold.progress() == PullProgress(110, 400, 1, 2)
    assert moved[3] and moved[4] and moved[5]
    before = fold.moved
    assert fold.update({"status": "Extracting", "id": "l1", "progressDetail": {"current": 7}})
    assert fold.moved == before + 1  # extraction is progress for the stall deadline
    assert not fold.update({"status": "Waiting", "id": "l2"})
    fold.update({"status": "Pull complete", "id": "l1"})
    fold.update({"status": "Already exists", "id": "l2"})
    assert fold.progress()[2:] == (2, 2)


def test_messages_without_a_layer_are_not_progress() -> None:
    fold = ProgressFold()
    assert not fold.update({"status": "Digest: sha256:00"})
    assert not fold.update({"status": "Status: Downloaded newer image", "id": 5})
    assert fold.progress() == PullProgress() and fold.moved == 0


def test_podmans_streams_are_json_lines() -> None:
    lines = iter([b'{"status": "a"}', b"", b'{"status": "b"}'])
    assert list(json_lines(lines)) == [{"status": "a"}, {"status": "b"}]


# --- logs ------------------------------------------------------------------------------------

T = b"2026-11-30T12:00:00.000000001Z"


def entries(*lines: bytes, piece: int = 16) -> list[bytes]:
    """Lines as an engine streams them: each cut into pieces, each piece stamped."""
    out = []
    for n, line in enumerate(lines):
        stamp = T.replace(b"01Z", b"%02dZ" % n)
        out += [stamp + b" " + line[i : i + piece] for i in range(0, len(line), piece)]
    return out


def folded(items: list[bytes], *, keep: int = 100, max_bytes: int = 10_000) -> LogFold:
    fold = LogFold(keep=keep, max_bytes=max_bytes)
    for entry in items:
        fold.add(entry)
    return fold


def test_pieces_of_a_long_line_are_one_line_under_the_first_pieces_time() -> None:
    fold = folded(entries(b"short\n", b"a" * 40 + b"\n", b"end\n"))
    text = fold.text(skip_first=False)
    assert text.text.splitlines() == [
        f"{T.replace(b'01Z', b'00Z').decode()} short",
        f"{T.replace(b'01Z', b'01Z').decode()} {'a' * 40}",
        f"{T.replace(b'01Z', b'02Z').decode()} end",
    ]
    assert (fold.entries, fold.complete, text.truncated) == (5, 3, False)


def test_only_the_newest_lines_are_kept() -> None:
    fold = folded(entries(*(b"line %d\n" % n for n in range(10))), keep=3)
    assert [line.split(" ", 1)[1] for line in fold.text(skip_first=False).text.splitlines()] == [
        "line 7",
        "line 8",
        "line 9",
    ]
    assert not fold.truncated  # a tail is not a cut


def test_the_byte_cap_keeps_the_newest_and_says_it_cut() -> None:
    fold = folded(entries(*(b"x%d" % n + b"x" * 20 + b"\n" for n in range(10))), max_bytes=100)
    text = fold.text(skip_first=False)
    assert len(text.text.encode()) == 100 and text.truncated  # all the cap allows
    assert text.text.endswith("x9" + "x" * 20 + "\n")
    assert "x7" not in text.text  # older lines are gone, the oldest kept lost its front


def test_one_line_longer_than_the_cap_keeps_its_end() -> None:
    line = b"".join(b"%06d" % n for n in range(10_000)) + b"\n"  # 60 KB, every digit unique
    fold = folded(entries(line, piece=16 * 1024), max_bytes=1000)
    text = fold.text(skip_first=False)
    assert text.truncated and len(text.text) == 1000
    assert text.text.endswith("009999\n")
    assert len(fold.partial) == 0 and fold.size <= 1000  # memory never held the whole line


def test_a_read_that_may_begin_mid_line_drops_its_first_line() -> None:
    fold = folded([T + b" tail of an older line\n", T + b" whole\n"])
    assert fold.text(skip_first=True).text == f"{T.decode()} whole\n"
    assert fold.text(skip_first=False).text.count("\n") == 2


def test_an_unfinished_last_line_is_shown() -> None:
    fold = folded([T + b" done\n", T + b" still being writ"])
    assert fold.text(skip_first=False).text.endswith("still being writ")


def framed(*payloads: bytes) -> bytes:
    return b"".join(b"\x01\x00\x00\x00" + len(p).to_bytes(4, "big") + p for p in payloads)


def pieces_of(stream: bytes, piece: int = 64) -> list[bytes]:
    reader = io.BytesIO(stream)
    return list(log_pieces(reader.read, piece=piece))


def test_a_followed_stream_joins_a_long_line_as_a_logs_answer_does() -> None:
    stream = framed(b"T1 short\n", b"T2 " + b"x" * 100, b"T3 " + b"y" * 10 + b"\n", b"T4 end\n")
    text = b"".join(pieces_of(stream))
    assert text == b"T1 short\nT2 " + b"x" * 100 + b"y" * 10 + b"\nT4 end\n"
    assert max(map(len, pieces_of(stream, piece=16))) <= 16  # never a whole entry in memory


def test_a_followed_stream_cut_short_ends_with_what_came() -> None:
    cut = framed(b"T1 whole\n", b"T2 cut off\n")[:-5]
    assert b"".join(pieces_of(cut)) == b"T1 whole\nT2 cut"
    assert pieces_of(cut[:5]) == []  # mid-header


def test_an_image_id_reads_alike_from_docker_and_libpod() -> None:
    bare = "ab" * 32
    docker = image_from_inspect({"Id": f"sha256:{bare}", "Size": 5, "RepoTags": ["r/a:1"]})
    assert docker == ImageInfo(f"sha256:{bare}", 5, ("r/a:1",))
    assert state_from_inspect({"Image": bare}).image_id == f"sha256:{bare}"  # libpod's
    assert brief_from_list({"ImageID": f"sha256:{bare}"}).image_id == f"sha256:{bare}"
    assert image_from_inspect({"Id": "x", "Size": -1}).size_bytes is None


def test_a_digest_reference_names_an_image_only_by_its_own_repositorys_digest() -> None:
    """Issue 49, finding 3: podman resolves ``repo@sha256:...`` by the digest alone; a
    public name spelt with a private image's digest must not be that image."""
    digest = "sha256:" + "a" * 64
    info = ImageInfo("sha256:" + "1" * 64, digests=(f"127.0.0.1:5005/team/trainer@{digest}",))
    assert names_by_digest(f"127.0.0.1:5005/team/trainer@{digest}", info)
    assert not names_by_digest(f"docker.io/library/anything@{digest}", info)
    assert not names_by_digest(f"127.0.0.1:5005/team/trainer@sha256:{'b' * 64}", info)
    assert names_by_digest("docker.io/library/anything:1", info)  # a tag: the engine's


def test_an_images_cuda_requirement_is_kept_and_nothing_else_of_its_env() -> None:
    doc = {
        "Id": "sha256:" + "a" * 64,
        "Config": {"Env": ["PATH=/usr/bin", "CUDA_VERSION=12.4.1", "SECRET=x",
                           "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470"]},
    }  # fmt: skip
    info = image_from_inspect(doc)
    assert info.cuda_env == {
        "CUDA_VERSION": "12.4.1", "NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla,driver>=470"
    }  # fmt: skip
    assert image_from_inspect({"Id": "sha256:" + "b" * 64}).cuda_env == {}
