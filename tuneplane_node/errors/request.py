"""A request refused before the node acts on it: it cannot be read or is too large, a
field is bad, its sender may not ask (token, scope, certificate, a private image's
credentials), or too many like it are waiting."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import ClassVar

from tuneplane_node.errors.base import INVALID, MAX_FIELD_ERRORS, UNKNOWN, FieldError, NodeError


class BadRequest(NodeError):
    status = 400
    code: ClassVar[str] = "bad_request"


class MissingProtocol(BadRequest):
    code: ClassVar[str] = "missing_protocol"

    def __init__(self, *, header: str, node: int) -> None:
        super().__init__(f"missing {header} header; this node speaks protocol {node}")
        self.header = header
        self.node = node


class Unauthorized(NodeError):
    status = 401
    code: ClassVar[str] = "unauthorized"

    def __init__(self) -> None:
        super().__init__("invalid node token")


class NoClientCertificate(NodeError):
    """Mutual TLS: the connection has no client certificate, which every path but the
    liveness probe's needs (a probe has no certificate to give)."""

    status = 401
    code: ClassVar[str] = "no_client_certificate"

    def __init__(self, *, setting: str) -> None:
        super().__init__(f"a client certificate signed by the CA of {setting} is required")
        self.setting = setting


class InsufficientScope(NodeError):
    """A token of a narrower scope (a scraper's, a dashboard's) asked for a verb it
    does not buy: names the scope that would."""

    status = 403
    code = "insufficient_scope"

    def __init__(self, *, scope: str, needed: str, verb: str) -> None:
        super().__init__(f"this token's scope is {scope}: {verb} needs a token of scope {needed}")
        self.scope = scope
        self.needed = needed
        self.verb = verb


class TooManyAuthFailures(NodeError):
    """A peer that keeps failing to authenticate is refused for a while, whatever it
    sends: guessing a token costs it the window, not the node a log line each."""

    status = 429
    code = "too_many_auth_failures"

    def __init__(self, *, failures: int, window_s: float) -> None:
        super().__init__(
            f"{failures} failed authentications from this address in {window_s:g} s: "
            "try again later"
        )
        self.failures = failures
        self.window_s = window_s


class PayloadTooLarge(NodeError):
    status = 413
    code: ClassVar[str] = "payload_too_large"

    def __init__(self, *, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes")
        self.limit = limit


class ImageAccessDenied(NodeError):
    """A cached private image is not a free pass: the node pulled it with credentials,
    and this launch has none its registry accepts for it (KEP-2535's rule)."""

    status = 403
    code: ClassVar[str] = "forbidden_image"

    def __init__(self, *, image: str, reason: str) -> None:
        super().__init__(f"no access to the private image {image}: {reason}")
        self.image = image
        self.reason = reason


class VolumeAccessDenied(NodeError):
    """A volume the node holds is not handed to whoever names its sha256: this launch's
    source did not show it holds the same bytes (a few ranges compared, or the whole
    file hashed), or is not the kind of source that filled it."""

    status = 403
    code: ClassVar[str] = "forbidden_volume"

    def __init__(self, *, digest: str, source: str, reason: str) -> None:
        super().__init__(f"no access to the volume sha256:{digest} from {source}: {reason}")
        self.digest = digest
        self.source = source
        self.reason = reason


class InvalidField(NodeError):
    """A field is missing or has a bad value. ``errors`` lists every bad field of the
    request, this one first (`InvalidField.of`); the sentence and code are the first's."""

    status = 422
    code: ClassVar[str] = "invalid_field"

    def __init__(self, field: str, reason: str, *, problem: str = INVALID) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
        self.errors = (FieldError(field, problem, self.message),)

    @staticmethod
    def of(found: Sequence[InvalidField]) -> InvalidField:
        """One error for all of ``found``: the first, listing every bad field of them
        (at most `MAX_FIELD_ERRORS`: a body of 10,000 typos is not echoed back)."""
        first = found[0]
        listed = itertools.chain.from_iterable(error.errors for error in found)
        first.errors = tuple(itertools.islice(listed, MAX_FIELD_ERRORS))
        return first


class UnknownField(InvalidField):
    """A field the contract does not have: a typo must never pass unnoticed."""

    code: ClassVar[str] = "unknown_field"

    def __init__(self, field: str, *, known: Sequence[str]) -> None:
        super().__init__(field, f"unknown field; known: {', '.join(known)}", problem=UNKNOWN)


class InvalidCursor(InvalidField):
    """A watch's ``index`` that is no cursor of any node: a console's bug, not a stale
    cursor (which answers the whole list)."""

    code: ClassVar[str] = "invalid_field"

    def __init__(self, field: str = "index") -> None:
        super().__init__(field, "not a cursor this node gave out; omit it to list every job")


class TooManyWatches(NodeError):
    """Each waiting watch query holds a connection: past the limit, the next is refused
    rather than let consoles hold every connection of the node."""

    status = 429
    code: ClassVar[str] = "too_many_requests"

    def __init__(self, *, limit: int, observers: bool = False) -> None:
        held = (
            "of tokens other than full waiting, the most this node holds for them (the rest "
            "of TUNEPLANE_WATCH_MAX is kept for consoles)"
            if observers
            else "waiting, the most this node holds at once (TUNEPLANE_WATCH_MAX)"
        )
        super().__init__(
            f"already {limit} watch queries {held}; try again later, or ask with wait=0"
        )
        self.limit = limit


class TooManyFollows(NodeError):
    """Each followed log holds an engine thread: past the limit, the next is refused
    rather than starve the other verbs of threads."""

    status = 429
    code: ClassVar[str] = "too_many_requests"

    def __init__(self, *, limit: int) -> None:
        super().__init__(
            f"already following {limit} log{'s' if limit != 1 else ''}, the most this node "
            "streams at once; "
            "try again when one ends, or read the logs without follow"
        )
        self.limit = limit
