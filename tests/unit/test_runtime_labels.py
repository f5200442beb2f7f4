"""The labels written on a job container read back to the facts they were written from:
labels are the truth a restarted node rebuilds every fact by (`runtime.labels`)."""

from __future__ import annotations

from ipaddress import IPv4Address

import pytest

from tuneplane_node.runtime import labels
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.runtime.labels import LABEL_RUN_ID, NODE_LABELS
from tuneplane_node.runtime.spec import ContainerSpec

DIGESTS = ("a" * 64, "b" * 64)


def written(*, own_userns: bool = True, userns_note: str = "chowned") -> dict[str, str]:
    """Every label a launch writes: the run id, the steps' (network, fabric address,
    staged mounts and volumes, fingerprint), then the runtime's of the spec."""
    staged = labels.with_network({LABEL_RUN_ID: "r"}, "fabric:ib0")
    staged = labels.with_fabric_address(staged, "10.9.0.7")
    staged = labels.with_staged(staged, mounts="k-1", volumes=[*DIGESTS, DIGESTS[0]])
    staged = labels.with_fingerprint(staged, "image=0a1b2c")
    spec = ContainerSpec(
        name="tuneplane-r", image="i", labels=staged, gpus=(3, 1), disk_limit_bytes=2**30,
        inode_limit=5000, own_userns=own_userns, userns_note=userns_note, runtime="runsc",
        warn_signal="SIGUSR1", warn_s=12.5,
    )  # fmt: skip
    return labels.job_labels(spec)


def test_every_label_written_reads_back_to_its_fact() -> None:
    state = ContainerState(name="tuneplane-r", exists=True, labels=written())
    assert set(state.labels) == set(NODE_LABELS)  # a new label comes with its reader here
    assert (state.run_id, state.ours, state.gpus) == ("r", True, (1, 3))
    assert (state.disk_limit_bytes, state.inode_limit) == (2**30, 5000)
    assert (state.userns, state.userns_note, state.runtime) == ("own", "chowned", "runsc")
    read = state.labels
    assert (labels.warn_signal_of(read), labels.warn_s_of(read)) == ("SIGUSR1", 12.5)
    assert labels.network_of(read) == "fabric:ib0"
    assert IPv4Address(labels.fabric_address_of(read) or "") == IPv4Address("10.9.0.7")
    assert (labels.mounts_of(read), labels.volumes_of(read)) == ("k-1", DIGESTS)
    assert labels.fingerprint_of(read) == "image=0a1b2c"
    assert labels.without_fingerprint(read).keys() == read.keys() - {labels.LABEL_SPEC}


@pytest.mark.parametrize(
    ("own", "note", "userns"),
    [(True, "", "own"), (False, "the engine cannot", "host"), (False, "", None)],
)
def test_the_user_namespace_reads_back_with_its_note(
    own: bool, note: str, userns: str | None
) -> None:
    state = ContainerState(name="a", exists=True, labels=written(own_userns=own, userns_note=note))
    assert (state.userns, state.userns_note or "") == (userns, note)


def test_what_a_launch_did_not_decide_reads_back_as_unknown() -> None:
    """A job of an older node, or one without limits, warning or volumes: no label, and
    no fact made up for it (never 0, never the operator's default)."""
    state = ContainerState(name="a", exists=True, labels={LABEL_RUN_ID: "r"})
    assert (state.disk_limit_bytes, state.inode_limit, state.runtime) == (None, None, None)
    assert labels.warn_signal_of(state.labels) is None
    assert labels.warn_s_of(state.labels) is None
    assert labels.network_of(state.labels) is None
    assert (labels.mounts_of(state.labels), labels.volumes_of(state.labels)) == ("", ())
    unstaged = labels.with_staged({}, mounts="k", volumes=())
    assert labels.volumes_of(unstaged) == () and labels.LABEL_VOLUMES not in unstaged


@pytest.mark.parametrize("label", ["x", "-1", "inf", "nan", ""])
def test_a_warning_time_that_is_no_finite_number_is_none(label: str) -> None:
    assert labels.warn_s_of({labels.LABEL_WARN_S: label}) is None
