"""The runtime contract's pure parts: names, labels, the states' derived facts."""

from __future__ import annotations

import pytest

from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.runtime.labels import job_labels, parse_gpus
from tuneplane_node.runtime.spec import ContainerSpec, format_gpus
from tuneplane_node.wire.values import LABEL_GPUS, LABEL_RUN_ID, container_name


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
        labels={LABEL_RUN_ID: "a", LABEL_GPUS: "1,2"},
    )
    assert (state.run_id, state.gpus) == ("a", (1, 2))
    assert state.never_started and state.live and state.ours
    assert not ContainerState.missing("x").live
    assert not ContainerState.missing("x").ours


def test_a_container_without_the_run_id_label_is_not_the_nodes() -> None:
    foreign = ContainerState(name="tuneplane-a", exists=True, status="running", labels={})
    assert foreign.live and not foreign.ours


@pytest.mark.parametrize("status", ["running", "created", "paused", "restarting"])
def test_live_statuses_hold_their_cards(status: str) -> None:
    assert ContainerState(name="a", exists=True, status=status).live


@pytest.mark.parametrize("status", ["exited", "dead", "removing", ""])
def test_other_statuses_hold_no_card(status: str) -> None:
    assert not ContainerState(name="a", exists=True, status=status).live


def test_every_runtime_writes_the_cards_label_from_the_spec() -> None:
    spec = ContainerSpec(name="a", image="i", gpus=(3, 1), labels={LABEL_RUN_ID: "r"})
    assert job_labels(spec) == {LABEL_RUN_ID: "r", LABEL_GPUS: "1,3"}
    # A label the console smuggled in cannot disagree with the devices.
    forged = ContainerSpec(name="a", image="i", gpus=(), labels={LABEL_GPUS: "0,1,2"})
    assert job_labels(forged)[LABEL_GPUS] == ""
