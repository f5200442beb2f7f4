"""Every request of protocol 1, parsed into the job service's inputs.

Every parser raises `InvalidField` naming the field, so a bad request is a 422 the
console can act on, never a traceback and never a 502 blamed on the engine. Every
number has stated bounds, every string a length, every list a count. A launch may carry
exactly the fields of 0.3.15's ``ContainerSpec``, and ``""`` for the ones it leaves
empty; anything else is refused by name, so a typo never runs the image's own
entrypoint.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from tuneplane_node.clock import parse_rfc3339
from tuneplane_node.errors import InvalidField
from tuneplane_node.jobs.results import LaunchRequest
from tuneplane_node.runtime.base import (
    LABEL_RUN_ID,
    NODE_LABELS,
    ContainerSpec,
    Mount,
    container_name,
)
from tuneplane_node.sizes import MAX_SIZE, size_in_bytes  # SIZE: for the models

LAUNCH_FIELDS = ("run_id", "requested_gpus", "container")
CONTAINER_FIELDS = (
    "name",
    "image",
    "command",
    "env",
    "gpus",
    "mounts",
    "labels",
    "workdir",
    "shm_size",
    "cpu_limit",
    "memory_limit",
    "network",
    "user",
)
NETWORKS = ("host", "bridge", "none")
UNMOUNTABLE = "a job may not mount onto /, /etc, nor under /proc, /sys, /dev, /run/nvidia*"
ENGINE_LABELS = ("com.docker.", "io.containers.", "io.podman.", "org.opencontainers.")
MAX_REFS = 10_000
MAX_REF = 300
MAX_TAIL = 100_000
DEFAULT_TAIL = 2000
MAX_GPUS = 1024
MAX_CPUS = 10_000.0
MAX_ARGS = 4096
MAX_ENV = 1000
MAX_LABELS = 100
MAX_MOUNTS = 64
MAX_PATH = 4096
MAX_VALUE = 65536
MAX_KEY = 256  # an env variable's or a label's name
MAX_GRACE_S = 30 * 86400.0
MAX_REASON = 1024
"""The longest stop grace period a console may ask for: 30 days."""
MAX_AGE_S = 3650 * 86400.0
"""The oldest reap age a console may give: 10 years."""
MIN_MEMORY = 6 * 2**20  # the engines refuse less
MAX_EPOCH = 253402300799.0  # 9999-12-31T23:59:59Z: datetime's last second

NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,200}")
# Engines resolve a full id, then an exact name, then an id prefix: a name that looks
# like an id could reach a container that is not the node's.
LOOKS_LIKE_ID = re.compile(r"[0-9a-fA-F]{12,}")
DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?|\.[0-9]+")
USER = re.compile(r"[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,31}(:[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,31})?")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# The distribution reference grammar (github.com/distribution/reference): what the
# engines accept as an image, and nothing that reads as a flag, a path or a URL.
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME_PART = rf"(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"  # \w would take any letter: é
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE = re.compile(rf"(?P<name>{_NAME_PART})(?::{_TAG})?(?:@{_DIGEST})?")
MAX_IMAGE_NAME = 255


# --- launch -------------------------------------------------------------------------------


def parse_launch(body: Mapping[str, Any]) -> LaunchRequest:
    _known(body, LAUNCH_FIELDS, prefix="")
    run_id = _text(body, "run_id", required=True, limit=200)
    if CONTROL.search(run_id):
        raise InvalidField("run_id", "must not hold control characters")
    container = body.get("container")
    if not isinstance(container, Mapping):
        raise InvalidField("container", "required, an object")
    _known(container, CONTAINER_FIELDS, prefix="container.")
    gpus = _empty_as(container.get("gpus"), None)
    if gpus is not None and (not isinstance(gpus, list) or len(gpus) > MAX_GPUS):
        raise InvalidField("container.gpus", f"must be a list of at most {MAX_GPUS} card indices")
    requested = body.get("requested_gpus")
    if requested is None:  # 0.3.15 consoles may say it only through container.gpus
        requested = len(gpus or [])
    if not _is_int(requested) or not 0 <= requested <= MAX_GPUS:
        raise InvalidField("requested_gpus", f"must be a whole number from 0 to {MAX_GPUS}")
    return LaunchRequest(run_id, int(requested), parse_container(container, run_id))


def parse_container(body: Mapping[str, Any], run_id: str) -> ContainerSpec:
    labels = _labels(body, run_id)
    return ContainerSpec(
        name=_name(body) or container_name(run_id),
        image=_image(body),
        command=_argv(body.get("command")),
        env=_env(body),
        mounts=_mounts(body.get("mounts")),
        labels={**labels, LABEL_RUN_ID: run_id},
        workdir=_path(body, "container.workdir") or None,
        shm_size=_size(body, "container.shm_size", least=1),
        cpu_limit=_cpus(body.get("cpu_limit")),
        memory_limit=_size(body, "container.memory_limit", least=MIN_MEMORY),
        network=_network(body),
        user=_user(body),
    )


def _known(body: Mapping[str, Any], fields: tuple[str, ...], *, prefix: str) -> None:
    """Refuse a field the contract does not have: a typo must not pass unnoticed."""
    for key in body:
        if key not in fields:
            shown = key if key.isidentifier() else json.dumps(key)[:100]
            raise InvalidField(f"{prefix}{shown}", f"unknown field; known: {', '.join(fields)}")


def _key(field: str) -> str:
    return field.rsplit(".", 1)[-1]


def _empty_as(value: object, default: object) -> object:
    """0.3.15 consoles send every field, ``""`` for the ones they leave empty."""
    return default if value is None or value == "" else value


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


def _name(body: Mapping[str, Any]) -> str:
    name = _text(body, "container.name")
    if name and not NAME.fullmatch(name):
        raise InvalidField("container.name", "must match [a-zA-Z0-9][a-zA-Z0-9_.-]*")
    if name and LOOKS_LIKE_ID.fullmatch(name):
        raise InvalidField("container.name", "must not look like a container id (hex digits)")
    return name


def _image(body: Mapping[str, Any]) -> str:
    image = _text(body, "container.image", required=True, limit=1000)
    match = IMAGE_REFERENCE.fullmatch(image)
    if match is None or len(match.group("name")) > MAX_IMAGE_NAME:
        raise InvalidField(
            "container.image", "must be an image reference like registry/name:tag (lower case)"
        )
    return image


def _argv(value: object) -> tuple[str, ...]:
    value = _empty_as(value, [])
    # A string would need a shell to split it: the node never runs one.
    if not isinstance(value, list) or not all(isinstance(arg, str) for arg in value):
        raise InvalidField("container.command", "must be a list of strings (an argv)")
    if len(value) > MAX_ARGS or any("\x00" in arg or len(arg) > MAX_VALUE for arg in value):
        raise InvalidField(
            "container.command", f"at most {MAX_ARGS} arguments of {MAX_VALUE} characters"
        )
    if value and not value[0]:  # docker refuses it ("No command specified"): a 502 before
        raise InvalidField("container.command", "the program (the first argument) is empty")
    return tuple(value)


def _string_map(body: Mapping[str, Any], field: str, *, limit: int) -> dict[str, str]:
    value = _empty_as(body.get(_key(field)), {})
    if not isinstance(value, Mapping):
        raise InvalidField(field, "must be an object of strings")
    if len(value) > limit:
        raise InvalidField(field, f"at most {limit} entries")
    result = {}
    for key, item in value.items():
        if not 0 < len(key) <= MAX_KEY or "\x00" in key:
            raise InvalidField(field, f"keys must be 1 to {MAX_KEY} characters")
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise InvalidField(f"{field}.{key}", "must be a string")
        text = str(item)
        if len(text) > MAX_VALUE or "\x00" in text:
            raise InvalidField(f"{field}.{key}", f"at most {MAX_VALUE} characters, no NUL")
        result[str(key)] = text
    return result


def _labels(body: Mapping[str, Any], run_id: str) -> dict[str, str]:
    labels = _string_map(body, "container.labels", limit=MAX_LABELS)
    for key, value in labels.items():
        if key.startswith(ENGINE_LABELS):
            # Engine tooling acts on these (io.containers.autoupdate pulls and restarts).
            raise InvalidField(f"container.labels.{key}", "the engines' own namespace")
        if key in NODE_LABELS and (key, value) != (LABEL_RUN_ID, run_id):
            raise InvalidField("container.labels", f"{', '.join(NODE_LABELS)} are the node's")
    return labels


def _env(body: Mapping[str, Any]) -> dict[str, str]:
    env = _string_map(body, "container.env", limit=MAX_ENV)
    for key in env:
        if "=" in key:
            raise InvalidField(f"container.env.{key}", "a variable's name cannot hold '='")
    return env


def _mounts(value: object) -> tuple[Mount, ...]:
    value = _empty_as(value, [])
    if not isinstance(value, list) or len(value) > MAX_MOUNTS:
        raise InvalidField(
            "container.mounts",
            f"must be a list of at most {MAX_MOUNTS} [host, container, read_only]",
        )
    return tuple(_mount(entry, f"container.mounts[{i}]") for i, entry in enumerate(value))


def _mount(entry: object, field: str) -> Mount:
    if isinstance(entry, Mapping):
        entry = [entry.get("host"), entry.get("container"), entry.get("read_only", False)]
    if not isinstance(entry, list) or len(entry) not in (2, 3):
        raise InvalidField(field, "must be [host, container, read_only]")
    host, target, read_only = (*entry, False)[:3]
    for path in (host, target):
        if not _absolute(path):
            raise InvalidField(field, "host and container must be absolute paths without '..'")
    if not isinstance(read_only, bool):
        raise InvalidField(field, "read_only must be true or false")
    if not _mountable_target(target):
        raise InvalidField(field, f"{target}: {UNMOUNTABLE}")
    return Mount(host, target, read_only)


def _mountable_target(target: str) -> bool:
    """Not the root, not /etc itself (the engine writes hosts and resolv.conf into it), not
    the kernel's or the devices' trees, nor the NVIDIA runtime's sockets."""
    parts = [part for part in target.split("/") if part not in ("", ".")]
    if not parts or parts == ["etc"] or parts[0] in ("proc", "sys", "dev"):
        return False
    return not (parts[0] == "run" and len(parts) > 1 and parts[1].startswith("nvidia"))


