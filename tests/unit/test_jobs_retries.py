"""A launch of a run that exists, field by field (`jobs.retries`): a retry of the same
spec is the job, any field changed or added is a `409 run_conflict` naming it while the
job runs or is kept, and an exited job under ``relaunch`` runs the new spec.

Fast, on the node's own reading of launch bodies (issue 52: `run_conflict` had only slow
tests, and a retry adding ``isolation`` or ``volumes`` to a running job, planted as a
comparison of the recorded fields alone, was answered ``idempotent``)."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

import pytest

from tuneplane_node.errors import NameTaken, RunConflict
from tuneplane_node.jobs.launcher import launch_request
from tuneplane_node.jobs.retries import check_run, fingerprint, retried, stamped
from tuneplane_node.jobs.words import AlreadyExited, AlreadyRunning, LaunchRequest
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.wire.container import CONTAINER_FIELDS
from tuneplane_node.wire.requests import parse_launch
from tuneplane_node.wire.values import LABEL_RUN_ID, LABEL_SPEC

RUN = "ft-1"
BASE: dict[str, Any] = {"image": "registry.test/trainer:1", "command": ["/bin/train"]}
# Each field a console gives, added to BASE or changed from it.
CHANGES: dict[str, Any] = {
    "name": "ft-1-renamed",
    "image": "registry.test/trainer:2",
    "command": ["/bin/resume"],
    "env": {"STEPS": "100"},
    "mounts": [["/srv/data", "/data"]],
    "labels": {"tuneplane.user": "ada"},
    "workdir": "/work",
    "shm_size": "1g",
    "cpu_limit": 2,
    "memory_limit": "1g",
    "disk_limit": "20g",
    "inode_limit": 5000,
    "network": "bridge",
    "user": "1000",
    "stop_signal": "SIGUSR1",
    "warn_signal": "SIGUSR2",
    "warn_s": 60,
    "rdma": False,
    "read_only_root": True,
    "scratch": {"path": "/scratch", "size": "10g"},
    "volumes": [{"source": "https://models.example/w", "path": "/models/w", "sha256": "ab" * 32}],
    "isolation": "sandbox",
    "pull_policy": "always",
}
NOT_COMPARED = {
    "gpus": "read for requested_gpus alone, which is compared",
    "registry_auth": "a retry with rotated credentials asks for the same job",
}


def request(relaunch: bool = True, requested_gpus: int = 0, **container: Any) -> LaunchRequest:
    body = {"run_id": RUN, "container": {**BASE, **container}, "relaunch": relaunch}
    return stamped(launch_request(parse_launch({**body, "requested_gpus": requested_gpus})))


def job(status: str, exit_code: int | None = None) -> ContainerState:
    """The run's container as the engine shows it, made by BASE's launch."""
    labels = {**request().spec.labels, LABEL_RUN_ID: RUN}
    started = "2026-12-06T10:00:00Z"
    return ContainerState("tuneplane-ft-1", True, status, exit_code, labels, started_at=started)


def test_every_field_a_console_gives_is_compared_or_says_why_not() -> None:
    assert set(CHANGES) | set(NOT_COMPARED) == set(CONTAINER_FIELDS)


def test_the_same_spec_is_the_job_whatever_its_state() -> None:
    assert retried(job("running"), request()) == AlreadyRunning(())
    assert retried(job("exited", 3), request(relaunch=False)) == AlreadyExited(3)
    assert retried(job("exited", 3), request()) is None  # relaunched, as 0.3.15 did


@pytest.mark.parametrize("name", list(CHANGES))
def test_a_field_changed_or_added_is_a_conflict_naming_it_while_the_job_runs_or_is_kept(
    name: str,
) -> None:
    changed = request(**{name: CHANGES[name]})
    for state, asked in (
        (job("running"), changed),
        (job("exited", 3), replace(changed, relaunch=False)),
    ):
        with pytest.raises(RunConflict) as conflict:
            retried(state, asked)
        assert conflict.value.fields == (f"container.{name}",)
        assert conflict.value.status == 409 and conflict.value.code == "run_conflict"
    assert retried(job("exited", 3), changed) is None  # relaunch: the new spec runs


def test_other_cards_are_a_conflict_and_credentials_are_not() -> None:
    with pytest.raises(RunConflict) as conflict:
        retried(job("running"), request(requested_gpus=1))
    assert conflict.value.fields == ("requested_gpus",)
    auth = {"username": "ci", "password": "rotated-0123456789"}
    assert retried(job("running"), request(registry_auth=auth)) == AlreadyRunning(())


def test_another_runs_name_is_refused_before_any_spec_is_compared() -> None:
    state = job("running")
    foreign = ContainerState(state.name, True, "running", labels={LABEL_RUN_ID: "other-run"})
    with pytest.raises(NameTaken) as taken:
        retried(foreign, request())
    assert (taken.value.ref, taken.value.run_id) == ("tuneplane-ft-1", "other-run")


def test_several_fields_changed_are_named_in_the_requests_order() -> None:
    changed = request(requested_gpus=1, env={"A": "1"}, image="registry.test/trainer:2")
    with pytest.raises(RunConflict) as conflict:
        retried(job("running"), changed)
    assert conflict.value.fields == ("requested_gpus", "container.image", "container.env")
    assert conflict.value.run_id == RUN and conflict.value.ref == "tuneplane-ft-1"


def test_a_maps_order_and_a_default_left_out_are_the_same_spec() -> None:
    one = request(env={"A": "1", "B": "2"}, labels={"x": "1", "y": "2"})
    other = request(env={"B": "2", "A": "1"}, labels={"y": "2", "x": "1"})
    assert one.spec.labels[LABEL_SPEC] == other.spec.labels[LABEL_SPEC]
    assert request(isolation="").spec.labels[LABEL_SPEC] == request().spec.labels[LABEL_SPEC]
    assert request(volumes=[]).spec.labels[LABEL_SPEC] == request().spec.labels[LABEL_SPEC]


def test_wreckage_is_replaced_and_a_container_without_the_stamp_is_the_same_spec() -> None:
    """Wreckage (never started) ran no job: replaced whatever the spec. A container of an
    older node records no spec: taken as the same, as 0.3.15 did."""
    wreck = replace(job("created"), started_at=None)
    assert retried(wreck, request(relaunch=False, image="registry.test/trainer:2")) is None
    old = job("running")
    old = replace(old, labels={k: v for k, v in old.labels.items() if k != LABEL_SPEC})
    assert retried(old, request(image="registry.test/trainer:2")) == AlreadyRunning(())


def test_a_pending_launch_of_the_run_is_checked_as_a_container_is() -> None:
    """`check_run`: a launch of a run whose image is still pulling (no container yet)."""
    pending = request()
    check_run("tuneplane-ft-1", RUN, pending.spec.labels, pending)  # the same: nothing
    with pytest.raises(NameTaken) as taken:
        check_run("tuneplane-ft-1", "other-run", pending.spec.labels, pending)
    assert (taken.value.ref, taken.value.run_id) == ("tuneplane-ft-1", "other-run")
    with pytest.raises(RunConflict) as conflict:
        check_run("tuneplane-ft-1", RUN, pending.spec.labels, request(workdir="/w"))
    assert (conflict.value.ref, conflict.value.fields) == ("tuneplane-ft-1", ("container.workdir",))


def test_a_field_asked_only_when_given_is_recorded_only_when_given() -> None:
    """``isolation`` and ``volumes`` came after 0.3.15: a launch without them records no
    such field (a container of an older node is the same spec), and a retry leaving out
    one the run was launched with is a conflict naming it."""
    bare = fingerprint(request()).split()
    given = fingerprint(request(isolation="sandbox", volumes=CHANGES["volumes"])).split()
    named = {entry.partition("=")[0] for entry in given} - {e.partition("=")[0] for e in bare}
    assert named == {"container.isolation", "container.volumes"}
    sandboxed = request(isolation="sandbox")
    state = replace(job("running"), labels={**sandboxed.spec.labels, LABEL_RUN_ID: RUN})
    with pytest.raises(RunConflict) as conflict:
        retried(state, request())
    assert conflict.value.fields == ("container.isolation",)


def test_a_value_inside_a_map_changed_is_a_conflict() -> None:
    state = replace(
        job("running"), labels={**request(env={"A": "1"}).spec.labels, LABEL_RUN_ID: RUN}
    )
    with pytest.raises(RunConflict) as conflict:
        retried(state, request(env={"A": "2"}))
    assert conflict.value.fields == ("container.env",)


def test_the_digest_is_the_one_containers_of_earlier_releases_carry() -> None:
    """Sorted keys, no spaces: a container labelled before an upgrade stays the same spec."""
    entries = dict(
        e.partition("=")[::2] for e in fingerprint(request(env={"B": "2", "A": "1"})).split()
    )
    canonical = '{"A":"1","B":"2"}'
    assert entries["container.env"] == hashlib.sha256(canonical.encode()).hexdigest()[:12]
