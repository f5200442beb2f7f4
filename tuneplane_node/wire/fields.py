"""A request's fields, each declared once, and the JSON Schema they are declared in.

A `Field` holds what every reader of the contract needs: its name, its value in JSON
Schema, its one line of documentation and, on a launch's container, the function that
reads it. The parsers (`requests`), the OpenAPI document (`schema`) and docs/api.md
(``contrib/dev/api_docs.py``) all read the same declarations.

Patterns are anchored here (JSON Schema searches; the parsers fullmatch) and written in
the syntax Python and ECMA-262 share: no \\d, \\w or named groups.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Schema = Mapping[str, Any]
NO_NUL = "^[^\\x00]*$"
EMPTY: Schema = {"type": "string", "const": ""}
NULL: Schema = {"type": "null"}


@dataclass(frozen=True)
class Given:
    """What a container field's reader is given: the container object, the field's path
    in the launch (``container.env``: the name its 422 gives) and the run id (the
    default name and the run-id label need it)."""

    body: Mapping[str, Any]
    field: str
    run_id: str

    @property
    def value(self) -> Any:
        return self.body.get(self.field.rsplit(".", 1)[-1])


@dataclass(frozen=True)
class Field:
    """One field of a request's body or query.

    ``schema`` is its value in JSON Schema, or the `Body` of a nested object; what JSON
    Schema cannot say is said in ``doc``, which is both its line in docs/api.md and its
    description in the OpenAPI document. ``read``, on a launch's container, turns it into
    the ContainerSpec attribute of the same name (none: the field makes no attribute, as
    ``gpus``, which `parse_launch` reads for ``requested_gpus``); the other verbs'
    fields are read by their ``parse_*`` functions.
    """

    name: str
    schema: Schema | Body
    doc: str
    required: bool = False
    read: Callable[[Given], Any] | None = None


@dataclass(frozen=True)
class Body:
    """A request's JSON object, or a query: its fields in order, and its name in the
    OpenAPI document. ``closed``: any other field is refused by name (a launch: a typo
    must never run the image's own entrypoint); otherwise other fields are ignored."""

    name: str
    fields: tuple[Field, ...]
    closed: bool = False
    doc: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(field.name for field in self.fields)

    @property
    def required(self) -> bool:
        """Whether a request must carry the body (some field of it is required)."""
        return any(field.required for field in self.fields)


def anchored(pattern: str) -> str:
    """A parser's fullmatch pattern as a JSON Schema pattern."""
    return f"^(?:{pattern.replace('(?P<name>', '(?:')})$"


def either(*words: str) -> str:
    """A pattern of these words in any case, or nothing (the parsers lower-case them)."""
    spelt = ("".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in w) for w in words)
    return f"^(?:{'|'.join(spelt)})?$"


def text(*, most: int, least: int = 0, pattern: str | None = NO_NUL) -> Schema:
    """A string of ``least`` to ``most`` characters matching ``pattern`` (None: any)."""
    shape: dict[str, Any] = {"type": "string", "maxLength": most}
    if least:
        shape["minLength"] = least
    if pattern is not None:
        shape["pattern"] = pattern
    return shape


def number(*, least: float, most: float, whole: bool = False, above: bool = False) -> Schema:
    """A number from ``least`` (``above``: more than it) to ``most``."""
    low = {"exclusiveMinimum": least} if above else {"minimum": least}
    return {"type": "integer" if whole else "number", **low, "maximum": most}


def closed_object(**properties: Schema) -> Schema:
    """An object of exactly these fields, each required."""
    shape = {"type": "object", "properties": properties, "required": list(properties)}
    return {**shape, "additionalProperties": False}


def or_null(schema: Schema) -> Schema:
    return {"anyOf": [schema, NULL]}


def or_empty(*schemas: Schema) -> Schema:
    """One of ``schemas``, or 0.3.15's ``""`` or null for a field left empty."""
    return {"anyOf": [*schemas, EMPTY, NULL]}
