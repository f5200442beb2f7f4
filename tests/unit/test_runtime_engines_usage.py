"""Where each running job's cgroup files are, remembered across the sampler's slices
(`runtime.engines.usage`): located once by an inspect, forgotten least recently read first."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tuneplane_node.runtime import cgroups
from tuneplane_node.runtime.engines import usage as engine_usage
from tuneplane_node.runtime.engines.usage import EngineUsage
from tuneplane_node.runtime.facts import Usage


class Seam:
    """The engine's answers: every ref a running container; the inspects counted."""

    def __init__(self) -> None:
        self.inspected: list[str] = []

    def document(self, ref: str) -> dict[str, Any]:
        self.inspected.append(ref)
        return {"Id": ref, "State": {"Running": True, "Pid": 42}}

    def or_missing(self, missing: Any, fn: Any, *args: Any) -> Any:
        return fn(*args)


@pytest.fixture
def seam(monkeypatch: pytest.MonkeyPatch) -> Seam:
    def locate(pid: int, *, must_hold: str) -> cgroups.CgroupDirs:
        return cgroups.CgroupDirs(False, Path(must_hold), Path(must_hold), Path(must_hold))

    monkeypatch.setattr(cgroups, "locate", locate)
    monkeypatch.setattr(cgroups, "read", lambda dirs: Usage(pids=1))
    return Seam()


def test_a_slice_read_keeps_the_other_slices_located(seam: Seam) -> None:
    reader = EngineUsage(seam, lambda ref: {})  # type: ignore[arg-type]
    for _ in range(3):  # three samples, each in two slices
        assert set(reader._usage_all(["a", "b"])) == {"a", "b"}
        assert set(reader._usage_all(["c"])) == {"c"}
    assert seam.inspected == ["a", "b", "c"]  # located once each, never again


def test_past_its_bound_the_least_recently_read_is_located_again(
    seam: Seam, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_usage, "LOCATED_MAX", 2)
    reader = EngineUsage(seam, lambda ref: {})  # type: ignore[arg-type]
    for refs in (["a"], ["b"], ["a"], ["c"], ["b"], ["c"]):
        assert list(reader._usage_all(refs)) == refs
    assert seam.inspected == ["a", "b", "c", "b"]  # b was the least recently read at c
