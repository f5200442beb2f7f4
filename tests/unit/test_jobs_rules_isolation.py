"""The isolation rules' decisions (`jobs.rules.isolation`): a job's own user namespace, and a
sandboxed runtime, against what the engine says it can do."""

from __future__ import annotations

import pytest

from tuneplane_node.errors import InvalidField, SandboxUnavailable, UsernsUnavailable
from tuneplane_node.jobs.launcher import launch_request
from tuneplane_node.jobs.rules.isolation import IsolationRules
from tuneplane_node.runtime.engines.isolation import maps_mount_ids, registered
from tuneplane_node.runtime.facts import IsolationSupport
from tuneplane_node.runtime.labels import job_labels
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings
from tuneplane_node.wire.requests import parse_launch
from tuneplane_node.wire.values import LABEL_RUNTIME, LABEL_USERNS, Mount, Scratch

PODMAN_RUNC_11 = IsolationSupport(
    default_runtime="runc", runtime_version="runc version 1.1.5", runtimes={"runc": ()},
    per_job_userns=True,
)  # fmt: skip
PODMAN_CRUN = IsolationSupport(
    default_runtime="crun", runtimes={"crun": ()}, per_job_userns=True, idmap_mounts=True
)
DOCKER = IsolationSupport(
    default_runtime="runc", runtimes={"runc": (), "runsc": ("--network=host",)}
)
SPEC = ContainerSpec(name="tuneplane-a", image="busybox")
WRITABLE = ContainerSpec(name="tuneplane-a", image="busybox", mounts=(Mount("/d", "/d"),))


def rules(**settings: object) -> IsolationRules:
    return IsolationRules(NodeSettings(**settings))  # type: ignore[arg-type]


def decide(
    spec: ContainerSpec, support: IsolationSupport, cards: int = 0, **settings: object
) -> ContainerSpec:
    return rules(**settings).apply(spec, cards=cards, support=support, engine="podman")


def test_a_job_without_writable_mounts_gets_its_own_namespace() -> None:
    ro = ContainerSpec(name="a", image="b", mounts=(Mount("/d", "/d", read_only=True),))
    for spec in (SPEC, ro):
        decided = decide(spec, PODMAN_RUNC_11)
        assert decided.own_userns and job_labels(decided)[LABEL_USERNS] == "own"


SCRATCH = ContainerSpec(name="a", image="b", scratch=Scratch("/s", 2**30))


@pytest.mark.parametrize("spec", [WRITABLE, SCRATCH], ids=["mount", "scratch"])
@pytest.mark.parametrize("userns", ["auto", "always"])
def test_a_writable_mount_the_runtime_cannot_map_is_handed_to_the_jobs_own_namespace(
    spec: ContainerSpec, userns: str
) -> None:
    """Issue 51: one writable mount in a tenant's spec gave the job the host's namespace
    (root in the job root on the host's files); by default it keeps its own, and podman
    hands the mount to its range (``U``)."""
    decided = decide(spec, PODMAN_RUNC_11, job_userns=userns)
    assert decided.own_userns and decided.chown_mounts
    label = job_labels(decided)[LABEL_USERNS]
    assert label.startswith("own: its writable mounts are handed to its range")


def test_read_only_mounts_and_mapping_runtimes_are_never_chowned() -> None:
    ro = ContainerSpec(name="a", image="b", mounts=(Mount("/d", "/d", read_only=True),))
    for spec, support in ((ro, PODMAN_RUNC_11), (WRITABLE, PODMAN_CRUN)):
        decided = decide(spec, support)
        assert decided.own_userns and not decided.chown_mounts
        assert job_labels(decided)[LABEL_USERNS] == "own"


@pytest.mark.parametrize("userns", ["auto", "always"])
def test_refuse_is_a_409_naming_the_mount_and_the_fix(userns: str) -> None:
    with pytest.raises(UsernsUnavailable) as caught:
        decide(SCRATCH, PODMAN_RUNC_11, job_userns=userns, job_userns_writable="refuse")
    assert caught.value.status == 409 and caught.value.code == "userns_unavailable"
    assert "container.scratch" in caught.value.message
    assert "runc 1.2" in caught.value.message
    assert "TUNEPLANE_JOB_USERNS_WRITABLE=chown" in caught.value.message


def test_host_keeps_the_host_namespace_and_says_why_and_always_refuses_it() -> None:
    decided = decide(WRITABLE, PODMAN_RUNC_11, job_userns_writable="host")
    assert not decided.own_userns and not decided.chown_mounts
    label = job_labels(decided)[LABEL_USERNS]
    assert label.startswith("host: container.mounts[0]") and "runc version 1.1.5" in label
    with pytest.raises(UsernsUnavailable) as caught:
        decide(WRITABLE, PODMAN_RUNC_11, job_userns="always", job_userns_writable="host")
    assert "container.mounts[0]" in caught.value.message and "read-only" in caught.value.message


def test_no_field_of_a_launch_turns_a_boundary_off() -> None:
    """A tenant may ask for more isolation, never less: a sandbox the operator's rule
    gives is kept whatever the launch says, and no field names less."""
    plain = launch_spec({"isolation": ""}, mounts=[["/d", "/d"]])
    assert decide(plain, DOCKER, job_sandbox="all").runtime == "runsc"
    assert decide(plain, PODMAN_RUNC_11).own_userns  # its writable mount changes nothing
    for field, value in (("isolation", "none"), ("isolation", "runc"), ("userns", "host")):
        with pytest.raises(InvalidField, match=rf"^container\.{field}: "):
            launch_spec({field: value})


