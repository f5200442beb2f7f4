"""A launch's container, field by field: the `CONTAINER` table (each field's name, its
value in JSON Schema, its line of documentation and its reader) and the readers of its
plain fields, in the table's order. `requests.parse_launch` reads a launch through it;
its fields with rules of their own are declared whole beside it (`mounts.MOUNTS`,
`mounts.SCRATCH`, `volumes.VOLUMES`), the readers every table shares are in `readers`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from tuneplane_node.errors import INVALID, OUT_OF_RANGE, InvalidField
from tuneplane_node.sizes import MAX_SIZE
from tuneplane_node.wire.fields import (
    NO_NUL,
    Body,
    Field,
    Given,
    anchored,
    number,
    or_empty,
)
from tuneplane_node.wire.images import (
    IMAGE_DOC,
    IMAGE_SCHEMA,
    PULL_POLICY_SCHEMA,
    REGISTRY_AUTH_DOC,
    REGISTRY_AUTH_SCHEMA,
    read_image,
)
from tuneplane_node.wire.maps import (
    ENGINE_LABELS,
    MAX_ENV,
    MAX_LABELS,
    MAX_VALUE,
    VALUE,
    read_env,
    read_labels,
    string_map,
)
from tuneplane_node.wire.mounts import MOUNTS, SCRATCH
from tuneplane_node.wire.readers import (
    DECIMAL,
    MAX_PATH,
    PATH,
    SIGNAL,
    SIGNALS_DOC,
    SIZE_TEXT,
    empty_as,
    is_absolute,
    parse_signal,
    read_flag,
    read_size,
    read_text,
)
from tuneplane_node.wire.values import (
    IF_NOT_PRESENT,
    LABEL_RUN_ID,
    NODE_LABELS,
    SANDBOX,
)
from tuneplane_node.wire.volumes import VOLUMES
from tuneplane_node.wire.warning import WARN_S, WARN_SIGNAL

NETWORKS = ("host", "bridge", "none")
MAX_GPUS = 1024
MAX_CPUS = 10_000.0
MAX_ARGS = 4096
MIN_MEMORY = 6 * 2**20  # the engines refuse less
MIN_DISK = 2**20
MIN_INODES, MAX_INODES = 1000, 2**32  # a job's inode limit (TUNEPLANE_JOB_INODE_LIMIT's range)

NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,200}")
# Engines resolve a full id, then an exact name, then an id prefix: a name that looks
# like an id could reach a container that is not the node's.
LOOKS_LIKE_ID = re.compile(r"[0-9a-fA-F]{12,}")
USER = re.compile(r"[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,31}(:[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,31})?")


def _named(names: tuple[str, ...]) -> str:
    return ", ".join(f"`{name}`" for name in names)


# The container's readers, in the table's order.


def _name(given: Given) -> str:
    name = read_text(given.body, given.field)
    if name and not NAME.fullmatch(name):
        raise InvalidField(given.field, "must match [a-zA-Z0-9][a-zA-Z0-9_.-]*")
    if name and LOOKS_LIKE_ID.fullmatch(name):
        raise InvalidField(given.field, "must not look like a container id (hex digits)")
    return name  # empty: named after the run id (`parse_container`)


def _argv(given: Given) -> tuple[str, ...]:
    value = empty_as(given.value, [])
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


def read_gpus(given: Given) -> list[Any] | None:
    """Checked by parse_launch before the other fields, and read only for its length: the
    node chooses the cards (this reader makes no ContainerSpec attribute)."""
    gpus = empty_as(given.value, None)
    if gpus is not None and (not isinstance(gpus, list) or len(gpus) > MAX_GPUS):
        problem = OUT_OF_RANGE if isinstance(gpus, list) else INVALID
        raise InvalidField(
            given.field, f"must be a list of at most {MAX_GPUS} card indices", problem=problem
        )
    return gpus


def _workdir(given: Given) -> str | None:
    path = read_text(given.body, given.field, limit=MAX_PATH)
    if path and not is_absolute(path):
        raise InvalidField(given.field, "must be an absolute path without '..'")
    return path or None


def _shm_size(given: Given) -> str | None:
    return read_size(given, least=1)


def _memory_limit(given: Given) -> str | None:
    return read_size(given, least=MIN_MEMORY)


def _disk_limit(given: Given) -> str | None:
    return read_size(given, least=MIN_DISK)


def _inode_limit(given: Given) -> int | None:
    value = empty_as(given.value, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidField(given.field, "must be a whole number of inodes")
    if not MIN_INODES <= value <= MAX_INODES:
        raise InvalidField(
            given.field, f"must be from {MIN_INODES} to {MAX_INODES}", problem=OUT_OF_RANGE
        )
    return value


def _cpus(given: Given) -> float | None:
    """A number of CPUs: a number, or 0.3.15's string (``""`` no limit, ``"2"``, ``"0.5"``)."""
    value = empty_as(given.value, None)
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


