"""The launch's objects of strings, ``container.env`` and ``container.labels``: their
bounds, their schema and their readers (each entry read, every bad one refused by name)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tuneplane_node.errors import OUT_OF_RANGE, InvalidField
from tuneplane_node.wire.fields import Given, Refusals, Schema, text
from tuneplane_node.wire.readers import empty_as
from tuneplane_node.wire.values import LABEL_RUN_ID, NODE_LABELS

ENGINE_LABELS = ("com.docker.", "io.containers.", "io.podman.", "org.opencontainers.")
MAX_ENV = 1000
MAX_LABELS = 100
MAX_VALUE = 65536
MAX_KEY = 256  # an env variable's or a label's name
VALUE = text(most=MAX_VALUE)


def string_map(*, most: int, keys: str) -> Schema:
    """An object of strings (numbers are turned into strings) with at most ``most``
    entries, whose names match ``keys`` (propertyNames: patternProperties would let any
    other name through)."""
    names = {"minLength": 1, "maxLength": MAX_KEY, "pattern": keys}  # names: strings always
    shape = {"type": "object", "maxProperties": most, "propertyNames": names}
    return {**shape, "additionalProperties": {"anyOf": [VALUE, {"type": "number"}]}}


def read_string_map(
    given: Given, *, limit: int, rule: Callable[[str, str], None] | None = None
) -> dict[str, str]:
    """An object of strings, each entry read; then ``rule`` of each entry read well.
    Every bad entry is refused at once, the same one first as when one was."""
    field, value = given.field, empty_as(given.value, {})
    if not isinstance(value, Mapping):
        raise InvalidField(field, "must be an object of strings")
    if len(value) > limit:
        raise InvalidField(field, f"at most {limit} entries", problem=OUT_OF_RANGE)
    with Refusals() as refusals:
        read = {key: refusals.read(map_entry, field, key, item) for key, item in value.items()}
        result = {str(key): item for key, item in read.items() if item is not None}
        for key, item in result.items():
            if rule is not None and not refusals.full:
                refusals.read(rule, key, item)
    return result


def map_entry(field: str, key: str, item: object) -> str:
    if not 0 < len(key) <= MAX_KEY or "\x00" in key:
        raise InvalidField(field, f"keys must be 1 to {MAX_KEY} characters")
    if isinstance(item, bool) or not isinstance(item, (str, int, float)):
        raise InvalidField(f"{field}.{key}", "must be a string")
    string = str(item)
    if len(string) > MAX_VALUE or "\x00" in string:
        raise InvalidField(f"{field}.{key}", f"at most {MAX_VALUE} characters, no NUL")
    return string


def read_env(given: Given) -> dict[str, str]:
    def named(key: str, _: str) -> None:
        if "=" in key:
            raise InvalidField(f"{given.field}.{key}", "a variable's name cannot hold '='")

    return read_string_map(given, limit=MAX_ENV, rule=named)


def read_labels(given: Given) -> dict[str, str]:
    """The console's labels and the run id's, which the node writes on every job."""

    def allowed(key: str, value: str) -> None:
        if key.startswith(ENGINE_LABELS):
            # Engine tooling acts on these (io.containers.autoupdate pulls and restarts).
            raise InvalidField(f"{given.field}.{key}", "the engines' own namespace")
        if key in NODE_LABELS and (key, value) != (LABEL_RUN_ID, given.run_id):
            raise InvalidField(given.field, f"{', '.join(NODE_LABELS)} are the node's")

    labels = read_string_map(given, limit=MAX_LABELS, rule=allowed)
    return {**labels, LABEL_RUN_ID: given.run_id}