def _absolute(path: object) -> bool:
    return (
        isinstance(path, str)
        and path.startswith("/")
        and len(path) <= MAX_PATH
        and "\x00" not in path
        and ".." not in path.split("/")
    )


def _path(body: Mapping[str, Any], field: str) -> str:
    path = _text(body, field, limit=MAX_PATH)
    if path and not _absolute(path):
        raise InvalidField(field, "must be an absolute path without '..'")
    return path


def _size(body: Mapping[str, Any], field: str, *, least: int) -> str | None:
    value = body.get(_key(field))
    if value is None or value == "":
        return None
    size = size_in_bytes(value)
    if size is None or not least <= size <= MAX_SIZE:
        raise InvalidField(
            field,
            f"must be a size like 512m, 16g or a number of bytes, from {least} bytes to 1 PiB",
        )
    return str(value).lower()


def _cpus(value: object) -> float | None:
    """A number of CPUs: a number, or 0.3.15's string (``""`` no limit, ``"2"``, ``"0.5"``)."""
    value = _empty_as(value, None)
    if value is None:
        return None
    if isinstance(value, str) and DECIMAL.fullmatch(value.strip()):
        value = float(value.strip())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidField("container.cpu_limit", 'must be a number of CPUs, like 2 or "0.5"')
    # Compared as given: an int of 400 digits would overflow a float.
    if not ((isinstance(value, int) or math.isfinite(value)) and 0 < value <= MAX_CPUS):
        raise InvalidField("container.cpu_limit", f"must be more than 0 and at most {MAX_CPUS:g}")
    return float(value)


