"""The runtime contract's pure parts: names, labels, times, pull progress."""

from __future__ import annotations

import pytest

from tuneplane_node.runtime.base import (
    LABEL_ATTEMPT,
    LABEL_GPUS,
    LABEL_RUN_ID,
    ContainerState,
    PullProgress,
    container_name,
    format_gpus,
    parse_gpus,
    parse_time,
    pull_params,
)


def test_container_name_is_prefixed_and_safe() -> None:
    assert container_name("run-42.a_b") == "tuneplane-run-42.a_b"
    odd = container_name("user/run 1")
    assert odd.startswith("tuneplane-user-run-1-")
    assert odd != container_name("user-run-1")  # a changed id never collides with another
    assert len(container_name("x" * 500)) < 150


@pytest.mark.parametrize(
    ("label", "cards"),
    [("0,1,3", (0, 1, 3)), ("3,1,1", (1, 3)), ("", ()), (None, ()), (" 2 , x, -1", (2,))],
)
def test_gpu_label_parsing(label: str | None, cards: tuple[int, ...]) -> None:
    assert parse_gpus(label) == cards


def test_gpu_label_round_trips() -> None:
    assert format_gpus([3, 0, 3]) == "0,3"
    assert parse_gpus(format_gpus([5, 2])) == (2, 5)


def test_state_derived_fields() -> None:
    state = ContainerState(
        name="tuneplane-a",
        exists=True,
        status="created",
        labels={LABEL_RUN_ID: "a", LABEL_GPUS: "1,2", LABEL_ATTEMPT: "3"},
    )
    assert (state.run_id, state.gpus, state.attempt) == ("a", (1, 2), 3)
    assert state.never_started and state.live
    assert not ContainerState.missing("x").live


def test_engine_times_parse_with_nanoseconds_and_zero() -> None:
    moment = parse_time("2026-11-29T21:00:00.123456789Z")
    assert moment is not None and moment.microsecond == 123456
    assert parse_time("0001-01-01T00:00:00Z") is None
    assert parse_time("garbage") is None
    assert parse_time("2026-11-29T21:00:00.5+01:00") is not None


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
    progress = PullProgress()
    messages = [
        {"status": "Pulling from a/b", "id": "1"},
        {"status": "Pulling fs layer", "id": "l1"},
        {"status": "Pulling fs layer", "id": "l2"},
        {"status": "Downloading", "id": "l1", "progressDetail": {"current": 50, "total": 100}},
        {"status": "Downloading", "id": "l2", "progressDetail": {"current": 10, "total": 300}},
        {"status": "Download complete", "id": "l1"},
    ]
    moved = [progress.update(message) for message in messages]
    assert progress.snapshot() == (110, 400, 1, 2)
    assert moved[3] and moved[4] and moved[5]
    before = progress.moved
    assert progress.update({"status": "Extracting", "id": "l1", "progressDetail": {"current": 7}})
    assert progress.moved == before + 1  # extraction is progress for the stall deadline
    assert not progress.update({"status": "Waiting", "id": "l2"})
    progress.update({"status": "Pull complete", "id": "l1"})
    progress.update({"status": "Already exists", "id": "l2"})
    assert progress.snapshot()[2:] == (2, 2)
