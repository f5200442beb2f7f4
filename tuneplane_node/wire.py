"""The wire contract with the console: request parsing and response shapes. Pure data, no I/O.

Every parser raises `InvalidField` naming the field, so a bad request is a 422 the
console can act on, never a traceback.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tuneplane_node.errors import InvalidField
from tuneplane_node.runtime.base import (
    LABEL_GPUS,
    LABEL_RUN_ID,
    ContainerSpec,
    ContainerState,
    Mount,
    container_name,
)

PROTOCOL = 1
PROTOCOL_HEADER = "X-TunePlane-Node-Protocol"
MAX_BODY_BYTES = 1024 * 1024
MAX_REFS = 10_000
MAX_TAIL = 100_000
DEFAULT_TAIL = 2000
_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,200}$")
_SIZE = re.compile(r"^\d+(\.\d+)?[bkmgBKMG]?$")


@dataclass(frozen=True)
class LaunchRequest:
    run_id: str
    requested_gpus: int
    spec: ContainerSpec

    @property
    def ref(self) -> str:
        return self.spec.name


def parse_launch(body: Mapping[str, Any]) -> LaunchRequest:
    run_id = _text(body, "run_id", required=True, limit=200)
    container = body.get("container")
    if not isinstance(container, Mapping):
        raise InvalidField("container", "required, an object")
    gpus = container.get("gpus")
    if gpus is not None and not isinstance(gpus, list):
        raise InvalidField("container.gpus", "must be a list of card indices")
    requested = body.get("requested_gpus", len(gpus or []))
    if not _is_int(requested) or requested < 0:
        raise InvalidField("requested_gpus", "must be a whole number, 0 or more")
    return LaunchRequest(run_id, int(requested), parse_container(container, run_id))


def parse_container(body: Mapping[str, Any], run_id: str) -> ContainerSpec:
    name = _text(body, "container.name") or container_name(run_id)
    if not _NAME.match(name):
        raise InvalidField("container.name", "must match [a-zA-Z0-9][a-zA-Z0-9_.-]*")
    labels = _string_map(body, "container.labels")
    if LABEL_GPUS in labels or labels.get(LABEL_RUN_ID, run_id) != run_id:
        raise InvalidField("container.labels", f"{LABEL_GPUS} and {LABEL_RUN_ID} are the node's")
    return ContainerSpec(
        name=name,
        image=_text(body, "container.image", required=True, limit=1000),
        command=_argv(body.get("command")),
        env=_string_map(body, "container.env"),
        mounts=_mounts(body.get("mounts")),
        labels={**labels, LABEL_RUN_ID: run_id},
        workdir=_text(body, "container.workdir") or None,
        shm_size=_size(body, "container.shm_size"),
        cpu_limit=_cpus(body.get("cpu_limit")),
        memory_limit=_size(body, "container.memory_limit"),
        network=_text(body, "container.network") or "host",
        user=_text(body, "container.user") or None,
    )


def _key(field: str) -> str:
    return field.rsplit(".", 1)[-1]


def _text(body: Mapping[str, Any], field: str, *, required: bool = False, limit: int = 4096) -> str:
    value = body.get(_key(field))
    if value is None or value == "":
        if required:
            raise InvalidField(field, "required, a non-empty string")
        return ""
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        raise InvalidField(field, f"must be a string of at most {limit} characters")
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _argv(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    # A string would need a shell to split it: the node never runs one.
    if not isinstance(value, list) or not all(isinstance(arg, str) for arg in value):
        raise InvalidField("container.command", "must be a list of strings (an argv)")
    return tuple(value)


def _string_map(body: Mapping[str, Any], field: str) -> dict[str, str]:
    value = body.get(_key(field)) or {}
    if not isinstance(value, Mapping):
        raise InvalidField(field, "must be an object of strings")
    result = {}
    for key, item in value.items():
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise InvalidField(f"{field}.{key}", "must be a string")
        result[str(key)] = str(item)
    return result


def _mounts(value: object) -> tuple[Mount, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidField("container.mounts", "must be a list of [host, container, read_only]")
    return tuple(_mount(entry, f"container.mounts[{i}]") for i, entry in enumerate(value))


def _mount(entry: object, field: str) -> Mount:
    if isinstance(entry, Mapping):
        entry = [entry.get("host"), entry.get("container"), entry.get("read_only", False)]
    if not isinstance(entry, list) or len(entry) not in (2, 3):
        raise InvalidField(field, "must be [host, container, read_only]")
    host, target, read_only = (*entry, False)[:3]
    for path in (host, target):
        if not isinstance(path, str) or not path.startswith("/"):
            raise InvalidField(field, "host and container must be absolute paths")
    if not isinstance(read_only, bool):
        raise InvalidField(field, "read_only must be true or false")
    return Mount(host, target, read_only)


def _size(body: Mapping[str, Any], field: str) -> str | None:
    value = body.get(_key(field))
    if value is None or value == "":
        return None
    if _is_int(value) and value > 0:
        return str(value)
    if isinstance(value, str) and _SIZE.match(value):
        return value.lower()
    raise InvalidField(field, "must be a size like 512m, 16g or a number of bytes")


def _cpus(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidField("container.cpu_limit", "must be a number of CPUs")
    if not math.isfinite(value) or value <= 0:
        raise InvalidField("container.cpu_limit", "must be more than 0")
    return float(value)


def parse_refs(body: Mapping[str, Any]) -> list[str]:
    refs = body.get("refs")
    if not isinstance(refs, list) or not all(isinstance(ref, str) and ref for ref in refs):
        raise InvalidField("refs", "required, a list of container names")
    if len(refs) > MAX_REFS:
        raise InvalidField("refs", f"at most {MAX_REFS} per call")
    return refs


def parse_ref(body: Mapping[str, Any]) -> str:
    return _text(body, "ref", required=True, limit=300)


def parse_seconds(body: Mapping[str, Any], field: str) -> float | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidField(field, "must be a number of seconds")
    if not math.isfinite(value) or value < 0:
        raise InvalidField(field, "must be 0 or more seconds")
    return float(value)


def parse_tail(value: str | None) -> int:
    if value is None or value == "":
        return DEFAULT_TAIL
    if not value.isdigit() or not 1 <= int(value) <= MAX_TAIL:
        raise InvalidField("tail", f"must be a whole number from 1 to {MAX_TAIL}")
    return int(value)


def state_json(state: ContainerState) -> dict[str, Any]:
    return {
        "name": state.name,
        "exists": state.exists,
        "status": state.status if state.exists else None,
        "exit_code": state.exit_code,
        "labels": dict(state.labels),
        "created_at": state.created_at,
        "started_at": state.started_at,
        "finished_at": state.finished_at,
        "oom_killed": state.oom_killed,
    }
