"""Each verb of the API as a `Call`: the request to send and how its answer is read. The
async and the sync client send the same calls, so a verb's request is written once."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tuneplane_node.client import answers

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    method: str
    path: str
    read: Callable[[Any], T]
    body: Mapping[str, Any] | None = None
    query: Mapping[str, str] | None = None
    wait_s: float = 0.0  # how long the node may hold it (a blocking query), beyond the timeout


def given(**fields: Any) -> dict[str, Any]:
    """The fields that are given (None: left out, as the node reads an absent field)."""
    return {name: value for name, value in fields.items() if value is not None}


def launch(
    run_id: str, container: Mapping[str, Any], requested_gpus: int | None = None
) -> Call[answers.Launched]:
    body = given(run_id=run_id, requested_gpus=requested_gpus, container=dict(container))
    return Call("POST", "/node/v1/launch", answers.Launched.of, body)


def observe(refs: Iterable[str]) -> Call[dict[str, answers.JobState]]:
    return Call("POST", "/node/v1/observe", answers.states, {"refs": list(refs)})


def stats(refs: Iterable[str] | None) -> Call[dict[str, answers.Usage]]:
    def read(answer: Mapping[str, Any]) -> dict[str, answers.Usage]:
        return {ref: answers.Usage.of(entry) for ref, entry in answer["stats"].items()}

    body = {} if refs is None else {"refs": list(refs)}
    return Call("POST", "/node/v1/stats", read, body)


def stop(
    ref: str,
    *,
    timeout: float | None = None,
    signal: str | int | None = None,
    warn_signal: str | int | None = None,
    warn_s: float | None = None,
) -> Call[None]:
    body = given(ref=ref, timeout=timeout, signal=signal, warn_signal=warn_signal, warn_s=warn_s)
    return Call("POST", "/node/v1/stop", _ok, body)


def signal(ref: str, sent: str | int) -> Call[None]:
    return Call("POST", "/node/v1/signal", _ok, {"ref": ref, "signal": sent})


def remove(ref: str) -> Call[None]:
    return Call("POST", "/node/v1/remove", _ok, {"ref": ref})


def logs(ref: str, *, tail: int | None = None, since: str | None = None) -> Call[answers.Logs]:
    query = given(ref=ref, tail=None if tail is None else str(tail), since=since)
    return Call("GET", "/node/v1/logs", answers.Logs.of, query=query)


def reap(max_age_s: float | None = None) -> Call[int]:
    return Call("POST", "/node/v1/reap", lambda a: int(a["removed"]), given(max_age_s=max_age_s))


def health() -> Call[answers.Health]:
    return Call("GET", "/node/v1/health", answers.Health.of)


def inventory() -> Call[answers.Inventory]:
    return Call("GET", "/node/v1/inventory", answers.Inventory.of)


def cordon(reason: str | None = None) -> Call[answers.NodeState]:
    return Call("POST", "/node/v1/cordon", answers.NodeState.of, given(reason=reason))


def drain(
    reason: str | None = None,
    *,
    grace_s: float | None = None,
    warn_signal: str | int | None = None,
    warn_s: float | None = None,
) -> Call[answers.NodeState]:
    body = given(reason=reason, grace_s=grace_s, warn_signal=warn_signal, warn_s=warn_s)
    return Call("POST", "/node/v1/drain", answers.NodeState.of, body)


def uncordon() -> Call[answers.NodeState]:
    return Call("POST", "/node/v1/uncordon", answers.NodeState.of, {})


def jobs(index: str | None = None, *, wait_s: float = 60.0) -> Call[answers.Jobs]:
    """Every job; with ``index``, a blocking query: what changed after that cursor. The
    node holds it up to ``wait_s`` and 1/16 of it more (its jitter)."""
    if index is None:
        return Call("GET", "/node/v1/jobs", answers.Jobs.of)
    query = {"index": index, "wait": f"{wait_s:g}"}
    return Call("GET", "/node/v1/jobs", answers.Jobs.of, query=query, wait_s=wait_s * 17 / 16)


def _ok(answer: Any) -> None:
    return None
