"""The readers and rules every request's table shares: a field's text, its ``""`` as
not given, a size, a flag, an absolute path, a signal, and a verb's body read whole.

Each raises `InvalidField` naming the field it reads (see `requests` for the contract
they keep); the tables that use them are in `requests` (the launch), `mounts`,
`volumes`, `images` and `verbs`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tuneplane_node.errors import INVALID, MISSING, OUT_OF_RANGE, InvalidField
from tuneplane_node.signals import JOB_SIGNALS
from tuneplane_node.signals import job_signal as job_signal  # ctl reads signals so too
from tuneplane_node.sizes import MAX_SIZE, SIZE, size_in_bytes
from tuneplane_node.wire.fields import Body, Given, Refusals, Schema, anchored, text

MAX_PATH = 4096
DECIMAL = re.compile(r"[0-9]+(\.[0-9]+)?|\.[0-9]+")
# A number in a query as a JSON Schema number is written (JSON's grammar, and Python's
# repr of a float: ``10``, ``10.0``, ``1e+16``, ``1.7e9``), unsigned; never what float()
# alone would take besides (``inf``, ``nan``, ``1_0``, `` 10``).
NUMBER_TEXT = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
MAX_NUMBER_TEXT = 40
CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# The same rules in JSON Schema, for the tables.
NO_CONTROL = f"^[^{CONTROL.pattern[1:-1]}]*$"
# An absolute path none of whose segments is "..": a segment is empty, ".", or does
# not start with "..", or is ".." followed by more.
_SEGMENT = r"(?:[^/.\x00][^/\x00]*|\.(?:[^/.\x00][^/\x00]*)?|\.\.[^/\x00]+)?"
ABSOLUTE_PATH = f"^/{_SEGMENT}(?:/{_SEGMENT})*$"
PATH = text(most=MAX_PATH, pattern=ABSOLUTE_PATH)
SIZE_TEXT = {"type": "string", "pattern": anchored(SIZE.pattern)}  # its value: the doc


def field_key(field: str) -> str:
    return field.rsplit(".", 1)[-1]


def empty_as(value: object, default: object) -> object:
    """0.3.15 consoles send every field, ``""`` for the ones they leave empty."""
    return default if value is None or value == "" else value


def read_text(
    body: Mapping[str, Any], field: str, *, required: bool = False, limit: int = 4096
) -> str:
    value = body.get(field_key(field))
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


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def whole(value: object) -> object:
    """A float with no fraction (``947.0``) as its int: JSON Schema's integer, which a
    client's JSON may write so; any other value as it is."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    return value


def read_list(given: Given, *, most: int, what: str) -> list[Any]:
    """A list of at most ``most`` entries (``""`` or null: none), else a 422 saying so."""
    value = empty_as(given.value, [])
    if not isinstance(value, list) or len(value) > most:
        raise InvalidField(
            given.field,
            f"must be a list of at most {most} {what}",
            problem=OUT_OF_RANGE if isinstance(value, list) else INVALID,
        )
    return value


def is_absolute(path: object) -> bool:
    return (
        isinstance(path, str)
        and path.startswith("/")
        and len(path) <= MAX_PATH
        and "\x00" not in path
        and ".." not in path.split("/")
    )


def read_size(given: Given, *, least: int) -> str | None:
    value = whole(given.value)
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


def read_flag(given: Given) -> bool | None:
    """True or false; None when not given."""
    value = given.value
    if value is None or value == "":
        return None
    if not isinstance(value, bool):
        raise InvalidField(given.field, "must be true or false")
    return value


SIGNAL: Schema = {"anyOf": [{"enum": list(JOB_SIGNALS)}, {"enum": list(JOB_SIGNALS.values())}]}
SIGNALS_DOC = (
    f"{', '.join(f'`{name}`' for name in JOB_SIGNALS)}, by name or number; SIGKILL and "
    "SIGSTOP cannot be asked for (a job cannot catch either)"
)


def parse_signal(body: Mapping[str, Any], field: str) -> str | None:
    """A signal of `JOB_SIGNALS` by its name or number, as its name; ``""`` or absent:
    None."""
    value = body.get(field_key(field))
    if value is None or value == "":
        return None
    # A number, or a name exactly as JOB_SIGNALS spells it (the schema's enum): ctl and
    # the engines' records go through job_signal's looser reading, a request does not.
    exact = isinstance(value, str) and value in JOB_SIGNALS
    name = job_signal(value) if is_int(value) else value if exact else None
    if name is None:
        raise InvalidField(field, f"must be one of {SIGNALS_DOC}")
    return name


def read_body(
    body: Mapping[str, Any], table: Body, *reads: Callable[[Mapping[str, Any]], Any]
) -> Any:
    """What each of ``reads`` reads of a body of ``table``: its unknown fields and every
    bad one refused in one 422."""
    with Refusals() as refusals:
        refusals.unknown(body, table)
        values = tuple(refusals.read(read, body) for read in reads)
    return values
