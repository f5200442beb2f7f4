"""The OpenAPI 3.1 document of the API, generated from what the daemon's routes declare
(`Operation`s, in `daemon/routes.py`), the request bodies declared field by field in
`requests`, and the answers' TypedDicts (`answers`). Pure: no I/O.

The daemon serves it at ``GET /node/v1/openapi.json``; ``contrib/openapi.json`` is a copy
that ``contrib/dev/api_docs.py`` writes and a test keeps current.
"""

from __future__ import annotations

import enum
import functools
import json
import types
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, WithJsonSchema, create_model

from tuneplane_node.errors import (
    BadRequest,
    EngineRefused,
    EngineUnavailable,
    InsufficientScope,
    InvalidField,
    MissingProtocol,
    NoClientCertificate,
    NodeError,
    PayloadTooLarge,
    ProtocolMismatch,
    TooManyAuthFailures,
    Unauthorized,
    UnknownField,
)
from tuneplane_node.wire import (
    MAX_BODY_BYTES,
    PROTOCOL,
    PROTOCOL_HEADER,
    SPOKEN,
    answers,
    stats,
)
from tuneplane_node.wire.fields import Body, Words
from tuneplane_node.wire.fields import Field as RequestField

API_PREFIX = "/node/v1/"
DOCUMENT_PATH = f"{API_PREFIX}openapi.json"
REFS = "#/components/schemas/{model}"
ERRORS = {
    400: "The request cannot be read: not JSON, not an object, or no protocol header.",
    401: "Wrong or missing bearer token; with mutual TLS, no client certificate.",
    403: "The token's scope does not buy this verb (the detail names the scope it needs); "
    "or a private image the node pulled with credentials, and this launch has none its "
    "registry accepts for it; nothing was created.",
    409: "Well-formed, but the node will not do it now (the code says why); also a "
    "protocol header of another version.",
    413: f"The body is over {MAX_BODY_BYTES} bytes.",
    422: "A field is missing, unknown or out of its bounds; the detail starts with the first "
    "one's name, and `errors` lists every bad field.",
    429: "This address kept sending wrong tokens (20 in 10 s): try again later; or every "
    "slot for following a log is taken: try again later, or without follow.",
    500: "A bug in the node, or its state file could not be written.",
    502: "The engine answered and refused; its words follow.",
    503: "The engine could not be reached: nothing is known, nothing is reported gone.",
    507: "No room: the engine's image store is at or above the image GC's high threshold, "
    "or the image (its registry's compressed size) is larger than the room left below it "
    "even after a GC run (then nothing is removed; `needed_bytes`, `free_bytes`, "
    "`freeable_bytes` and `high_percent` are fields of the answer; nothing was reserved or "
    "created); or the node's state file, or the private-image record a pull with "
    "credentials needs first, could not be written for want of space.",
}
# Which errors each kind of operation can answer, beyond its own (and NodeError's 500).
Raised = type[NodeError] | int  # an int: a status whose codes are not declared
GUARDED: tuple[Raised, ...] = (  # every /node/v1/ path: the token and the protocol header
    MissingProtocol,
    Unauthorized,
    NoClientCertificate,
    InsufficientScope,
    TooManyAuthFailures,
    ProtocolMismatch,
)
BODY: tuple[Raised, ...] = (BadRequest, PayloadTooLarge, InvalidField, UnknownField)
QUERY: tuple[Raised, ...] = (InvalidField, UnknownField)
ENGINE: tuple[Raised, ...] = (EngineUnavailable, EngineRefused)  # calls the engine
# A builder may widen a shape with its subclasses' keys: the document lists each form.
WIDENED: dict[Any, tuple[Any, ...]] = {
    answers.StateJson: (answers.PendingStateJson, answers.StoppedStateJson, answers.StateJson),
    stats.AbsentJson: (stats.UsageJson, stats.AbsentJson),
}
TEXT = {"schema": {"type": "string"}}
SELF = Annotated[dict[str, Any], WithJsonSchema({"type": "object", "required": ["openapi"]})]


