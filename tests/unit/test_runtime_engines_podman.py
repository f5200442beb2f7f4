"""The podman runtime's create, without an engine: a job network's rules are written
while the container is made, and hold before the create answers (the job's start comes
after it), whether the container was made or not."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.engines import engine_settings
from tuneplane_node.runtime.engines.networks.jobnetwork import ISOLATED
from tuneplane_node.runtime.engines.podman import PodmanRuntime
from tuneplane_node.runtime.spec import ContainerSpec

SPEC = ContainerSpec(name="tuneplane-r1", image="trainer:1", command=("true",), network=ISOLATED)


class Networks:
    """`JobNetworks`' part the create uses, saying what happened in ``order``."""

    def __init__(self, order: list[str]) -> None:
        self.order = order

    @contextlib.contextmanager
    def launching(self, container: str) -> Iterator[None]:
        yield

    def make(self, spec: ContainerSpec) -> Any:
        self.order.append("network made, its rules begun")
        return lambda: self.order.append("rules held")

    def forget(self, container: str) -> None:
        self.order.append("network removed")


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> PodmanRuntime:
    made = PodmanRuntime(engine_settings("podman"))
    made.__dict__["networks"] = Networks([])  # the cached property, given
    return made


def test_the_rules_hold_before_the_create_answers(
    runtime: PodmanRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = runtime.networks.order  # type: ignore[attr-defined]
    monkeypatch.setattr(runtime, "_create_container", lambda spec: order.append("container"))
    runtime._create(SPEC)
    assert order == ["network made, its rules begun", "container", "rules held"]


def test_a_failed_create_waits_for_the_rules_before_removing_the_network(
    runtime: PodmanRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    order: list[str] = runtime.networks.order  # type: ignore[attr-defined]

    def refused(spec: ContainerSpec) -> None:
        raise RuntimeError("the engine refused the create")

    monkeypatch.setattr(runtime, "_create_container", refused)
    with pytest.raises(RuntimeError, match="refused the create"):
        runtime._create(SPEC)
    assert order == ["network made, its rules begun", "rules held", "network removed"]
