"""What an operator reads of the engine's isolation (`check` and the daemon's start), and
the engine asked once (issue 52: the mutants of `jobs/rules/isolation.py` the decision
tests let live: every line `check` prints had only slow tests)."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tuneplane_node.errors import SandboxUnavailable, UsernsUnavailable
from tuneplane_node.jobs.rules.isolation import (
    CHOWNED,
    UNMAPPED,
    Isolation,
    IsolationRules,
    findings,
    registration,
    subid_ranges,
)
from tuneplane_node.jobs.words.launch import LaunchRequest
from tuneplane_node.runtime.facts import IsolationSupport
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings
from tuneplane_node.wire.values import LABEL_RUN_ID, Mount, Scratch

CRUN = IsolationSupport(
    default_runtime="crun", runtimes={"crun": ()}, per_job_userns=True, idmap_mounts=True
)
RUNC_11 = IsolationSupport(default_runtime="runc", runtimes={"runc": ()}, per_job_userns=True)
DOCKER = IsolationSupport(
    default_runtime="runc", runtimes={"runc": (), "runsc": ("--network=host", "--debug")}
)
OWN = "jobs: each gets its own user namespace (userns=auto, 65536 ids); writable mounts "


def rules(**settings: object) -> IsolationRules:
    return IsolationRules(NodeSettings(**settings))  # type: ignore[arg-type]


def said(
    support: IsolationSupport, engine: str = "podman", **settings: object
) -> list[tuple[bool | None, str]]:
    return findings(rules(**settings), support, engine=engine, local=False)


def test_an_engine_that_cannot_be_asked_is_one_warning() -> None:
    assert said(IsolationSupport(error="no answer")) == [
        (None, "jobs: cannot ask podman its runtimes: no answer")
    ]


def test_docker_lists_its_runtimes_and_a_registered_sandbox() -> None:
    assert said(DOCKER, "docker") == [
        (True, "jobs: docker runtimes: runc, runsc --network=host --debug (default runc)"),
        (None, "jobs: docker gives no job a user namespace of its own"),
        (True, "jobs: sandbox runsc (TUNEPLANE_JOB_SANDBOX=off; card jobs need --nvproxy)"),
    ]


@pytest.mark.parametrize(
    ("support", "settings", "line"),
    [
        (
            CRUN,
            {},
            (True, OWN + "id-mapped; card jobs keep the host's (TUNEPLANE_JOB_USERNS_CARDS=false)"),
        ),
        (CRUN, {"job_userns_cards": True}, (True, OWN + "id-mapped")),
        (RUNC_11, {"job_userns_cards": True}, (True, OWN + UNMAPPED["chown"])),
        (
            RUNC_11,
            {"job_userns_cards": True, "job_userns_writable": "host"},
            (True, OWN + UNMAPPED["host"]),
        ),
        (
            CRUN,
            {"job_userns": "off"},
            (None, "jobs: no user namespace of their own (TUNEPLANE_JOB_USERNS=off)"),
        ),
        (
            IsolationSupport(default_runtime="runsc", per_job_userns=True),
            {},
            (
                None,
                "jobs: podman runs every job under runsc: none gets a user namespace of its "
                "own, and card jobs need --nvproxy",
            ),
        ),
    ],
)
def test_the_user_namespace_line_says_what_each_job_gets(
    support: IsolationSupport, settings: dict[str, Any], line: tuple[bool | None, str]
) -> None:
    found = said(support, **settings)
    assert found[1] == line and len(found) == 2  # no sandbox asked nor registered


def test_a_sandbox_asked_of_an_engine_without_it_or_without_its_network_is_said() -> None:
    missing = said(CRUN, job_sandbox="cpu")
    assert missing[0] == (True, "jobs: podman runtimes: crun (default crun)")
    assert missing[2] == (
        False, f"jobs: TUNEPLANE_JOB_SANDBOX=cpu and podman has no runsc: {registration('runsc')}"
    )  # fmt: skip
    bare = IsolationSupport(default_runtime="runc", runtimes={"runsc": ()})
    assert said(bare, "docker", job_sandbox="all")[2] == (
        None,
        "jobs: runsc is registered without --network=host: gVisor refuses the engine's network "
        f"namespaces, every sandboxed launch would fail; {registration('runsc')}",
    )
    assert said(bare, "podman", job_sandbox="all")[2][0] is True  # podman's own stack
    assert said(IsolationSupport(), "podman")[0] == (
        True, "jobs: podman runtimes: none listed (default )"
    )  # fmt: skip


def test_subid_ranges_names_each_file_without_the_containers_range(tmp_path: Path) -> None:
    given, lacking, other = tmp_path / "subuid", tmp_path / "subgid", tmp_path / "gone"
    given.write_text("ada:100000:65536\ncontainers:2147483647:2147483648\n")
    lacking.write_text("ada:100000:65536\nxcontainers:1:2\n")
    assert subid_ranges((given, lacking, other)) == [str(lacking), str(other)]


class Engine:
    """The runtime's isolation word, as an engine answers it: counted."""

    name = "podman"

    def __init__(self, *answers: IsolationSupport) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def isolation_support(self) -> IsolationSupport:
        self.asked += 1
        return self.answers.pop(0)


