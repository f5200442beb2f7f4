"""Every request of protocol 1 as a pydantic model: what `requests` accepts, said in JSON
Schema for the OpenAPI document (`schema`).

The parsers in `requests` stay the judges: these models validate nothing at run time.
Each bound below is the parser's own constant, and `tests/test_wire_schema.py` checks,
field by field, that what a model allows the parser accepts and what it refuses the
parser refuses. What JSON Schema cannot say (an image name over 255 characters, a size
string's value, the mount roots the operator allows) is said in the field's description.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from tuneplane_node.sizes import SIZE
from tuneplane_node.wire import requests as wire

# Patterns are anchored here (JSON Schema searches; the parsers fullmatch) and written in
# the syntax Python and ECMA-262 share: no \d, \w or named groups.
NO_NUL = "^[^\\x00]*$"
NO_CONTROL = f"^[^{wire.CONTROL.pattern[1:-1]}]*$"
# An absolute path none of whose segments is "..": a segment is empty, ".", or does
# not start with "..", or is ".." followed by more.
_SEGMENT = r"(?:[^/.\x00][^/\x00]*|\.(?:[^/.\x00][^/\x00]*)?|\.\.[^/\x00]+)?"
ABSOLUTE_PATH = f"^/{_SEGMENT}(?:/{_SEGMENT})*$"


def anchored(pattern: str) -> str:
    """A parser's fullmatch pattern as a JSON Schema pattern."""
    return f"^(?:{pattern.replace('(?P<name>', '(?:')})$"


def either(*words: str) -> str:
    """A pattern of these words in any case, or nothing (the parsers lower-case them)."""
    spelt = ("".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in w) for w in words)
    return f"^(?:{'|'.join(spelt)})?$"


# 0.3.15 consoles send "" for a field they leave empty. Said by hand where pydantic's
# releases say it differently (2.7 adds an enum), so the document is the same on each.
Empty = Annotated[Literal[""], WithJsonSchema({"type": "string", "const": ""})]
Text = Annotated[str, Field(max_length=wire.MAX_VALUE, pattern=NO_NUL)]
Path = Annotated[str, Field(max_length=wire.MAX_PATH, pattern=ABSOLUTE_PATH)]
TEXT = {"type": "string", "maxLength": wire.MAX_VALUE, "pattern": NO_NUL}
# The program, then its arguments: only the program may not be empty.
ARGV = {"type": "array", "maxItems": wire.MAX_ARGS, "prefixItems": [{**TEXT, "minLength": 1}]}
Argv = Annotated[list[str], WithJsonSchema({**ARGV, "items": TEXT})]
Seconds = Annotated[float, Field(ge=0)]
Ref = Annotated[str, Field(min_length=1, max_length=wire.MAX_REF, pattern=NO_NUL)]


def string_map(*, most: int, keys: str) -> dict[str, Any]:
    """An object of strings (numbers are turned into strings) with at most ``most``
    entries, whose names match ``keys``; said by hand, as pydantic says a constrained
    key with patternProperties, which lets any other name through."""
    value = {"anyOf": [TEXT, {"type": "number"}]}
    names = {"minLength": 1, "maxLength": wire.MAX_KEY, "pattern": keys}
    shape = {"type": "object", "maxProperties": most, "propertyNames": names}
    return {**shape, "additionalProperties": value}


Env = Annotated[dict[str, Any], WithJsonSchema(string_map(most=wire.MAX_ENV, keys="^[^=\\x00]*$"))]
Labels = Annotated[dict[str, Any], WithJsonSchema(string_map(most=wire.MAX_LABELS, keys=NO_NUL))]


class _Strict(BaseModel):
    """A body whose unknown fields are refused by name (launch and its container)."""

    model_config = ConfigDict(extra="forbid")


