"""The root of the node's error tree (`NodeError`), the one error that is no request's
(`ConfigError`), and what a 422 says of each bad field (`FieldError`, `FIELD_CODES`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

MAX_FIELD_ERRORS = 100
"""The most bad fields one 422 lists."""
MISSING, UNKNOWN, INVALID = "missing_field", "unknown_field", "invalid_field"
OUT_OF_RANGE, REPEATED = "out_of_range", "repeated_field"
FIELD_CODES = (MISSING, UNKNOWN, INVALID, OUT_OF_RANGE, REPEATED)
"""What is wrong with one field of a request (an answer's ``errors[].code``): required
and not given (or ``""``); not in the contract; a value of the wrong type or form; a
number, length or count past its bounds; a query parameter given twice."""


class ConfigError(Exception):
    """A setting has a bad value; raised at start-up, naming the variable. Not an HTTP
    error: no request can cause it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NodeError(Exception):
    """Base of every error the node raises on purpose while serving."""

    status = 500
    code: ClassVar[str] = "internal"
    errors: tuple[FieldError, ...] = ()  # the bad fields of a request error, if any

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class FieldError:
    """One bad field of a request: its path (``container.env.KEY``), one of
    `FIELD_CODES`, and its sentence (the one a 422 of this field alone says)."""

    field: str
    code: str
    detail: str
