"""A request's fields, each declared once, and the JSON Schema they are declared in.

A `Field` holds what every reader of the contract needs: its name, its value in JSON
Schema, its one line of documentation and, on a launch's container, the function that
reads it. The parsers (`requests`, `verbs`, ...), the OpenAPI document (`schema`) and docs/api.md
(``contrib/dev/api_docs.py``) all read the same declarations.

Patterns are anchored here (JSON Schema searches; the parsers fullmatch) and written in
the syntax Python and ECMA-262 share: no \\d, \\w or named groups.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar, cast

from tuneplane_node.errors import MAX_FIELD_ERRORS, InvalidField, UnknownField

Schema = Mapping[str, Any]
P = ParamSpec("P")
T = TypeVar("T")
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
class Words:
    """The words a string of an answer can be (``Annotated[str, Words(...)]``): an enum
    the OpenAPI document names once, as ``name``."""

    name: str
    values: tuple[str, ...]
    doc: str


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
    OpenAPI document. ``closed``: any other field is refused by name (``stop
    {"timout": 600}`` must not become a SIGKILL after 30 s); otherwise other fields are
    ignored. ``rule``: what the fields' schemas alone cannot say (a field required
    when another has some form), added to the body's schema as it is."""

    name: str
    fields: tuple[Field, ...]
    closed: bool = True
    doc: str = ""
    rule: Schema | None = None  # JSON Schema of a rule across fields (if/then), or None
    examples: tuple[Schema, ...] = ()  # bodies the node takes, in the document

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


class Refusals:
    """The bad fields of one request, gathered so that its 422 lists every one of them
    rather than the first. Used as ``with Refusals() as refusals:``, the block reads each
    field through `read`; leaving it raises what was refused as one `InvalidField` (the
    first refusal's sentence and code, every bad field in its ``errors``)."""

    def __init__(self) -> None:
        self.found: list[InvalidField] = []

    def __enter__(self) -> Refusals:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None and self.found:
            raise self.error()

    def error(self) -> InvalidField:
        """Every refusal so far as one error (raised by the block that cannot go on)."""
        return InvalidField.of(self.found)

    def read(self, parse: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """What ``parse`` returns; when it refuses, the refusal is kept and None returned
        (a value only the block sees: leaving the block raises)."""
        try:
            return parse(*args, **kwargs)
        except InvalidField as exc:
            self.found.append(exc)
            return cast(T, None)

    def refuse(self, error: InvalidField) -> None:
        self.found.append(error)

    @property
    def full(self) -> bool:
        """Whether enough is refused for one answer: a body of 10,000 typos is not
        read to its end."""
        return sum(len(error.errors) for error in self.found) >= MAX_FIELD_ERRORS

    def unknown(self, given: Mapping[str, Any], body: Body, *, prefix: str = "") -> None:
        """Refuse each field of ``given`` that a closed ``body`` does not have."""
        if not body.closed:
            return
        for key in given:
            if key not in body.names and not self.full:
                shown = key if key.isidentifier() else json.dumps(key)[:100]
                self.refuse(UnknownField(f"{prefix}{shown}", known=body.names))
