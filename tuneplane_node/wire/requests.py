"""The launch, the contract's main request, field by field; and how every request of
protocol 1 is declared and read.

The parsers are the one source of the contract. Each field is a `Field` in a table
(`LAUNCH` here, its `CONTAINER` in `container`, the other verbs' bodies in `verbs`,
`images` and `volumes`): its name, its value in JSON Schema, its line of documentation
and, in the container, its reader. A plain container field is one `Field` entry in
`CONTAINER`, its reader beside it and `values.LaunchContainer`'s attribute (the
runtime spec's by inheritance, the retry digest's by its place); a field with rules of
its own is declared whole beside them (`mounts.MOUNTS`, `mounts.SCRATCH`,
`volumes.VOLUMES`), and the readers every table shares are in `readers`.
`CONTAINER_FIELDS`, the OpenAPI document (`schema`) and docs/api.md all come from those
tables, and `tests/unit/test_wire_schema.py` holds each schema to its parser at every
bound. Chosen over pydantic models that validate: the parsers' exact refusals
(``container.mounts[1]``, ``container.env.<KEY>``, ``""`` read as not given, numbers as
strings) are what consoles act on, and a model would need a validator per field to say
them, the rules spelt a second time.

Every parser raises `InvalidField` naming the field, so a bad request is a 422 the
console can act on, never a traceback and never a 502 blamed on the engine; a verb's
parser (`parse_launch`, `verbs.parse_stop_body`, ...) reads every field through
`Refusals`, so its 422 lists every bad field, the first one's sentence as its
``detail``. Every verb refuses a field its table does not have. Every number has stated
bounds, every string a length, every list a count. A launch may carry exactly the
fields of 0.3.15's ``ContainerSpec``, and ``""`` for the ones it leaves empty; anything
else is refused by name, so a typo never runs the image's own entrypoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuneplane_node.errors import INVALID, MISSING, OUT_OF_RANGE, InvalidField
from tuneplane_node.wire.container import CHECKED, CONTAINER, MAX_GPUS, read_gpus
from tuneplane_node.wire.fields import (
    Body,
    Field,
    Given,
    Refusals,
    number,
    or_empty,
    or_null,
    text,
)
from tuneplane_node.wire.images import (
    read_pull_policy,
    read_registry_auth,
)
from tuneplane_node.wire.readers import (
    CONTROL,
    NO_CONTROL,
    empty_as,
    is_int,
    read_text,
)
from tuneplane_node.wire.readers import (
    whole as whole_number,
)
from tuneplane_node.wire.values import (
    LABEL_RUN_ID,
    Launch,
    LaunchContainer,
    container_name,
)

MAX_RUN_ID = 200


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
        gpus = refusals.read(read_gpus, Given(container, "container.gpus", seen))
        requested = refusals.read(_requested_gpus, body.get("requested_gpus"), gpus)
        asked = refusals.read(parse_container, container, seen)
        auth = refusals.read(read_registry_auth, Given(container, "container.registry_auth", seen))
        policy = refusals.read(read_pull_policy, Given(container, "container.pull_policy", seen))
        relaunch = refusals.read(_relaunch, body.get("relaunch"))
    return Launch(run_id, requested, asked, auth=auth, pull_policy=policy, relaunch=relaunch)


def _relaunch(value: object) -> bool:
    """``true`` (the default, also for ``""`` and null) or ``false``."""
    value = empty_as(value, True)
    if not isinstance(value, bool):
        raise InvalidField("relaunch", "must be true or false")
    return value


def _run_id(body: Mapping[str, Any]) -> str:
    run_id = read_text(body, "run_id", required=True, limit=MAX_RUN_ID)
    if CONTROL.search(run_id):
        raise InvalidField("run_id", "must not hold control characters")
    return run_id


def _requested_gpus(requested: object, gpus: list[Any] | None) -> int:
    if requested is None:  # 0.3.15 consoles may say it only through container.gpus
        requested = len(gpus or [])
    requested = whole_number(requested)
    whole = requested if isinstance(requested, int) and is_int(requested) else None
    if whole is None or not 0 <= whole <= MAX_GPUS:
        problem = INVALID if whole is None else OUT_OF_RANGE
        why = f"must be a whole number from 0 to {MAX_GPUS}"
        raise InvalidField("requested_gpus", why, problem=problem)
    return whole


def parse_container(body: Mapping[str, Any], run_id: str) -> LaunchContainer:
    """What the table's readers make of the container object, each the attribute of its
    name (`LaunchContainer`, whose names and types a test holds to the table's); every
    bad field of it refused at once. No name: the run's (`container_name`)."""
    with Refusals() as refusals:
        values = {
            field.name: refusals.read(field.read, Given(body, f"container.{field.name}", run_id))
            for field in CHECKED
            if field.read is not None
        }
    values["name"] = values["name"] or container_name(run_id)
    return LaunchContainer(**values)


LAUNCH = Body(
    "LaunchBody",
    closed=True,
    # A launch that runs (a fuzzer sends it first, its image the engine's own): the
    # generated ones rarely name a program the image has.
    examples=(
        {
            "run_id": "ft-7",
            "container": {
                "image": "registry.example/trainer:1",
                "command": ["/bin/sh", "-c", "echo step 1; sleep 2; echo done"],
                "env": {"STEPS": "100"},
                "memory_limit": "1g",
                "network": "bridge",
                "read_only_root": True,
            },
            "requested_gpus": 0,
            "relaunch": True,
        },
    ),
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
            'in 0.3.15; also for `""`): the job is launched again, with this launch\'s '
            "spec, the same or another (a console resumes a run with a new command), and "
            "the exited container (its exit code and logs) is removed once the launch has "
            "passed every check of the node (its fields, image and credentials, volumes, "
            "mounts, cards): a refused relaunch leaves it as it was. `false`: at most "
            "once: the exited job is the answer to its own spec (`phase: exited`, its "
            "`exit_code`, `idempotent: true`), nothing removed or started, and another "
            "spec is a `409` (`run_conflict`) naming the fields that differ. A launch of "
            "a run whose container runs or whose launch is pending is idempotent with "
            "the same spec and a `409` (`run_conflict`) with another, either way.",
        ),
    ),
)
LAUNCH_FIELDS = LAUNCH.names