class _Open(BaseModel):
    """A body whose other fields are ignored (pydantic 2.7 would not say so)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": True})


class MountObject(_Open):
    """A bind mount as an object; other keys are ignored."""

    host: Path
    container: Path
    read_only: bool = False


Mount = tuple[Path, Path] | tuple[Path, Path, bool] | MountObject
Name = Annotated[
    str,
    Field(
        pattern=anchored(wire.NAME.pattern),
        json_schema_extra={"not": {"pattern": anchored(wire.LOOKS_LIKE_ID.pattern)}},
    ),
]
Image = Annotated[
    str, Field(min_length=1, max_length=1000, pattern=anchored(wire.IMAGE_REFERENCE.pattern))
]
SizeText = Annotated[str, Field(pattern=anchored(SIZE.pattern))]  # value: see the parser
Cpus = Annotated[float, Field(gt=0, le=wire.MAX_CPUS)]
CpusText = Annotated[str, Field(pattern=f"^\\s*(?:{wire.DECIMAL.pattern})\\s*$")]
Network = Annotated[
    str | None, WithJsonSchema({"anyOf": [{"enum": [*wire.NETWORKS, ""]}, {"type": "null"}]})
]
User = Annotated[str, Field(pattern=anchored(wire.USER.pattern))]


class Container(_Strict):
    """The job's container: the fields of 0.3.15's ContainerSpec, "" or null for none."""

    name: Name | Empty | None = Field(
        None, description="The ref of the other verbs; not 12 or more hex digits alone."
    )
    image: Image = Field(
        description=f"Lower-case path; the name before the tag at most {wire.MAX_IMAGE_NAME} long."
    )
    command: Argv | Empty | None = Field(
        None, description="The argv; replaces the image's entrypoint."
    )
    env: Env | Empty | None = Field(
        None, description="NVIDIA_VISIBLE_DEVICES is the node's: a value given is dropped."
    )
    gpus: Annotated[list[Any], Field(max_length=wire.MAX_GPUS)] | Empty | None = Field(
        None, description="Read only for its length, when requested_gpus is absent."
    )
    mounts: Annotated[list[Mount], Field(max_length=wire.MAX_MOUNTS)] | Empty | None = Field(
        None, description="Host paths must exist under the node's allowed mount roots."
    )
    labels: Labels | Empty | None = Field(
        None, description="tuneplane.gpus is the node's; tuneplane.run-id must be run_id."
    )
    workdir: Path | Empty | None = None
    shm_size: Annotated[int, Field(ge=1, le=wire.MAX_SIZE)] | SizeText | Empty | None = Field(
        None, description="Bytes, or a size like 512m or 16g, up to 1 PiB."
    )
    cpu_limit: Cpus | CpusText | Empty | None = Field(
        None, description=f"CPUs, more than 0 and at most {wire.MAX_CPUS:g}."
    )
    memory_limit: (
        Annotated[int, Field(ge=wire.MIN_MEMORY, le=wire.MAX_SIZE)] | SizeText | Empty | None
    ) = Field(None, description="Bytes, or a size like 512m or 16g, from 6 MiB to 1 PiB.")
    network: Network = Field(None, description="Default: host.")
    user: User | Empty | None = Field(None, description="A user or uid, with :group or :gid.")


class LaunchBody(_Strict):
    run_id: Annotated[str, Field(min_length=1, max_length=200, pattern=NO_CONTROL)]
    requested_gpus: Annotated[int, Field(ge=0, le=wire.MAX_GPUS)] | None = Field(
        None, description="Cards the node chooses; absent: the length of container.gpus."
    )
    container: Container


RefList = Annotated[
    list[Annotated[str, Field(min_length=1, max_length=wire.MAX_REF)]],
    Field(max_length=wire.MAX_REFS),
]


class RefsBody(BaseModel):
    refs: RefList


class StatsBody(BaseModel):
    refs: RefList = Field(
        default_factory=list, description="Absent: every running job of the node."
    )


class RefBody(BaseModel):
    ref: Ref


class StopBody(RefBody):
    timeout: Annotated[Seconds, Field(le=wire.MAX_GRACE_S)] | None = Field(
        None, description="Seconds from SIGTERM to SIGKILL."
    )


class ReapBody(BaseModel):
    max_age_s: Annotated[Seconds, Field(le=wire.MAX_AGE_S)] | None = None


class CordonBody(BaseModel):
    reason: Annotated[str, Field(max_length=wire.MAX_REASON, pattern=NO_NUL)] | None = None


class DrainBody(CordonBody):
    grace_s: Annotated[Seconds, Field(le=wire.MAX_GRACE_S)] | None = Field(
        None, description="Seconds from SIGTERM to SIGKILL for every job."
    )


class UncordonBody(_Open):
    """Nothing is read from it."""


class LogsQuery(BaseModel):
    """The query of GET /node/v1/logs."""

    ref: Ref
    tail: Annotated[int, Field(ge=1, le=wire.MAX_TAIL)] = wire.DEFAULT_TAIL
    since: str = Field("", description="An RFC 3339 time, or seconds since the epoch.")
    follow: Annotated[str, Field(pattern=either(*wire.FOLLOW_WORDS))] = Field(
        "", description="1 or true: stream text/plain until the job exits."
    )