@dataclass(frozen=True)
class Operation:
    """One route as the document says it: the 200's JSON shape (``answer``; None: none),
    the request's body or query, the errors (`NodeError` classes) beyond those every
    operation of its kind can answer, ``text``, the media type of a text/plain 200, and
    the optional ``feature`` it serves (health's and inventory's ``features``)."""

    method: str
    path: str
    summary: str
    answer: Any
    body: Body | None = None
    query: Body | None = None
    errors: tuple[Raised, ...] = ()
    text: str | None = None
    accepted: bool = False  # it may answer 202 as well, the same shape: begun, not done
    feature: str | None = None

    @property
    def guarded(self) -> bool:
        return self.path.startswith(API_PREFIX)

    @property
    def codes(self) -> dict[int, list[str]]:
        """Each status the operation may answer, with the codes it answers it with."""
        raised = [*self.errors, *(GUARDED if self.guarded else ()), NodeError]
        raised += [*(BODY if self.body else ()), *(QUERY if self.query else ())]
        found: dict[int, set[str]] = {}
        for kind in raised:
            status, codes = (kind, ()) if isinstance(kind, int) else (kind.status, (kind.code,))
            found.setdefault(status, set()).update(codes)
        return {status: sorted(found[status]) for status in sorted(found)}

    @property
    def statuses(self) -> list[int]:
        return list(self.codes)


class Components:
    """The named schemas the operations refer to, gathered as they are generated."""

    def __init__(self) -> None:
        self.schemas: dict[str, Any] = {}

    def schema(self, shape: Any) -> dict[str, Any]:
        """A reference to a model's schema (added under its name), or the schema itself."""
        adapted = portable(shape)
        generated = self.inline(adapted)
        # get_origin: on Python 3.10 dict[str, Any] passes for a class.
        if typing.get_origin(adapted) is None and issubclass(adapted, BaseModel):
            self.add(adapted.__name__, generated)
            return {"$ref": REFS.format(model=adapted.__name__)}
        return generated

    def inline(self, shape: Any) -> dict[str, Any]:
        generated = TypeAdapter(portable(shape)).json_schema(ref_template=REFS)
        for name, definition in generated.pop("$defs", {}).items():
            self.add(name, definition)
        return normalized(generated)  # type: ignore[no-any-return]

    def body(self, body: Body) -> dict[str, Any]:
        """A reference to a request body's schema, added under its name."""
        shape: dict[str, Any] = {"type": "object", "additionalProperties": not body.closed}
        shape["properties"] = {field.name: self.value(field) for field in body.fields}
        required = [field.name for field in body.fields if field.required]
        if required:
            shape["required"] = required
        if body.doc:
            shape["description"] = body.doc
        if body.rule is not None:
            shape |= body.rule
        if body.examples:
            shape["examples"] = [dict(example) for example in body.examples]
        self.add(body.name, shape)
        return {"$ref": REFS.format(model=body.name)}

    def value(self, field: RequestField) -> dict[str, Any]:
        """A field's schema, with its doc as its description."""
        nested = field.schema
        schema = self.body(nested) if isinstance(nested, Body) else normalized(dict(nested))
        return {**schema, "description": field.doc}

    def add(self, name: str, definition: dict[str, Any]) -> None:
        known = self.schemas.setdefault(name, normalized(definition))
        assert known == normalized(definition), f"two shapes are called {name}"


def document(operations: Iterable[Operation]) -> dict[str, Any]:
    """The whole document of these operations."""
    components = Components()
    paths: dict[str, dict[str, Any]] = {}
    for operation in operations:
        paths.setdefault(operation.path, {})[operation.method] = _operation(operation, components)
    components.schema(answers.ErrorJson)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "tuneplane-node",
            "version": str(PROTOCOL),
            "description": "The node daemon's API, wire protocol "
            f"{PROTOCOL}. Every /node/v1 path needs the bearer token and the "
            f"{PROTOCOL_HEADER} header; every error is {{'detail': <sentence>, 'code': "
            "<word>}, and a request error lists its bad fields in 'errors'. The codes each "
            "answer may carry are listed in its x-codes.",
        },
        "paths": paths,
        "components": {
            "schemas": components.schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "parameters": {"protocol": _protocol_header()},
        },
    }


def render(document: dict[str, Any]) -> str:
    """The document as ``contrib/openapi.json`` holds it."""
    return json.dumps(document, sort_keys=True, indent=2) + "\n"


def _operation(operation: Operation, components: Components) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "summary": operation.summary,
        "operationId": operation.path.strip("/").replace("/", "_").replace(".", "_"),
        "responses": {
            "200": {"description": "Done.", "content": _content(operation, components)},
            **_accepted(operation, components),
            **{str(status): _error(status, codes) for status, codes in operation.codes.items()},
        },
    }
    if operation.feature is not None:
        spec["x-feature"] = operation.feature
    if 401 in operation.statuses:
        spec["security"] = [{"bearer": []}]
    parameters = [*_query(operation.query, components)] if operation.query else []
    if operation.guarded:
        parameters.append({"$ref": "#/components/parameters/protocol"})
    if parameters:
        spec["parameters"] = parameters
    if operation.body is not None:
        spec["requestBody"] = {
            "required": operation.body.required,
            "content": {"application/json": {"schema": components.body(operation.body)}},
        }
    return spec