def _network(given: Given) -> str:
    network = read_text(given.body, given.field, limit=100) or "host"
    if network not in NETWORKS:
        # container:<id> would join another container's namespaces: not a job's to ask.
        raise InvalidField(given.field, f"must be one of {', '.join(NETWORKS)}")
    return network


def _user(given: Given) -> str | None:
    user = read_text(given.body, given.field, limit=100)
    if user and not USER.fullmatch(user):
        raise InvalidField(given.field, "must be a user or uid, with :group or :gid")
    return user or None


def _isolation(given: Given) -> str:
    isolation = read_text(given.body, given.field, limit=100)
    if isolation not in ("", SANDBOX):
        raise InvalidField(given.field, f'must be "{SANDBOX}" or "" (the node\'s rule)')
    return isolation


def _stop_signal(given: Given) -> str | None:
    return parse_signal(given.body, given.field)


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
        Field("image", IMAGE_SCHEMA, IMAGE_DOC, required=True, read=read_image),
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
            read=read_env,
        ),
        Field(
            "gpus",
            or_empty({"type": "array", "maxItems": MAX_GPUS, "items": {}}),
            "Read **only for its length, and only when `requested_gpus` is absent**; the "
            f"indices in it are ignored. At most {MAX_GPUS}.",
        ),
        MOUNTS,
        Field(
            "labels",
            or_empty(string_map(most=MAX_LABELS, keys=NO_NUL)),
            f"At most {MAX_LABELS} extra labels (`tuneplane.user`, `tuneplane.kind`, "
            f"`tuneplane.attempt` are the ones the platform uses). {_named(NODE_LABELS)} "
            f"are the node's and refused, but `{LABEL_RUN_ID}`, if given, must equal "
            "`run_id`. Labels in the engines' own namespaces "
            f"({_named(ENGINE_LABELS)}), which engine tooling acts on, are a `422` naming "
            "the label.",
            read=read_labels,
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
            "quotas; else a job past it is stopped as a stop would (its `warn_signal`, its "
            "stop signal, the grace period, SIGKILL), and observe says `stop_reason: "
            '"disk_limit"`.',
            read=_disk_limit,
        ),
        Field(
            "inode_limit",
            or_empty(number(least=MIN_INODES, most=MAX_INODES, whole=True)),
            f"The files, directories and links the job may make on the engine's disk "
            f"(inodes), its writable layer and anonymous volumes together: from "
            f"{MIN_INODES} to at most the node's `TUNEPLANE_JOB_INODE_LIMIT` (more is a "
            "`422` naming `container.inode_limit`). None: that limit. A job past it is "
            'stopped as a stop would, and observe says `stop_reason: "inode_limit"`.',
            read=_inode_limit,
        ),
        SCRATCH,
        VOLUMES,
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
        WARN_SIGNAL,
        WARN_S,
        Field(
            "rdma",
            or_empty({"type": "boolean"}),
            "`false`: no RDMA devices for this job, whatever the node's rule. `true`: it "
            "needs them; a node that hands jobs none (`TUNEPLANE_RDMA=off`, or no "
            "device) answers `409`. None: the node's rule, `TUNEPLANE_RDMA` (by default "
            "a job holding a card gets them when the machine has any). A job given them "
            "sees them under `/dev/infiniband`, with memlock unlimited, `IPC_LOCK`, and "
            "`NCCL_IB_HCA` set to `TUNEPLANE_FABRICS`' HCAs unless `env` sets it.",
            read=read_flag,
        ),
        Field(
            "read_only_root",
            or_empty({"type": "boolean"}),
            "`true`: the image's filesystem is read-only; the job writes only in `/tmp` "
            "and `/run` (tmpfs, bounded by `TUNEPLANE_JOB_TMPFS_SIZE` and half its "
            "`memory_limit`, counted against its memory) and its mounts, so its writable "
            "layer cannot grow. `false` or none: the operator's rule, "
            "`TUNEPLANE_JOB_READ_ONLY_ROOT`, whose `true` a launch cannot undo.",
            read=read_flag,
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

CONTAINER_FIELDS = CONTAINER.names
# The order the container's fields are checked in, which decides which of two bad
# fields a 422 names: gpus first (parse_launch), then labels, then the table's order.
CHECKED = sorted(CONTAINER.fields, key=lambda field: field.name != "labels")