async def test_the_engine_is_asked_until_it_answers_then_never_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tuneplane_node.jobs.rules.isolation")
    sandboxed = IsolationSupport(default_runtime="runc", runtimes={"runc": (), "runsc": ()})
    engine = Engine(IsolationSupport(error="starting"), sandboxed)
    settings = NodeSettings(job_sandbox="cpu", job_userns="off")  # type: ignore[call-arg]
    isolation = Isolation(settings, engine)  # type: ignore[arg-type]
    assert (await isolation.support()).error == "starting"
    assert caplog.records == []  # nothing said of an engine that did not answer
    assert await isolation.support() == sandboxed
    assert await isolation.support() == sandboxed and engine.asked == 2
    levels = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert levels == [
        (logging.INFO, "jobs: podman runtimes: runc, runsc (default runc)"),
        (logging.WARNING, "jobs: no user namespace of their own (TUNEPLANE_JOB_USERNS=off)"),
        (logging.INFO, "jobs: sandbox runsc (TUNEPLANE_JOB_SANDBOX=cpu; card jobs need --nvproxy)"),
    ]

    decided = await isolation.vet(plan(cards=0))
    assert decided.spec.runtime == "runsc"  # the rules, on its word
    with pytest.raises(SandboxUnavailable, match="the podman engine would run it under"):
        await Isolation(settings, Engine(IsolationSupport(default_runtime="runsc"))).vet(  # type: ignore[arg-type]
            plan(cards=1)
        )


def plan(*, cards: int) -> LaunchRequest:
    """A launch of that many cards, as the vet steps take it."""
    return LaunchRequest("r", cards, ContainerSpec(name="a", image="b"))


def launch(
    support: IsolationSupport, spec: ContainerSpec, cards: int = 0, **settings: object
) -> ContainerSpec:
    return rules(**settings).apply(spec, cards=cards, support=support, engine="podman")


SPEC = ContainerSpec(name="tuneplane-a", image="busybox", labels={LABEL_RUN_ID: "r1"})
WRITABLE = replace(SPEC, mounts=(Mount("/d", "/d"),))
AUTO = ", or TUNEPLANE_JOB_USERNS=auto"
NO_IDMAP = "mount it read-only, or give the engine runc 1.2 or later or crun"


@pytest.mark.parametrize(
    ("support", "spec", "settings", "message"),
    [
        (
            replace(RUNC_11, per_job_userns=False),
            SPEC,
            {"job_userns": "always"},
            "container: the podman engine gives no job a user namespace of its own, under "
            f"TUNEPLANE_JOB_USERNS=always; use podman, or docker's userns-remap{AUTO}",
        ),
        (
            replace(RUNC_11, default_runtime="runsc"),
            SPEC,
            {"job_userns": "always"},
            "container: the job runs under runsc, which podman gives no user namespace, under "
            f"TUNEPLANE_JOB_USERNS=always; TUNEPLANE_JOB_SANDBOX=off for jobs that need one{AUTO}",
        ),
        (
            replace(RUNC_11, runtime_version="1.1.5"),
            replace(SPEC, scratch=Scratch("/s", 2**30)),
            {"job_userns_writable": "refuse"},
            "container.scratch: container.scratch is writable and the engine's runtime (runc "
            "1.1.5) cannot id-map it, under TUNEPLANE_JOB_USERNS=always; "
            f"{NO_IDMAP}, or TUNEPLANE_JOB_USERNS_WRITABLE=chown",
        ),
        (
            RUNC_11,
            WRITABLE,
            {"job_userns": "always", "job_userns_writable": "host"},
            "container.mounts[0]: container.mounts[0] is writable and the engine's runtime "
            f"(runc) cannot id-map it, under TUNEPLANE_JOB_USERNS=always; {NO_IDMAP}{AUTO}",
        ),
    ],
)
def test_a_namespace_the_engine_cannot_give_is_refused_saying_why_and_the_fix(
    support: IsolationSupport, spec: ContainerSpec, settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(UsernsUnavailable) as refused:
        launch(support, spec, **settings)
    assert refused.value.message == message


def test_a_sandbox_the_engine_cannot_give_is_refused_saying_why() -> None:
    register = registration("runsc")
    for support, why in (
        (
            IsolationSupport(default_runtime="runc"),
            "the podman engine has no runtime runsc (it has none known)",
        ),
        (IsolationSupport(error="engine down"), "engine down"),
    ):
        with pytest.raises(SandboxUnavailable) as refused:
            launch(support, SPEC, job_sandbox="cpu")
        assert (
            refused.value.message
            == f"container.isolation: no sandbox runtime runsc for it: {why}; {register}"
        )
    under_runsc = IsolationSupport(default_runtime="runsc")  # podman's own runtime: no proxy
    with pytest.raises(SandboxUnavailable) as refused:
        launch(under_runsc, SPEC, cards=1, job_userns="off")
    assert refused.value.message == (
        "container.isolation: no sandbox runtime runsc for it: a job with cards needs its GPU "
        "proxy, and runsc (which the podman engine would run it under) is registered without "
        "--nvproxy; register it with --nvproxy=true once gVisor supports this machine's cards "
        "and driver (contrib/dev/gpu_check.py), or TUNEPLANE_JOB_SANDBOX=cpu on an engine whose "
        "own runtime is runc"
    )


def test_each_namespace_decision_with_a_note_is_logged_with_the_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tuneplane_node.jobs.rules.isolation")
    assert launch(RUNC_11, WRITABLE).own_userns
    remapped = launch(replace(RUNC_11, remaps_users=True), SPEC)
    assert remapped.userns_note == "the podman engine maps every job's users (its own namespace)"
    assert not remapped.own_userns
    records = [(r.getMessage(), r.ref, r.run_id, r.image) for r in caplog.records]  # type: ignore[attr-defined]
    assert records == [
        (f"launch tuneplane-a: its own user namespace: {CHOWNED}", "tuneplane-a", "r1", "busybox"),
        (
            f"launch tuneplane-a: keeps the host's user namespace: {remapped.userns_note}",
            "tuneplane-a", "r1", "busybox",
        ),
    ]  # fmt: skip
