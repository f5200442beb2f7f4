"""What a call to a node can fail with: the node's refusal, carrying its ``code`` and bad
fields (a console's program reads those, never the sentence), or no answer at all.

    ClientError
    ├── Unreachable        no answer: the connection failed or timed out
    └── NodeRefused        the node answered 4xx or 5xx: ``status``, ``code``, ``detail``,
                           ``errors`` (a request error's bad fields)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class ClientError(Exception):
    """Base of every error of the client."""


class Unreachable(ClientError):
    """No answer from the node: nothing is known of what it did (a launch may have run,
    so repeat it: launches are idempotent)."""


@dataclass(frozen=True)
class FieldError:
    """One bad field of a refused request: its path, its code, its sentence."""

    field: str
    code: str
    detail: str


class NodeRefused(ClientError):
    """The node answered with an error: ``code`` is its kind (``no_capacity``,
    ``cordoned``, ``name_held``, ``invalid_field``, ``engine_unavailable``, ...; a code
    this client does not know is still given as the node said it)."""

    def __init__(
        self, *, status: int, code: str, detail: str, errors: tuple[FieldError, ...] = ()
    ) -> None:
        super().__init__(f"the node refused ({status} {code}): {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.errors = errors

    @classmethod
    def of(cls, status: int, answer: object) -> NodeRefused:
        """The refusal an answer's JSON says; a body that is not the node's, as text."""
        if not isinstance(answer, Mapping):
            return cls(status=status, code="", detail=str(answer)[:500])
        errors = tuple(_field_error(entry) for entry in answer.get("errors") or ())
        detail, code = str(answer.get("detail", "")), str(answer.get("code", ""))
        return cls(status=status, code=code, detail=detail, errors=errors)


def _field_error(entry: Any) -> FieldError:
    return FieldError(str(entry.get("field")), str(entry.get("code")), str(entry.get("detail")))