def _accepted(operation: Operation, components: Components) -> dict[str, Any]:
    if not operation.accepted:
        return {}
    about = "Accepted: under way in the background."
    return {"202": {"description": about, "content": _content(operation, components)}}


def _content(operation: Operation, components: Components) -> dict[str, Any]:
    content = {}
    if operation.answer is not None:
        content["application/json"] = {"schema": components.schema(operation.answer)}
    if operation.text is not None:
        content[operation.text.split(";")[0]] = TEXT
    return content


def _error(status: int, codes: list[str]) -> dict[str, Any]:
    """An error answer: its ``code`` is one of ``codes`` (a string in the schema: a newer
    node may add a kind, which a console then tells by its status)."""
    listed = f" Codes: {', '.join(f'`{code}`' for code in codes)}." if codes else ""
    return {
        "description": ERRORS.get(status, f"{HTTPStatus(status).phrase}.") + listed,
        "content": {"application/json": {"schema": {"$ref": REFS.format(model="ErrorJson")}}},
        "x-codes": codes,
    }


def _query(query: Body, components: Components) -> Iterator[dict[str, Any]]:
    for field in query.fields:
        schema = components.value(field)
        description = schema.pop("description")
        parameter = {"name": field.name, "in": "query", "required": field.required}
        yield {**parameter, "schema": schema, "description": description}


def _protocol_header() -> dict[str, Any]:
    return {
        "name": PROTOCOL_HEADER,
        "in": "header",
        "required": True,
        "description": "Missing: 400. Another version: 409.",
        "schema": {"type": "string", "enum": list(SPOKEN)},
    }


# --- the answers' TypedDicts, as pydantic reads them -----------------------------------


def portable(shape: Any) -> Any:
    """``shape`` with every TypedDict in it made a closed pydantic model.

    Before Python 3.12 pydantic reads only typing_extensions' TypedDict, and the answers
    use typing's; a model with the same keys (optional keys without a default shown)
    says the same on every Python. Closed (additionalProperties false): an answer with a
    key the document does not name fails the conformance test.
    """
    if shape in WIDENED:
        return typing.Union[tuple(_model(form) for form in WIDENED[shape])]  # noqa: UP007
    words = [meta for meta in getattr(shape, "__metadata__", ()) if isinstance(meta, Words)]
    if words:
        return _enum(words[0])
    if typing.is_typeddict(shape):
        return _model(shape)
    origin, args = typing.get_origin(shape), typing.get_args(shape)
    if not args:
        return shape
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(portable(arg) for arg in args)]  # noqa: UP007
    return origin[tuple(portable(arg) for arg in args)]


@functools.cache
def _enum(words: Words) -> type[enum.Enum]:
    """The words as an enum, which the document names once (``JobStatus``): a generated
    client gets one enum class, not one per field that holds it."""
    shape = enum.Enum(words.name, {word: word for word in words.values}, type=str)  # type: ignore[misc]
    shape.__doc__ = words.doc
    return shape


# One class per TypedDict: a shape met twice in one schema must be one definition.
@functools.cache
def _model(shape: Any) -> type[BaseModel]:
    hints = typing.get_type_hints(shape, include_extras=True)
    fields: dict[str, Any] = {
        key: (portable(hint), ... if key in shape.__required_keys__ else Field(None))
        for key, hint in hints.items()
    }
    config = ConfigDict(extra="forbid", json_schema_extra=_no_defaults)
    return create_model(shape.__name__, __config__=config, __doc__=shape.__doc__, **fields)


def _no_defaults(schema: dict[str, Any]) -> None:
    """An optional key of an answer is absent, never null: it has no default to show."""
    for field in schema.get("properties", {}).values():
        field.pop("default", None)


def normalized(schema: Any) -> Any:
    """The schema as every supported pydantic release writes it: without the generated
    titles ("Run Id"), whole floats as integers (2.7 writes 0.0), and a lone
    ``allOf: [{$ref}]`` (2.7's way to give a reference a default) as the reference."""
    if isinstance(schema, list):
        return [normalized(item) for item in schema]
    if isinstance(schema, float) and schema.is_integer():
        return int(schema)
    if not isinstance(schema, dict):
        return schema
    if list(schema) == ["allOf"] and len(schema["allOf"]) == 1:
        return normalized(schema["allOf"][0])
    kept = {key: normalized(value) for key, value in schema.items() if key != "title"}
    if isinstance(schema.get("properties"), dict):  # field names, not schema keywords
        kept["properties"] = {k: normalized(v) for k, v in schema["properties"].items()}
    return kept