def _network(body: Mapping[str, Any]) -> str:
    network = _text(body, "container.network", limit=100) or "host"
    if network not in NETWORKS:
        # container:<id> would join another container's namespaces: not a job's to ask.
        raise InvalidField("container.network", f"must be one of {', '.join(NETWORKS)}")
    return network


def _user(body: Mapping[str, Any]) -> str | None:
    user = _text(body, "container.user", limit=100)
    if user and not USER.fullmatch(user):
        raise InvalidField("container.user", "must be a user or uid, with :group or :gid")
    return user or None


# --- the other verbs ----------------------------------------------------------------------


def parse_refs(body: Mapping[str, Any]) -> list[str]:
    refs = body.get("refs")
    if not isinstance(refs, list) or not all(
        isinstance(ref, str) and 0 < len(ref) <= MAX_REF for ref in refs
    ):
        raise InvalidField("refs", f"required, a list of container names (1 to {MAX_REF} long)")
    if len(refs) > MAX_REFS:
        raise InvalidField("refs", f"at most {MAX_REFS} per call")
    return refs


def parse_ref(body: Mapping[str, Any]) -> str:
    return _text(body, "ref", required=True, limit=MAX_REF)


def parse_seconds(body: Mapping[str, Any], field: str, *, most: float) -> float | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidField(field, "must be a number of seconds")
    if not (isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= most:
        raise InvalidField(field, f"must be from 0 to {most:g} seconds")
    return float(value)


def parse_grace(body: Mapping[str, Any]) -> float | None:
    """A stop's ``timeout``: seconds between SIGTERM and SIGKILL."""
    return parse_seconds(body, "timeout", most=MAX_GRACE_S)


def parse_reason(body: Mapping[str, Any]) -> str | None:
    """A cordon's or drain's ``reason``, as the operator wrote it; none: None."""
    return _text(body, "reason", limit=MAX_REASON) or None


def parse_drain_grace(body: Mapping[str, Any]) -> float | None:
    """A drain's ``grace_s``: seconds between SIGTERM and SIGKILL for every job."""
    return parse_seconds(body, "grace_s", most=MAX_GRACE_S)


def parse_max_age(body: Mapping[str, Any]) -> float | None:
    """A reap's ``max_age_s``."""
    return parse_seconds(body, "max_age_s", most=MAX_AGE_S)


def parse_since(value: str | None) -> datetime | None:
    """``since``: an RFC 3339 time, or seconds since the epoch; none: the whole log."""
    if value is None or value == "":
        return None
    moment = parse_rfc3339(value) if "T" in value or "-" in value else None
    if moment is None and DECIMAL.fullmatch(value) and len(value) <= 20:
        moment = datetime.fromtimestamp(min(float(value), MAX_EPOCH), tz=timezone.utc)
    if moment is None:
        raise InvalidField("since", "must be an RFC 3339 time or seconds since the epoch")
    return moment


FOLLOW_WORDS = {"1": True, "true": True, "0": False, "false": False}


def parse_follow(value: str | None) -> bool:
    """``follow``: stream the log until the job exits; absent or empty: no."""
    if value is None or value == "":
        return False
    if value.lower() not in FOLLOW_WORDS:
        raise InvalidField("follow", "must be 1, true, 0 or false")
    return FOLLOW_WORDS[value.lower()]


def parse_tail(value: str | None) -> int:
    if value is None or value == "":
        return DEFAULT_TAIL
    # isascii: "²" is a digit to str.isdigit, and not a number to int().
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_TAIL:
        raise InvalidField("tail", f"must be a whole number from 1 to {MAX_TAIL}")
    return int(value)
