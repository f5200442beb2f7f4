"""Every request of protocol 1: each field declared once, and parsed into the job
service's inputs.

The parsers are the one source of the contract. Each field is a `Field` in the tables
at the end of each part (`LAUNCH` and its `CONTAINER`, then the other verbs' bodies):
its name, its value in JSON Schema, its line of documentation and, in the container,
its reader. `CONTAINER_FIELDS`, the OpenAPI document (`schema`) and docs/api.md all come
from those tables, and `tests/unit/test_wire_schema.py` holds each schema to its parser at
every bound. Chosen over pydantic models that validate: the parsers' exact refusals
(``container.mounts[1]``, ``container.env.<KEY>``, ``""`` read as not given, numbers
as strings) are what consoles act on, and a model would need a validator per field to
say them, the rules spelt a second time.

Every parser raises `InvalidField` naming the field, so a bad request is a 422 the
console can act on, never a traceback and never a 502 blamed on the engine; a verb's
parser (`parse_launch`, `parse_stop_body`, ...) reads every field through `Refusals`, so
its 422 lists every bad field, the first one's sentence as its ``detail``. Every verb
refuses a field its table does not have. Every number has stated bounds, every string
a length, every list a count. A launch may carry exactly the fields of 0.3.15's
``ContainerSpec``, and ``""`` for the ones it leaves empty; anything else is refused by
name, so a typo never runs the image's own entrypoint.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from tuneplane_node.clock import parse_rfc3339
from tuneplane_node.errors import (
    INVALID,
    MISSING,
    OUT_OF_RANGE,
    REPEATED,
    InvalidCursor,
    InvalidField,
)
from tuneplane_node.references import FULL_ID, ID_PREFIX, ImageName, names_an_id
from tuneplane_node.signals import JOB_SIGNALS
from tuneplane_node.signals import job_signal as job_signal  # ctl reads signals so too
from tuneplane_node.sizes import MAX_SIZE, SIZE, size_in_bytes
from tuneplane_node.wire.fields import (
    EMPTY,
    NO_NUL,
    Body,
    Field,
    Given,
    Refusals,
    Schema,
    anchored,
    closed_object,
    either,
    number,
    or_empty,
    or_null,
    text,
)
from tuneplane_node.wire.values import (
    DEFAULT_WAIT_S,
    IF_NOT_PRESENT,
    LABEL_RUN_ID,
    MAX_WAIT_S,
    NODE_LABELS,
    SANDBOX,
    Cursor,
    Launch,
    Mount,
    PrefetchRequest,
    RegistryAuth,
    Scratch,
    StopPlan,
    Volume,
)
from tuneplane_node.wire.values import PULL_POLICIES as PULL_POLICIES  # ctl's choices too

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
MAX_VOLUMES = 16
MAX_URL = 2048
URL = re.compile(r"https?://[\x21-\x7e]+")
SHA256 = re.compile(r"(?:sha256:)?([0-9a-f]{64})")
MAX_PATH = 4096
MAX_VALUE = 65536
MAX_KEY = 256  # an env variable's or a label's name
MAX_RUN_ID = 200
MAX_IMAGE = 1000
MAX_GRACE_S = 30 * 86400.0
MAX_REASON = 1024
"""The longest stop grace period a console may ask for: 30 days."""
MAX_AGE_S = 3650 * 86400.0
"""The oldest reap age a console may give: 10 years."""
MIN_MEMORY = 6 * 2**20  # the engines refuse less
MIN_DISK = 2**20
MIN_SCRATCH = 2**20
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
# No bracketed IPv6 host: docker 20.10's reference parser refuses one ("invalid reference
# format", which reached the console as a 502).
# A port the host can have: a larger one reaches the engine only to fail its dial.
_PORT = r"(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_DOMAIN = rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::{_PORT})?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME_PART = rf"(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"  # \w would take any letter: é
# A digest as the engines take it (go-digest): a hash they have, its length, lower-case hex;
# the grammar's looser form reaches the engine only to be refused there (a 502).
_DIGEST = r"(?:sha256:[0-9a-f]{64}|sha384:[0-9a-f]{96}|sha512:[0-9a-f]{128})"
IMAGE_REFERENCE = re.compile(rf"(?P<name>{_NAME_PART})(?::{_TAG})?(?:@{_DIGEST})?")
# An image id, which the engines run whoever pulled it: never an image a console names.
IMAGE_ID = rf"(?!{ID_PREFIX}|{FULL_ID.pattern}$)"
MAX_IMAGE_NAME = 255
"""The longest name the engines take, counted as they count it: after normalising."""
MAX_CREDENTIAL = 8192  # a cloud registry's identity token runs to a few KiB
MAX_USERNAME = 512
AUTH_FORMS = ({"username", "password"}, {"identity_token"})

# The same rules in JSON Schema, for the tables.
NO_CONTROL = f"^[^{CONTROL.pattern[1:-1]}]*$"
# An absolute path none of whose segments is "..": a segment is empty, ".", or does
# not start with "..", or is ".." followed by more.
_SEGMENT = r"(?:[^/.\x00][^/\x00]*|\.(?:[^/.\x00][^/\x00]*)?|\.\.[^/\x00]+)?"
ABSOLUTE_PATH = f"^/{_SEGMENT}(?:/{_SEGMENT})*$"
PATH = text(most=MAX_PATH, pattern=ABSOLUTE_PATH)
VALUE = text(most=MAX_VALUE)
SIZE_TEXT = {"type": "string", "pattern": anchored(SIZE.pattern)}  # its value: the doc
REF = text(most=MAX_REF, least=1)


def string_map(*, most: int, keys: str) -> Schema:
    """An object of strings (numbers are turned into strings) with at most ``most``
    entries, whose names match ``keys`` (propertyNames: patternProperties would let any
    other name through)."""
    names = {"minLength": 1, "maxLength": MAX_KEY, "pattern": keys}  # names: strings always
    shape = {"type": "object", "maxProperties": most, "propertyNames": names}
    return {**shape, "additionalProperties": {"anyOf": [VALUE, {"type": "number"}]}}


def mount_forms() -> Schema:
    """A bind mount: ``[host, container]``, ``[host, container, read_only]``, or an
    object of those keys (others ignored)."""
    flag = {"type": "boolean"}
    pair = {"type": "array", "minItems": 2, "maxItems": 2, "prefixItems": [PATH, PATH]}
    triple = {"type": "array", "minItems": 3, "maxItems": 3, "prefixItems": [PATH, PATH, flag]}
    keys = {"host": PATH, "container": PATH, "read_only": flag}
    named = {"type": "object", "properties": keys, "required": ["host", "container"]}
    return {"anyOf": [pair, triple, {**named, "additionalProperties": True}]}


def _named(names: tuple[str, ...]) -> str:
    return ", ".join(f"`{name}`" for name in names)


# --- launch -------------------------------------------------------------------------------


def parse_launch(body: Mapping[str, Any]) -> Launch:
    """The launch, every bad field of it refused in one 422 (the first named as before:
    unknown fields, ``run_id``, the container's unknown fields, ``gpus``,
    ``requested_gpus``, then `CHECKED`'s order)."""
    with Refusals() as refusals:
        refusals.unknown(body, LAUNCH)
        run_id = refusals.read(_run_id, body)
        container = body.get("container")
        if not isinstance(container, Mapping):
            problem = MISSING if container is None else INVALID
            refusals.refuse(InvalidField("container", "required, an object", problem=problem))
            raise refusals.error()  # nothing more to read
        refusals.unknown(container, CONTAINER, prefix="container.")
        # A bad run id is refused above; the container's readers still see what was sent.
        seen = run_id if run_id is not None else str(body.get("run_id") or "")
        gpus = refusals.read(_gpus, Given(container, "container.gpus", seen))
        requested = refusals.read(_requested_gpus, body.get("requested_gpus"), gpus)
        values = refusals.read(parse_container, container, seen)
        auth = refusals.read(_registry_auth, Given(container, "container.registry_auth", seen))
        policy = refusals.read(_pull_policy, Given(container, "container.pull_policy", seen))
        relaunch = refusals.read(_relaunch, body.get("relaunch"))
    return Launch(run_id, requested, values, auth=auth, pull_policy=policy, relaunch=relaunch)


def _relaunch(value: object) -> bool:
    """``true`` (the default, also for ``""`` and null) or ``false``."""
    value = _empty_as(value, True)
    if not isinstance(value, bool):
        raise InvalidField("relaunch", "must be true or false")
    return value


def _run_id(body: Mapping[str, Any]) -> str:
    run_id = _text(body, "run_id", required=True, limit=MAX_RUN_ID)
    if CONTROL.search(run_id):
        raise InvalidField("run_id", "must not hold control characters")
    return run_id


def _requested_gpus(requested: object, gpus: list[Any] | None) -> int:
    if requested is None:  # 0.3.15 consoles may say it only through container.gpus
        requested = len(gpus or [])
    whole = requested if isinstance(requested, int) and _is_int(requested) else None
    if whole is None or not 0 <= whole <= MAX_GPUS:
        problem = INVALID if whole is None else OUT_OF_RANGE
        why = f"must be a whole number from 0 to {MAX_GPUS}"
        raise InvalidField("requested_gpus", why, problem=problem)
    return whole


def parse_container(body: Mapping[str, Any], run_id: str) -> dict[str, Any]:
    """What the table's readers make of the container object, by the runtime spec's
    attribute names (the launcher makes the spec of them); every bad field of it
    refused at once."""
    with Refusals() as refusals:
        values = {
            field.name: refusals.read(field.read, Given(body, f"container.{field.name}", run_id))
            for field in CHECKED
            if field.read is not None
        }
    return values


def _key(field: str) -> str:
    return field.rsplit(".", 1)[-1]


def _empty_as(value: object, default: object) -> object:
    """0.3.15 consoles send every field, ``""`` for the ones they leave empty."""
    return default if value is None or value == "" else value


def _text(body: Mapping[str, Any], field: str, *, required: bool = False, limit: int = 4096) -> str:
    value = body.get(_key(field))
    if value is None or value == "":
        if required:
            raise InvalidField(field, "required, a non-empty string", problem=MISSING)
        return ""
    if not isinstance(value, str) or len(value) > limit or "\x00" in value:
        problem = OUT_OF_RANGE if isinstance(value, str) and len(value) > limit else INVALID
        raise InvalidField(
            field, f"must be a string of at most {limit} characters", problem=problem
        )
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# The container's readers, in the table's order.


def _name(given: Given) -> str:
    name = _text(given.body, given.field)
    if name and not NAME.fullmatch(name):
        raise InvalidField(given.field, "must match [a-zA-Z0-9][a-zA-Z0-9_.-]*")
    if name and LOOKS_LIKE_ID.fullmatch(name):
        raise InvalidField(given.field, "must not look like a container id (hex digits)")
    return name  # empty: the launcher names it after the run id


def _image(given: Given) -> str:
    image = _text(given.body, given.field, required=True, limit=MAX_IMAGE)
    match = IMAGE_REFERENCE.fullmatch(image)
    if match is None or len(ImageName.parse(match.group("name")).repository) > MAX_IMAGE_NAME:
        raise InvalidField(
            given.field, "must be an image reference like registry/name:tag (lower case)"
        )
    if image.startswith(ID_PREFIX) or FULL_ID.fullmatch(image):
        raise InvalidField(given.field, "must name a repository, not an image id")
    return image


def _argv(given: Given) -> tuple[str, ...]:
    value = _empty_as(given.value, [])
    # A string would need a shell to split it: the node never runs one.
    if not isinstance(value, list) or not all(isinstance(arg, str) for arg in value):
        raise InvalidField(given.field, "must be a list of strings (an argv)")
    if len(value) > MAX_ARGS or any("\x00" in arg or len(arg) > MAX_VALUE for arg in value):
        raise InvalidField(
            given.field,
            f"at most {MAX_ARGS} arguments of {MAX_VALUE} characters",
            problem=OUT_OF_RANGE,
        )
    if value and not value[0]:  # docker refuses it ("No command specified"): a 502 before
        raise InvalidField(given.field, "the program (the first argument) is empty")
    return tuple(value)


def _string_map(
    given: Given, *, limit: int, rule: Callable[[str, str], None] | None = None
) -> dict[str, str]:
    """An object of strings, each entry read; then ``rule`` of each entry read well.
    Every bad entry is refused at once, the same one first as when one was."""
    field, value = given.field, _empty_as(given.value, {})
    if not isinstance(value, Mapping):
        raise InvalidField(field, "must be an object of strings")
    if len(value) > limit:
        raise InvalidField(field, f"at most {limit} entries", problem=OUT_OF_RANGE)
    with Refusals() as refusals:
        read = {key: refusals.read(_map_entry, field, key, item) for key, item in value.items()}
        result = {str(key): item for key, item in read.items() if item is not None}
        for key, item in result.items():
            if rule is not None and not refusals.full:
                refusals.read(rule, key, item)
    return result


def _map_entry(field: str, key: str, item: object) -> str:
    if not 0 < len(key) <= MAX_KEY or "\x00" in key:
        raise InvalidField(field, f"keys must be 1 to {MAX_KEY} characters")
    if isinstance(item, bool) or not isinstance(item, (str, int, float)):
        raise InvalidField(f"{field}.{key}", "must be a string")
    string = str(item)
    if len(string) > MAX_VALUE or "\x00" in string:
        raise InvalidField(f"{field}.{key}", f"at most {MAX_VALUE} characters, no NUL")
    return string


def _env(given: Given) -> dict[str, str]:
    def named(key: str, _: str) -> None:
        if "=" in key:
            raise InvalidField(f"{given.field}.{key}", "a variable's name cannot hold '='")

    return _string_map(given, limit=MAX_ENV, rule=named)


def _gpus(given: Given) -> list[Any] | None:
    """Checked by parse_launch before the other fields, and read only for its length: the
    node chooses the cards (this reader makes no ContainerSpec attribute)."""
    gpus = _empty_as(given.value, None)
    if gpus is not None and (not isinstance(gpus, list) or len(gpus) > MAX_GPUS):
        problem = OUT_OF_RANGE if isinstance(gpus, list) else INVALID
        raise InvalidField(
            given.field, f"must be a list of at most {MAX_GPUS} card indices", problem=problem
        )
    return gpus


def _list_of(given: Given, *, most: int, what: str) -> list[Any]:
    """A list of at most ``most`` entries (``""`` or null: none), else a 422 saying so."""
    value = _empty_as(given.value, [])
    if not isinstance(value, list) or len(value) > most:
        raise InvalidField(
            given.field,
            f"must be a list of at most {most} {what}",
            problem=OUT_OF_RANGE if isinstance(value, list) else INVALID,
        )
    return value


def _mounts(given: Given) -> tuple[Mount, ...]:
    value = _list_of(given, most=MAX_MOUNTS, what="[host, container, read_only]")
    with Refusals() as refusals:
        mounts = [
            refusals.read(_mount, entry, f"{given.field}[{i}]") for i, entry in enumerate(value)
        ]
    return tuple(mounts)


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


def _labels(given: Given) -> dict[str, str]:
    """The console's labels and the run id's, which the node writes on every job."""

    def allowed(key: str, value: str) -> None:
        if key.startswith(ENGINE_LABELS):
            # Engine tooling acts on these (io.containers.autoupdate pulls and restarts).
            raise InvalidField(f"{given.field}.{key}", "the engines' own namespace")
        if key in NODE_LABELS and (key, value) != (LABEL_RUN_ID, given.run_id):
            raise InvalidField(given.field, f"{', '.join(NODE_LABELS)} are the node's")

    labels = _string_map(given, limit=MAX_LABELS, rule=allowed)
    return {**labels, LABEL_RUN_ID: given.run_id}


def _workdir(given: Given) -> str | None:
    path = _text(given.body, given.field, limit=MAX_PATH)
    if path and not _absolute(path):
        raise InvalidField(given.field, "must be an absolute path without '..'")
    return path or None


def _size(given: Given, *, least: int) -> str | None:
    value = given.value
    if value is None or value == "":
        return None
    size = size_in_bytes(value)
    if size is None or not least <= size <= MAX_SIZE:
        raise InvalidField(
            given.field,
            f"must be a size like 512m, 16g or a number of bytes, from {least} bytes to 1 PiB",
            problem=INVALID if size is None else OUT_OF_RANGE,
        )
    return str(value).lower()


def _shm_size(given: Given) -> str | None:
    return _size(given, least=1)


def _memory_limit(given: Given) -> str | None:
    return _size(given, least=MIN_MEMORY)


def _disk_limit(given: Given) -> str | None:
    return _size(given, least=MIN_DISK)


def _scratch(given: Given) -> Scratch | None:
    """``{"path", "size"}``, both required; ``""`` or null: none. Each bad part is
    refused by its own name (``container.scratch.size``); the node's ceiling,
    `TUNEPLANE_JOB_SCRATCH_MAX`, is the launcher's to hold."""
    value = _empty_as(given.value, None)
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - {"path", "size"}:
        raise InvalidField(given.field, 'must be {"path": "/scratch", "size": "50g"}')
    with Refusals() as refusals:
        path = refusals.read(_scratch_path, value.get("path"), f"{given.field}.path")
        size = refusals.read(_scratch_size, Given(value, f"{given.field}.size", given.run_id))
    return Scratch(path, size)


def _scratch_path(path: object, field: str) -> str:
    if path is None or path == "":
        raise InvalidField(field, "required, an absolute path", problem=MISSING)
    if not _absolute(path):
        raise InvalidField(field, "must be an absolute path without '..'")
    if not _mountable_target(str(path)):
        raise InvalidField(field, f"{path}: {UNMOUNTABLE}")
    return str(path)


def _scratch_size(given: Given) -> int:
    if given.value is None or given.value == "":
        raise InvalidField(given.field, "required, a size like 50g", problem=MISSING)
    return int(size_in_bytes(_size(given, least=MIN_SCRATCH)) or 0)


def _volumes(given: Given) -> tuple[Volume, ...]:
    """``[{"source", "path", "sha256"}]``, each part refused by its own name
    (``container.volumes[1].sha256``); the insecure-host rule is the launcher's."""
    value = _list_of(given, most=MAX_VOLUMES, what='{"source", "path", "sha256"}')
    with Refusals() as refusals:
        volumes = [
            refusals.read(_volume, entry, f"{given.field}[{i}]") for i, entry in enumerate(value)
        ]
        paths = [volume.path for volume in volumes if volume is not None]
        for i, path in enumerate(paths):
            if path in paths[:i]:
                refusals.refuse(InvalidField(f"{given.field}[{i}].path", f"{path}: given twice"))
    return tuple(volumes)


def _volume(entry: object, field: str) -> Volume:
    if not isinstance(entry, Mapping) or set(entry) - {"source", "path", "sha256"}:
        raise InvalidField(field, 'must be {"source": "https://...", "path": ..., "sha256": ...}')
    with Refusals() as refusals:
        source = refusals.read(_volume_source, entry.get("source"), f"{field}.source")
        path = refusals.read(_scratch_path, entry.get("path"), f"{field}.path")
        digest = refusals.read(_volume_digest, entry.get("sha256"), f"{field}.sha256", source)
    return Volume(source, path, digest)


def _volume_source(source: object, field: str) -> str:
    """An ``https://`` URL (``http://`` too: the insecure-host rule is the launcher's), or
    an OCI reference (``registry/repo:tag``, ``@sha256:...``) as images are read."""
    if source is None or source == "":
        raise InvalidField(field, "required, an https:// URL or an OCI reference", problem=MISSING)
    if isinstance(source, str) and "://" not in source and len(source) <= MAX_IMAGE:
        return _volume_reference(source, field)
    if not isinstance(source, str) or len(source) > MAX_URL or not URL.fullmatch(source):
        raise InvalidField(
            field,
            f"must be an https:// URL of at most {MAX_URL} printable ASCII characters, or "
            "an OCI reference like registry/repo:tag",
        )
    try:
        parts = urlsplit(source)
        parts.port  # noqa: B018 (read for its ValueError: a port past 65535)
    except ValueError:
        parts = None
    if parts is None or not parts.hostname:
        raise InvalidField(field, "must name a host, and a port from 1 to 65535 if any")
    return source


def _volume_reference(source: str, field: str) -> str:
    match = IMAGE_REFERENCE.fullmatch(source)
    if match is None or len(ImageName.parse(match.group("name")).repository) > MAX_IMAGE_NAME:
        raise InvalidField(field, "must be an OCI reference like registry/repo:tag (lower case)")
    if names_an_id(source) or FULL_ID.fullmatch(source):
        raise InvalidField(field, "must name a repository, not an image id")
    if "@" in source and not source.rpartition("@")[2].startswith(ID_PREFIX):
        raise InvalidField(field, "a volume's digest must be a sha256")
    return source


def _volume_digest(digest: object, field: str, source: str | None) -> str:
    """The hex of a URL's file or of an OCI manifest (``""``: an OCI reference's tag
    resolves it, or its own digest pins it). ``source`` None: refused already."""
    oci = source is not None and "://" not in source
    if digest is None or digest == "":
        if oci or source is None:
            return _pinned(source or "")
        raise InvalidField(field, "required for a URL: the file's sha256", problem=MISSING)
    found = SHA256.fullmatch(digest) if isinstance(digest, str) else None
    if found is None:
        raise InvalidField(field, "must be 64 lower-case hex digits (sha256:... too)")
    if oci and _pinned(source or "") not in ("", found[1]):
        raise InvalidField(field, "must be the digest the source names, or left out")
    return found[1]


def _pinned(source: str) -> str:
    """The sha256 an OCI reference names by digest (hex), else ``""``."""
    found = SHA256.fullmatch(source.rpartition("@")[2]) if "@" in source else None
    return found[1] if found is not None else ""


def _cpus(given: Given) -> float | None:
    """A number of CPUs: a number, or 0.3.15's string (``""`` no limit, ``"2"``, ``"0.5"``)."""
    value = _empty_as(given.value, None)
    if value is None:
        return None
    if isinstance(value, str) and DECIMAL.fullmatch(value.strip()):
        value = float(value.strip())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidField(given.field, 'must be a number of CPUs, like 2 or "0.5"')
    # Compared as given: an int of 400 digits would overflow a float.
    if not ((isinstance(value, int) or math.isfinite(value)) and 0 < value <= MAX_CPUS):
        raise InvalidField(
            given.field, f"must be more than 0 and at most {MAX_CPUS:g}", problem=OUT_OF_RANGE
        )
    return float(value)


def _registry_auth(given: Given) -> RegistryAuth | None:
    """A user and password, or an identity token; read apart from the spec (it must never
    reach labels or env), and its refusals never echo a value."""
    value = _empty_as(given.value, None)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidField(given.field, "must be {username, password} or {identity_token}")
    if set(value) not in AUTH_FORMS:
        raise InvalidField(given.field, "must be {username, password} or {identity_token}")
    found = {key: _credential(value[key], f"{given.field}.{key}") for key in sorted(value)}
    return RegistryAuth(**found, source="launch")


def _credential(value: object, field: str) -> str:
    limit = MAX_USERNAME if field.endswith("username") else MAX_CREDENTIAL
    if not isinstance(value, str) or not 0 < len(value) <= limit or CONTROL.search(value):
        raise InvalidField(field, f"must be 1 to {limit} characters, no control characters")
    return value


def _pull_policy(given: Given) -> str:
    policy = _empty_as(given.value, IF_NOT_PRESENT)
    if policy not in PULL_POLICIES:
        raise InvalidField(given.field, f"must be one of {', '.join(PULL_POLICIES)}")
    return str(policy)


def _network(given: Given) -> str:
    network = _text(given.body, given.field, limit=100) or "host"
    if network not in NETWORKS:
        # container:<id> would join another container's namespaces: not a job's to ask.
        raise InvalidField(given.field, f"must be one of {', '.join(NETWORKS)}")
    return network


def _user(given: Given) -> str | None:
    user = _text(given.body, given.field, limit=100)
    if user and not USER.fullmatch(user):
        raise InvalidField(given.field, "must be a user or uid, with :group or :gid")
    return user or None


def _flag(given: Given) -> bool | None:
    """True or false; None when not given."""
    value = given.value
    if value is None or value == "":
        return None
    if not isinstance(value, bool):
        raise InvalidField(given.field, "must be true or false")
    return value


def _isolation(given: Given) -> str:
    isolation = _text(given.body, given.field, limit=100)
    if isolation not in ("", SANDBOX):
        raise InvalidField(given.field, f'must be "{SANDBOX}" or "" (the node\'s rule)')
    return isolation


def _stop_signal(given: Given) -> str | None:
    return parse_signal(given.body, given.field)


SIGNAL: Schema = {"anyOf": [{"enum": list(JOB_SIGNALS)}, {"enum": list(JOB_SIGNALS.values())}]}
SIGNALS_DOC = (
    f"{', '.join(f'`{name}`' for name in JOB_SIGNALS)}, by name or number; SIGKILL and "
    "SIGSTOP cannot be asked for (a job cannot catch either)"
)


def parse_signal(body: Mapping[str, Any], field: str) -> str | None:
    """A signal of `JOB_SIGNALS` by its name or number, as its name; ``""`` or absent:
    None."""
    value = body.get(_key(field))
    if value is None or value == "":
        return None
    # A number, or a name exactly as JOB_SIGNALS spells it (the schema's enum): ctl and
    # the engines' records go through job_signal's looser reading, a request does not.
    exact = isinstance(value, str) and value in JOB_SIGNALS
    name = job_signal(value) if _is_int(value) else value if exact else None
    if name is None:
        raise InvalidField(field, f"must be one of {SIGNALS_DOC}")
    return name


IMAGE_SCHEMA = text(most=MAX_IMAGE, least=1, pattern=anchored(IMAGE_ID + IMAGE_REFERENCE.pattern))
VOLUME_SOURCE = {
    "anyOf": [
        text(most=MAX_URL, pattern=anchored(URL.pattern)),
        text(most=MAX_IMAGE, least=1, pattern=anchored(IMAGE_ID + IMAGE_REFERENCE.pattern)),
    ]
}
IMAGE_DOC = (
    "Image reference, by the distribution grammar (`registry:port/path/name:tag@sha256:...`, "
    f"lower-case path, a port up to 65535, the name before the tag at most {MAX_IMAGE_NAME} "
    "characters counted as the engines count it, with `docker.io/` (and `library/`) added "
    "to a name without a registry); an image id (`sha256:...`, 64 hex digits) is "
    "refused, and so is a bare hex string the node pulled no repository by (an id prefix); "
    "anything else (`UPPER/Case`, `--help`, `../containers/x`) is refused before the "
    "engine sees it."
)
REGISTRY_AUTH_SCHEMA = or_empty(
    closed_object(
        username=text(most=MAX_USERNAME, least=1, pattern=NO_CONTROL),
        password=text(most=MAX_CREDENTIAL, least=1, pattern=NO_CONTROL),
    ),
    closed_object(identity_token=text(most=MAX_CREDENTIAL, least=1, pattern=NO_CONTROL)),
)
REGISTRY_AUTH_DOC = (
    '`{"username", "password"}` or `{"identity_token"}` (a user of at most '
    f"{MAX_USERNAME} characters, a secret of at most {MAX_CREDENTIAL}, no control "
    "characters). None: the node's `TUNEPLANE_REGISTRY_AUTH_FILE`, else anonymous."
)
PULL_POLICY_SCHEMA = or_empty({"enum": list(PULL_POLICIES)})

CONTAINER = Body(
    "Container",
    closed=True,
    doc="The job's container: the fields of 0.3.15's ContainerSpec, \"\" or null for none.",
    fields=(
        Field(
            "name",
            or_empty(
                {
                    "type": "string",
                    "pattern": anchored(NAME.pattern),
                    "not": {"pattern": anchored(LOOKS_LIKE_ID.pattern)},
                }
            ),
            "The container's name, which is the `ref` of every other verb. Default "
            "`tuneplane-<run id>` (characters outside `[a-zA-Z0-9_.-]` become `-`, and a "
            "changed or very long id gets a hash suffix). Must match "
            f"`{NAME.pattern}`, and must not look like a container id (12 or more hex "
            "digits and nothing else): engines resolve ids before names.",
            read=_name,
        ),
        Field("image", IMAGE_SCHEMA, IMAGE_DOC, required=True, read=_image),
        Field(
            "command",
            or_empty(
                {
                    "type": "array",
                    "maxItems": MAX_ARGS,
                    "prefixItems": [{**VALUE, "minLength": 1}],  # only the program is never empty
                    "items": VALUE,
                }
            ),
            f"The entry argv, a list of at most {MAX_ARGS} strings of at most {MAX_VALUE} "
            "characters. It **replaces the image's ENTRYPOINT** (`argv[0]` is the "
            "entrypoint, the rest its arguments; `argv[0]` may not be empty). A string is "
            "refused: the node never runs a shell to split it. Empty: the image's own "
            "entrypoint and command.",
            read=_argv,
        ),
        Field(
            "env",
            or_empty(string_map(most=MAX_ENV, keys="^[^=\\x00]*$")),
            f"Object of at most {MAX_ENV} environment variables (numbers are turned into "
            "strings; no `=` in a name). `NVIDIA_VISIBLE_DEVICES` is the node's: a "
            "console's value is dropped (logged), and the node sets it to the cards it "
            "chose, or `void` for none, so a host whose default runtime is NVIDIA's shows "
            "a job no other card.",
            read=_env,
        ),
        Field(
            "gpus",
            or_empty({"type": "array", "maxItems": MAX_GPUS, "items": {}}),
            "Read **only for its length, and only when `requested_gpus` is absent**; the "
            f"indices in it are ignored. At most {MAX_GPUS}.",
        ),
        Field(
            "mounts",
            or_empty({"type": "array", "maxItems": MAX_MOUNTS, "items": mount_forms()}),
            f"At most {MAX_MOUNTS} bind mounts, each `[host, container, read_only]` "
            "(`read_only` may be left out: false); both paths absolute, without `..`. "
            '`{"host", "container", "read_only"}` objects are accepted too. The host path '
            "must exist, lie under one of `TUNEPLANE_ALLOWED_MOUNT_ROOTS` (by default the "
            "storage root and the model dirs) on that root's filesystem, and be its own real "
            "path: the node opens it from the root one component at a time without "
            "following a symlink, and the engine mounts what was opened (a path swapped "
            "for a link meanwhile is refused, never followed). It may not be, hold or lie "
            "in the node's own files (token, TLS key, registry auth file, state directory) "
            "nor the engine's directories. An engine on another machine takes no host "
            f"mounts. As for the container path, {UNMOUNTABLE}. A bad mount is a `422` "
            "naming `container.mounts[i]`, with the reason in words.",
            read=_mounts,
        ),
        Field(
            "labels",
            or_empty(string_map(most=MAX_LABELS, keys=NO_NUL)),
            f"At most {MAX_LABELS} extra labels (`tuneplane.user`, `tuneplane.kind`, "
            f"`tuneplane.attempt` are the ones the platform uses). {_named(NODE_LABELS)} "
            f"are the node's and refused, but `{LABEL_RUN_ID}`, if given, must equal "
            "`run_id`. Labels in the engines' own namespaces "
            f"({_named(ENGINE_LABELS)}), which engine tooling acts on, are a `422` naming "
            "the label.",
            read=_labels,
        ),
        Field(
            "workdir",
            or_empty(PATH),
            "Working directory, an absolute path without `..`.",
            read=_workdir,
        ),
        Field(
            "shm_size",
            or_empty(number(least=1, most=MAX_SIZE, whole=True), SIZE_TEXT),
            "A size like `512m`, `16g`, or a number of bytes, up to 1 PiB.",
            read=_shm_size,
        ),
        Field(
            "cpu_limit",
            or_empty(
                number(least=0, above=True, most=MAX_CPUS),
                {"type": "string", "pattern": f"^\\s*(?:{DECIMAL.pattern})\\s*$"},
            ),
            f"Number of CPUs, more than 0 and at most {MAX_CPUS:g}: a number, or a string "
            'as 0.3.15 consoles send it (`"2"`, `"0.5"`; `""` means no limit).',
            read=_cpus,
        ),
        Field(
            "memory_limit",
            or_empty(number(least=MIN_MEMORY, most=MAX_SIZE, whole=True), SIZE_TEXT),
            f"A size like `shm_size`'s, from {MIN_MEMORY // 2**20} MiB (the engines refuse "
            "less) to 1 PiB. None: the machine's memory less "
            "`TUNEPLANE_SYSTEM_RESERVED_MEMORY`.",
            read=_memory_limit,
        ),
        Field(
            "disk_limit",
            or_empty(number(least=MIN_DISK, most=MAX_SIZE, whole=True), SIZE_TEXT),
            f"What the job may write to the engine's disk, its writable layer and "
            f"anonymous volumes together: a size like `shm_size`'s, from "
            f"{MIN_DISK // 2**20} MiB to 1 PiB, at most the node's "
            "`TUNEPLANE_JOB_DISK_LIMIT` (more is a `422` naming `container.disk_limit`). "
            "None: that limit. Held by the kernel where the engine's store has project "
            "quotas; else a job past it is stopped as a stop would (its stop signal, the "
            'grace period, SIGKILL), and observe says `stop_reason: "disk_limit"`.',
            read=_disk_limit,
        ),
        Field(
            "scratch",
            or_empty(
                closed_object(
                    path=PATH,
                    size={
                        "anyOf": [number(least=MIN_SCRATCH, most=MAX_SIZE, whole=True), SIZE_TEXT]
                    },
                )
            ),
            'Scratch space with a hard size, `{"path": "/scratch", "size": "50g"}`: '
            "a filesystem of the job's own (ext4 in a sparse file of the node's "
            "`TUNEPLANE_SCRATCH_ROOT`, loop-mounted, nosuid and nodev, its root writable "
            "by any user of the job), bound at `path`. A write past `size` is `ENOSPC` "
            "in the job; the node's disk grows by at most `size`, which the job's "
            "`disk_limit` does not count. It is deleted with the container (remove, reap, "
            f"a failed launch). `size`: like `shm_size`'s, from {MIN_SCRATCH // 2**20} MiB "
            "to `TUNEPLANE_JOB_SCRATCH_MAX`; `path`: absolute, not another mount's "
            f"target, and as for mounts, {UNMOUNTABLE}. A bad one is a `422` naming "
            '`container.scratch.path` or `container.scratch.size`. `""` or none: no '
            "scratch. The process runtime and an engine on another machine refuse it "
            "(`422`).",
            read=_scratch,
        ),
        Field(
            "volumes",
            or_empty(
                {
                    "type": "array",
                    "maxItems": MAX_VOLUMES,
                    "items": {
                        **closed_object(
                            source=VOLUME_SOURCE,
                            path=PATH,
                            sha256=or_empty(text(most=71, pattern=anchored(SHA256.pattern))),
                        ),
                        "required": ["source", "path"],
                    },
                }
            ),
            f"At most {MAX_VOLUMES} read-only files or directories of the node's volume "
            'store, each `{"source": "https://...", "path": "/models/base.safetensors", '
            '"sha256": "<64 hex>"}` or `{"source": "registry/repo:tag", "path": '
            '"/models/base"}`: the node fetches `source` once per machine however many jobs '
            "name it, checks every byte, keeps it under `TUNEPLANE_VOLUME_ROOT`, and binds it "
            "read-only at `path` (a write is `EROFS`). A URL is one file, resumed with "
            "`Range` after a dropped connection or a restart, and its `sha256` is required. "
            "An OCI reference (`registry/repo:tag` or `registry/repo@sha256:...`, read as "
            "`container.image` is) names an artifact or image whose layers (tar, gzip'd or "
            "not; zstd refused) the node unpacks in order, whiteouts applied, into one "
            "directory: the entry is named by the manifest's digest (two tags of one "
            "content are one entry; an index is followed to this machine's `linux` "
            "manifest, or refused), `sha256` is optional and, if given, must be that "
            "digest. The node asks the registry itself with the launch's "
            "`registry_auth` (only where the volume's registry is the image's), else the "
            "node's `TUNEPLANE_REGISTRY_AUTH_FILE`; a volume pulled with credentials is "
            "private as a private image is: a later launch naming it, by any tag or digest, "
            "needs credentials its registry accepts (`403` `forbidden_image`), and a URL "
            "naming its digest is a `422` (a source binds only an entry of its kind). Layers "
            "with absolute paths, `..`, paths through links, device nodes or more bytes "
            "than 20 times their size fail the fill. Plain `http://` (a URL's, a "
            "registry's) only for the hosts in `TUNEPLANE_VOLUME_INSECURE_HOSTS`. A launch "
            "whose volumes are not all in the store answers `phase: pulling` at once, holds "
            "its cards, and starts when every volume and its image are there; a fill that "
            "fails (the server's `404`, other bytes than the digest names, a volume that "
            "does not fit below `TUNEPLANE_VOLUME_GC_HIGH_PERCENT` of the store even after "
            "eviction: the sum of an OCI manifest's layer sizes) fails the launch with the "
            "reason and lets its cards go. `path`: absolute, not another volume's, and as "
            f"for mounts, {UNMOUNTABLE}. A bad one is a `422` naming "
            '`container.volumes[i].source`, `.path` or `.sha256`. `""` or none: no '
            'volumes (a `""` `sha256` is none given). The process runtime and an engine '
            "on another machine refuse them (`422`).",
            read=_volumes,
        ),
        Field(
            "network",
            or_empty({"enum": list(NETWORKS)}),
            "`host` (the default, as in 0.3.15), `bridge` or `none`. Joining another "
            "container's namespaces (`container:<x>`) is refused. `bridge` is the node's "
            "job network, `TUNEPLANE_JOB_NETWORK` (by default `isolated`: no other job's "
            "ports reachable). What `host` gets is the operator's, "
            "`TUNEPLANE_JOB_HOST_NETWORK`: by default (`whole-node`) the host network only "
            "for a job holding every card of the machine with no other job there, else the "
            "node's job network; observe's `network` says which.",
            read=_network,
        ),
        Field(
            "user",
            or_empty({"type": "string", "pattern": anchored(USER.pattern)}),
            "User as `name` or `uid`, with `:group` or `:gid`.",
            read=_user,
        ),
        Field(
            "stop_signal",
            or_empty(*SIGNAL["anyOf"]),
            f"The signal a stop sends first: {SIGNALS_DOC}. None: the image's `STOPSIGNAL`, "
            "else `SIGTERM`. Observe's `stop_signal` says which one the job has.",
            read=_stop_signal,
        ),
        Field(
            "rdma",
            or_empty({"type": "boolean"}),
            "`false`: no RDMA devices for this job, whatever the node's rule. `true`: it "
            "needs them; a node that hands jobs none (`TUNEPLANE_RDMA=off`, or no "
            "device) answers `409`. None: the node's rule, `TUNEPLANE_RDMA` (by default "
            "a job holding a card gets them when the machine has any). A job given them "
            "sees them under `/dev/infiniband`, with memlock unlimited, `IPC_LOCK`, and "
            "`NCCL_IB_HCA` set to `TUNEPLANE_FABRICS`' HCAs unless `env` sets it.",
            read=_flag,
        ),
        Field(
            "read_only_root",
            or_empty({"type": "boolean"}),
            "`true`: the image's filesystem is read-only; the job writes only in `/tmp` "
            "and `/run` (tmpfs, bounded by `TUNEPLANE_JOB_TMPFS_SIZE` and half its "
            "`memory_limit`, counted against its memory) and its mounts, so its writable "
            "layer cannot grow. `false` or none: the operator's rule, "
            "`TUNEPLANE_JOB_READ_ONLY_ROOT`, whose `true` a launch cannot undo.",
            read=_flag,
        ),
        Field(
            "isolation",
            or_empty({"enum": [SANDBOX]}),
            f'`"{SANDBOX}"`: the job runs under the node\'s sandbox runtime '
            "(`TUNEPLANE_SANDBOX_RUNTIME`, gVisor's `runsc` by default), whatever the "
            "node's rule; an engine without it, or a job with cards where the runtime "
            "has no GPU proxy, is a `409` (`sandbox_unavailable`) naming the runtime and "
            'the fix, never a run under runc. `""` or none: the node\'s rule, '
            "`TUNEPLANE_JOB_SANDBOX`. A launch can ask for more isolation, never less. "
            "Observe's `runtime` says which runtime a job has, `userns` whether it has "
            "a user namespace of its own (`TUNEPLANE_JOB_USERNS`).",
            read=_isolation,
        ),
        Field(
            "registry_auth",
            REGISTRY_AUTH_SCHEMA,
            f"Credentials for the registry of `image`, for this launch's pull only: "
            f"{REGISTRY_AUTH_DOC} They are never logged, stored, shown or written on the "
            "container. A private image the node pulled runs again only for a launch whose "
            "credentials its registry accepts (else `403`).",
        ),
        Field(
            "pull_policy",
            PULL_POLICY_SCHEMA,
            f"`{IF_NOT_PRESENT}` (the default): pull only an image that is not here; "
            "`always`: pull the tag even when an image of that name is here, so a moved "
            "tag is picked up (phase `pulling`, shared with other launches of the image). "
            "A digest reference (`@sha256:`) is never pulled again.",
        ),
    ),
)
LAUNCH = Body(
    "LaunchBody",
    closed=True,
    fields=(
        Field(
            "run_id",
            text(most=MAX_RUN_ID, least=1, pattern=NO_CONTROL),
            f"The run's id (at most {MAX_RUN_ID} characters, no control characters); "
            f"written on the container as `{LABEL_RUN_ID}`.",
            required=True,
        ),
        Field(
            "requested_gpus",
            or_null(number(least=0, most=MAX_GPUS, whole=True)),
            f"How many cards; whole number, 0 to {MAX_GPUS}. **The node chooses the "
            "cards** (for more than one it prefers cards joined by NVLink, then under one "
            "PCIe switch or NUMA node; among those as good, a job that fits on one NUMA "
            "node goes to the node already holding jobs, so a whole socket stays free for "
            "a large one; then the lowest indices). With `TUNEPLANE_CPU_AFFINITY=numa` a "
            "job holding cards runs on their NUMA nodes' CPUs and memory. Absent: the "
            "length of `container.gpus`.",
        ),
        Field("container", CONTAINER, "An object:", required=True),
        Field(
            "relaunch",
            or_empty({"type": "boolean"}),
            "What a launch of a run whose container exited does. `true` (the default, as "
            'in 0.3.15; also for `""`): the exited container (its exit code and logs) '
            "is removed and the job launched again. `false`: at most once: the exited "
            "job is the answer (`phase: exited`, its `exit_code`, `idempotent: true`), "
            "nothing removed or started. Either way, a launch of a run whose container "
            "or pending launch exists with another spec is a `409` (`run_conflict`) "
            "naming the fields that differ, and one with the same spec is idempotent.",
        ),
    ),
)
LAUNCH_FIELDS = LAUNCH.names
CONTAINER_FIELDS = CONTAINER.names
# The order the container's fields are checked in, which decides which of two bad
# fields a 422 names: gpus first (parse_launch), then labels, then the table's order.
CHECKED = sorted(CONTAINER.fields, key=lambda field: field.name != "labels")


# --- prefetch -------------------------------------------------------------------------


def parse_prefetch(body: Mapping[str, Any]) -> PrefetchRequest:
    """``POST /node/v1/images/pull``: a launch's image, credentials and pull policy, by
    the same rules, each named by its own field."""
    with Refusals() as refusals:
        refusals.unknown(body, PREFETCH)
        image = refusals.read(_image, Given(body, "image", ""))
        auth = refusals.read(_registry_auth, Given(body, "registry_auth", ""))
        policy = refusals.read(_pull_policy, Given(body, "pull_policy", ""))
    return PrefetchRequest(image, auth=auth, pull_policy=policy)


PREFETCH = Body(
    "PrefetchBody",
    closed=True,
    fields=(
        Field("image", IMAGE_SCHEMA, IMAGE_DOC, required=True),
        Field(
            "registry_auth",
            REGISTRY_AUTH_SCHEMA,
            f"Credentials for the registry of `image`, for this pull only: {REGISTRY_AUTH_DOC} "
            "Never logged, stored or shown; a wrong one fails the pull as it fails a launch.",
        ),
        Field(
            "pull_policy",
            PULL_POLICY_SCHEMA,
            f"`{IF_NOT_PRESENT}` (the default): an image that is here is `present`, nothing "
            "is pulled; `always`: pull the tag again (a digest reference never is).",
        ),
    ),
)


def parse_volume_pull(body: Mapping[str, Any]) -> tuple[Volume, bool]:
    """``POST /node/v1/volumes/pull``: a volume as one of ``container.volumes`` names it
    (its ``source`` and ``sha256``; no ``path``), each part refused by its own name, and
    whether the answer waits for the fill (``wait``)."""
    with Refusals() as refusals:
        refusals.unknown(body, VOLUME_PULL)
        source = refusals.read(_volume_source, body.get("source"), "source")
        digest = refusals.read(_volume_digest, body.get("sha256"), "sha256", source)
        wait = refusals.read(_flag, Given(body, "wait", ""))
    return Volume(source, "", digest), bool(wait)


def parse_volume_gc(body: Mapping[str, Any]) -> None:
    _body(body, VOLUME_GC)


VOLUME_PULL = Body(
    "VolumePullBody",
    closed=True,
    fields=(
        Field(
            "source",
            VOLUME_SOURCE,
            "Where the volume is, as a launch's `container.volumes[i].source`: an "
            "`https://` URL (shown without its query) or an OCI reference "
            "(`registry/repo:tag`, `@sha256:...`), asked with the node's "
            "`TUNEPLANE_REGISTRY_AUTH_FILE` credentials for its registry (plain `http://` "
            "only for the hosts in `TUNEPLANE_VOLUME_INSECURE_HOSTS`).",
            required=True,
        ),
        Field(
            "sha256",
            or_empty(text(most=71, pattern=anchored(SHA256.pattern))),
            "The file's sha256 (64 hex digits, `sha256:` before them too): the entry's "
            "name, which its bytes must hash to. Required for a URL; for an OCI "
            "reference, its manifest's digest (optional: the reference resolves it).",
        ),
        Field(
            "wait",
            or_empty({"type": "boolean"}),
            "`true`: answer when the fill has ended (`200`, or its error: `502` "
            "`volume_fill_failed`); `false` (the default): answer once the fill is admitted "
            "(`202`), its room found and its size asked.",
        ),
    ),
)
VOLUME_GC = Body("VolumeGcBody", (), doc="Nothing is read from it.")


# --- the other verbs ----------------------------------------------------------------------


# Each verb's body is read whole: its unknown fields and every bad one refused in one 422.


def parse_observe(body: Mapping[str, Any]) -> list[str]:
    (refs,) = _body(body, REFS, parse_refs)
    return refs  # type: ignore[no-any-return]


def parse_stop_body(body: Mapping[str, Any]) -> tuple[str, StopPlan]:
    """A stop's ``ref`` and how to stop it."""
    ref, plan = _body(body, STOP, parse_ref, parse_stop)
    return ref, plan


def parse_signal_body(body: Mapping[str, Any]) -> tuple[str, str]:
    """The signal verb's ``ref`` and the signal's name."""
    ref, sent = _body(body, SIGNAL_BODY, parse_ref, parse_sent_signal)
    return ref, sent


def parse_remove(body: Mapping[str, Any]) -> str:
    (ref,) = _body(body, REF_BODY, parse_ref)
    return ref  # type: ignore[no-any-return]


def parse_reap(body: Mapping[str, Any]) -> float | None:
    (max_age,) = _body(body, REAP, parse_max_age)
    return max_age  # type: ignore[no-any-return]


def parse_cordon(body: Mapping[str, Any]) -> str | None:
    (reason,) = _body(body, CORDON, parse_reason)
    return reason  # type: ignore[no-any-return]


def parse_drain(body: Mapping[str, Any]) -> tuple[str | None, StopPlan]:
    """A drain's ``reason`` and how it stops every job."""
    reason, plan = _body(body, DRAIN, parse_reason, parse_drain_plan)
    return reason, plan


def parse_uncordon(body: Mapping[str, Any]) -> None:
    _body(body, UNCORDON)


def parse_image_gc(body: Mapping[str, Any]) -> None:
    _body(body, IMAGE_GC)


def _body(body: Mapping[str, Any], table: Body, *reads: Callable[[Mapping[str, Any]], Any]) -> Any:
    """What each of ``reads`` reads of a body of ``table``: its unknown fields and every
    bad one refused in one 422."""
    with Refusals() as refusals:
        refusals.unknown(body, table)
        values = tuple(refusals.read(read, body) for read in reads)
    return values


def parse_logs(pairs: Iterable[tuple[str, str]]) -> tuple[str, int, datetime | None, bool]:
    """The logs query: ``ref``, ``tail``, ``since``, ``follow``."""
    with Refusals() as refusals:
        query = _query(pairs, LOGS, refusals)
        ref = refusals.read(parse_ref, query)
        tail = refusals.read(parse_tail, query.get("tail"))
        since = refusals.read(parse_since, query.get("since"))
        follow = refusals.read(parse_follow, query.get("follow"))
    return ref, tail, since, follow


def parse_refs(body: Mapping[str, Any]) -> list[str]:
    refs = body.get("refs")
    if not isinstance(refs, list) or not all(
        isinstance(ref, str) and 0 < len(ref) <= MAX_REF for ref in refs
    ):
        problem = MISSING if refs is None else INVALID
        why = f"required, a list of container names (1 to {MAX_REF} long)"
        raise InvalidField("refs", why, problem=problem)
    if len(refs) > MAX_REFS:
        raise InvalidField("refs", f"at most {MAX_REFS} per call", problem=OUT_OF_RANGE)
    return refs


def parse_query(pairs: Iterable[tuple[str, str]], query: Body) -> dict[str, str]:
    """A query's parameters, each at most once (``tail=5&tail=9`` has no one meaning: a
    proxy and the node could each read another), none but ``query``'s."""
    with Refusals() as refusals:
        found = _query(pairs, query, refusals)
    return found


def _query(pairs: Iterable[tuple[str, str]], query: Body, refusals: Refusals) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in pairs:
        if name not in query.names:
            refusals.unknown({name: value}, query)
        elif name in found:
            refusals.refuse(InvalidField(name, "given more than once", problem=REPEATED))
        found.setdefault(name, value)
        if refusals.full:
            break
    return found


def parse_ref(body: Mapping[str, Any]) -> str:
    return _text(body, "ref", required=True, limit=MAX_REF)


def parse_seconds(body: Mapping[str, Any], field: str, *, most: float) -> float | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidField(field, "must be a number of seconds")
    if not (isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= most:
        raise InvalidField(field, f"must be from 0 to {most:g} seconds", problem=OUT_OF_RANGE)
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


def parse_stop(body: Mapping[str, Any]) -> StopPlan:
    """A stop's ``timeout``, ``signal`` and warning (``warn_signal``, ``warn_s``)."""
    with Refusals() as refusals:
        grace = refusals.read(parse_grace, body)
        signal = refusals.read(parse_signal, body, "signal")
        warning = refusals.read(_warning, body)
    return StopPlan(grace=grace, signal=signal, **warning)


def parse_drain_plan(body: Mapping[str, Any]) -> StopPlan:
    """How a drain stops every job: its ``grace_s`` and warning."""
    with Refusals() as refusals:
        grace = refusals.read(parse_drain_grace, body)
        warning = refusals.read(_warning, body)
    return StopPlan(grace=grace, **warning)


def parse_sent_signal(body: Mapping[str, Any]) -> str:
    """The signal verb's ``signal``, which it needs."""
    name = parse_signal(body, "signal")
    if name is None:
        raise InvalidField("signal", f"required: {SIGNALS_DOC}", problem=MISSING)
    return name


def _warning(body: Mapping[str, Any]) -> dict[str, Any]:
    with Refusals() as refusals:
        warn_signal = refusals.read(parse_signal, body, "warn_signal")
        warn_s = refusals.read(parse_seconds, body, "warn_s", most=MAX_GRACE_S)
        if warn_s is not None and body.get("warn_signal") in (None, ""):
            why = "needs warn_signal: the signal to warn the job with"
            refusals.refuse(InvalidField("warn_s", why, problem=MISSING))
    return {"warn_signal": warn_signal, "warn_s": warn_s}


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
        problem = OUT_OF_RANGE if value.isascii() and value.isdigit() else INVALID
        raise InvalidField("tail", f"must be a whole number from 1 to {MAX_TAIL}", problem=problem)
    return int(value)


def _seconds(name: str, *, most: float, doc: str) -> Field:
    """A field of seconds, from 0 to ``most``, or null."""
    bounds = f"0 to {most / 86400:g} days"
    return Field(name, or_null(number(least=0, most=most)), doc.format(bounds=bounds))


def _grace(name: str, *, jobs: str) -> Field:
    """A stop's grace period, ``name``, for ``jobs``."""
    doc = f"Seconds from the stop signal to SIGKILL for {jobs}, {{bounds}}; default "
    doc += "`TUNEPLANE_LOCAL_STOP_TIMEOUT`. Engines take whole seconds: it is rounded up."
    return _seconds(name, most=MAX_GRACE_S, doc=doc)


REF_FIELD = Field(
    "ref",
    REF,
    f"The container's name (its launch's `container.name`), 1 to {MAX_REF} characters.",
    required=True,
)
REFS_LIST = {
    "type": "array",
    "maxItems": MAX_REFS,
    "items": text(most=MAX_REF, least=1, pattern=None),
}
REFS_DOC = (
    f"Container names, at most {MAX_REFS} of 1 to {MAX_REF} characters; duplicates answered once."
)
REFS = Body("RefsBody", (Field("refs", REFS_LIST, REFS_DOC, required=True),))
STATS = Body(
    "StatsBody", (Field("refs", REFS_LIST, f"{REFS_DOC} Absent: every running job of the node."),)
)
REF_BODY = Body("RefBody", (REF_FIELD,))
WARNING = (
    Field(
        "warn_signal",
        or_null(SIGNAL),
        f"A signal sent before the stop signal, for the job to checkpoint and end by "
        f"itself: {SIGNALS_DOC}. Absent: no warning. Sent only to a job that catches it "
        "(a process below its init has a handler): to one that does not, it would be "
        "the end at once, so that job gets its stop signal without the warning phase "
        "(observe: `warning skipped: not caught`).",
    ),
    _seconds(
        "warn_s",
        most=MAX_GRACE_S,
        doc="Seconds from `warn_signal` to the stop signal, {bounds}, if the job has not "
        "ended by then; default: as long as the grace period. Needs `warn_signal`.",
    ),
)
STOP = Body(
    "StopBody",
    (
        REF_FIELD,
        _grace("timeout", jobs="the job"),
        Field(
            "signal",
            or_null(SIGNAL),
            f"The stop signal for this stop: {SIGNALS_DOC}. Absent: the job's own "
            "(`container.stop_signal`, else the image's `STOPSIGNAL`, else `SIGTERM`).",
        ),
        *WARNING,
    ),
)
SIGNAL_BODY = Body(
    "SignalBody",
    (
        REF_FIELD,
        Field("signal", SIGNAL, f"The signal: {SIGNALS_DOC}.", required=True),
    ),
)
REAP = Body(
    "ReapBody",
    (
        _seconds(
            "max_age_s",
            most=MAX_AGE_S,
            doc="Seconds since a container ended for it to be removed, {bounds}; default "
            "`TUNEPLANE_LOCAL_CONTAINER_TTL_S`.",
        ),
    ),
)
REASON = Field(
    "reason",
    or_null(text(most=MAX_REASON)),
    f"Why, in the operator's words (at most {MAX_REASON} characters); health and a refused "
    "launch say it.",
)
CORDON = Body("CordonBody", (REASON,))
DRAIN = Body(
    "DrainBody",
    (
        REASON,
        _grace("grace_s", jobs="every job"),
        *WARNING,
    ),
)
UNCORDON = Body("UncordonBody", (), doc="Nothing is read from it.")
IMAGE_GC = Body("ImageGcBody", (), doc="Nothing is read from it.")
LOGS = Body(
    "LogsQuery",
    (
        REF_FIELD,
        Field(
            "tail",
            {"anyOf": [number(least=1, most=MAX_TAIL, whole=True), EMPTY], "default": DEFAULT_TAIL},
            f"How many of the newest lines, 1 to {MAX_TAIL}; default {DEFAULT_TAIL}.",
        ),
        Field(
            "since",
            {"type": "string"},
            "Only lines from then on: an RFC 3339 time, or seconds since the epoch.",
        ),
        Field(
            "follow",
            {"type": "string", "pattern": either(*FOLLOW_WORDS)},
            "`1` or `true`: stream `text/plain` until the job exits; `0`, `false` or absent: no.",
        ),
    ),
    doc="The query of GET /node/v1/logs.",
)


# --- the jobs list and its watch ------------------------------------------------------------

MAX_CURSOR = 40


def parse_jobs(pairs: Iterable[tuple[str, str]]) -> tuple[Cursor | None, float]:
    """The jobs query: its ``index`` (None: the list) and ``wait``, refused together."""
    with Refusals() as refusals:
        query = _query(pairs, JOBS, refusals)
        cursor = refusals.read(parse_index, query.get("index"))
        wait = refusals.read(parse_wait, query.get("wait"))
    return cursor, wait


def parse_index(value: str | None) -> Cursor | None:
    """``index``: the cursor of an earlier answer; absent or empty: the list itself."""
    if value is None or value == "":
        return None
    cursor = Cursor.read(value) if len(value) <= MAX_CURSOR else None
    if cursor is None:
        raise InvalidCursor("index")
    return cursor


def parse_wait(value: str | None) -> float:
    """``wait``: seconds a watch query may wait for a change, 0 to `MAX_WAIT_S`."""
    if value is None or value == "":
        return DEFAULT_WAIT_S
    seconds = float(value) if DECIMAL.fullmatch(value) and len(value) <= 20 else -1.0
    if not 0 <= seconds <= MAX_WAIT_S:
        raise InvalidField("wait", f"must be a number of seconds from 0 to {MAX_WAIT_S:g}")
    return seconds


JOBS = Body(
    "JobsQuery",
    (
        Field(
            "index",
            text(most=MAX_CURSOR, pattern="^(?:[0-9a-f]{16}-[0-9]{1,19})?$"),
            "The `index` of an earlier answer: answer what changed since (a blocking query). "
            "Absent or empty: every job. A cursor of an earlier daemon process, or older "
            "than the node's history (`TUNEPLANE_WATCH_HISTORY`), answers every job with "
            "`full: true`.",
        ),
        Field(
            "wait",
            {"anyOf": [number(least=0, most=MAX_WAIT_S), EMPTY], "default": DEFAULT_WAIT_S},
            f"With `index`: seconds to hold the query when nothing changed, 0 to "
            f"{MAX_WAIT_S:g}; default {DEFAULT_WAIT_S:g}. The node adds up to a sixteenth "
            "more at random, so a fleet's consoles do not ask again at once.",
        ),
    ),
    doc="The query of GET /node/v1/jobs.",
)