def launch_spec(fields: dict[str, object], **more: object) -> ContainerSpec:
    body = {"run_id": "r-1", "container": {"image": "busybox", **fields, **more}}
    return launch_request(parse_launch(body)).spec


def test_a_runtime_that_maps_mounts_gives_writable_mount_jobs_their_own_namespace() -> None:
    assert decide(WRITABLE, PODMAN_CRUN, job_userns="always").own_userns


def test_card_jobs_keep_the_host_namespace_unless_the_operator_says() -> None:
    decided = decide(SPEC, PODMAN_RUNC_11, cards=1)
    assert not decided.own_userns and "TUNEPLANE_JOB_USERNS_CARDS" in decided.userns_note
    assert decide(SPEC, PODMAN_RUNC_11, cards=1, job_userns_cards=True).own_userns


def test_off_is_todays_behaviour() -> None:
    decided = decide(SPEC, PODMAN_RUNC_11, job_userns="off")
    assert not decided.own_userns and LABEL_USERNS not in job_labels(decided)


def test_docker_gives_no_job_its_own_namespace_and_always_refuses() -> None:
    decided = decide(SPEC, DOCKER)
    assert not decided.own_userns and "no job a user namespace" in decided.userns_note
    with pytest.raises(UsernsUnavailable):
        decide(SPEC, DOCKER, job_userns="always")


@pytest.mark.parametrize(
    ("runtime", "version", "maps"),
    [
        ("runc", "runc version 1.1.5+ds1\ncommit: x", False),
        ("runc", "runc version 1.2.0", True),
        ("/usr/bin/crun", "", True),
        ("runsc", "1.2", False),
        ("runc", "", False),
    ],
)
def test_whether_a_runtime_maps_mount_ids_is_learnt_from_its_name_and_version(
    runtime: str, version: str, maps: bool
) -> None:
    assert maps_mount_ids(runtime, version) is maps


def test_the_cpu_rule_sandboxes_jobs_without_cards_only() -> None:
    sandboxed = decide(SPEC, DOCKER, job_sandbox="cpu")
    assert sandboxed.runtime == "runsc" and job_labels(sandboxed)[LABEL_RUNTIME] == "runsc"
    assert decide(SPEC, DOCKER, cards=1, job_sandbox="cpu").runtime is None
    assert decide(SPEC, DOCKER).runtime is None  # off


def test_a_launch_may_ask_for_the_sandbox_and_an_engine_without_it_is_a_409() -> None:
    asked = ContainerSpec(name="a", image="b", isolation="sandbox")
    assert decide(asked, DOCKER).runtime == "runsc"
    with pytest.raises(SandboxUnavailable) as caught:
        decide(asked, PODMAN_RUNC_11)
    assert caught.value.status == 409 and caught.value.code == "sandbox_unavailable"
    assert "runsc" in caught.value.message and "runtimeArgs" in caught.value.message


def test_a_card_job_under_the_sandbox_needs_the_gpu_proxy() -> None:
    with pytest.raises(SandboxUnavailable, match="--nvproxy"):
        decide(SPEC, DOCKER, cards=1, job_sandbox="all")
    proxied = IsolationSupport(default_runtime="runc", runtimes={"runsc": ("--nvproxy=true",)})
    assert decide(SPEC, proxied, cards=1, job_sandbox="all").runtime == "runsc"


def test_docker_runtimes_are_read_with_their_arguments() -> None:
    info = {
        "runc": {"path": "runc"},
        "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host"]},
    }
    assert registered(info) == {"runc": (), "runsc": ("--network=host",)}


PODMAN_RUNSC = IsolationSupport(
    default_runtime="runsc", runtimes={"runsc": ()}, per_job_userns=True
)  # a podman service whose own runtime is gVisor (podman --runtime runsc, containers.conf)


def test_a_podman_whose_runtime_is_the_sandbox_sandboxes_every_job_in_no_namespace() -> None:
    for rule in ("off", "cpu", "all"):
        decided = decide(SPEC, PODMAN_RUNSC, job_sandbox=rule)
        assert not decided.own_userns  # runsc under userns=auto fails at its start
        assert "runs under runsc" in decided.userns_note
    assert decide(SPEC, PODMAN_RUNSC, job_sandbox="all").runtime == "runsc"
    with pytest.raises(UsernsUnavailable) as caught:
        decide(SPEC, PODMAN_RUNSC, job_userns="always")
    assert "TUNEPLANE_JOB_SANDBOX=off" in caught.value.message


def test_a_card_job_on_a_podman_whose_runtime_is_the_sandbox_is_refused_without_its_proxy() -> None:
    for rule in ("off", "cpu"):  # the rule spares card jobs; the engine cannot
        with pytest.raises(SandboxUnavailable) as caught:
            decide(SPEC, PODMAN_RUNSC, cards=1, job_sandbox=rule)
        assert "--nvproxy" in caught.value.message and "podman" in caught.value.message
    proxied = IsolationSupport(
        default_runtime="runsc", runtimes={"runsc": ("--nvproxy=true",)}, per_job_userns=True
    )
    assert decide(SPEC, proxied, cards=1).runtime is None  # the engine's own: runsc
    assert decide(SPEC, PODMAN_RUNC_11, cards=1, job_sandbox="cpu").runtime is None
