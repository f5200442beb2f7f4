"""A launch of a run that exists, field by field (`jobs.retries`): a retry of the same
spec is the job, any field changed or added is a `409 run_conflict` naming it while the
job runs or is kept, and an exited job under ``relaunch`` runs the new spec.

Fast, on the node's own reading of launch bodies (issue 52: `run_conflict` had only slow
tests, and a retry adding ``isolation`` or ``volumes`` to a running job, planted as a
comparison of the recorded fields alone, was answered ``idempotent``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tuneplane_node.errors import NameTaken, RunConflict
from tuneplane_node.jobs.launcher import launch_request
from tuneplane_node.jobs.retries import retried, stamped
from tuneplane_node.jobs.words import AlreadyExited, AlreadyRunning, LaunchRequest
from tuneplane_node.runtime.base import ContainerState
from tuneplane_node.wire.requests import CONTAINER_FIELDS, parse_launch
from tuneplane_node.wire.values import LABEL_RUN_ID

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
    with pytest.raises(NameTaken):
        retried(foreign, request())
