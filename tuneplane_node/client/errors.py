"""What the client raises: every failure of a call is a `NodeError` carrying the node's
``status``, ``code``, ``detail`` and ``errors``, of the class of its code's family, so a
console's retry rule is an ``except`` clause, never a sentence compared::

    ClientError                     base of everything this package raises
    ├── ConfigError                 this side cannot even ask: a bad URL, unreadable TLS files
    └── NodeError                   a call failed; status 0: no answer came
        ├── Unreachable (0)         no answer: refused, timed out, a failed TLS handshake,
        │                           broken off, or an answer that is no JSON
        ├── RequestError (4xx)      the node refused this request: asking again will not help
        │   ├── BadRequest (400)        unreadable
        │   │   └── MissingProtocol     ``missing_protocol``
        │   ├── Unauthorized (401)      wrong or missing token
        │   │   └── NoClientCertificate ``no_client_certificate``
        │   ├── Forbidden (403)         ``forbidden_image``: a private image without credentials
        │   │   ├── ForbiddenVolume     ``forbidden_volume``: a volume the node holds, its
        │   │   │                       source not shown to hold the same bytes
        │   │   └── InsufficientScope   ``insufficient_scope``: the token may not do this verb
        │   ├── NotFound (404)          a route this node does not have (an older node)
        │   ├── PayloadTooLarge (413)
        │   ├── InvalidRequest (422)    ``invalid_field``: see ``errors``
        │   │   ├── UnknownField        ``unknown_field``
        │   │   └── SpecRefused         ``spec_refused``: the engine refused the spec as given
        │   ├── TooManyRequests (429)   every slot (follows, watches) taken: later, it may
        │   │   └── TooManyAuthFailures ``too_many_auth_failures``
        │   └── Conflict (409)          well-formed, but not now
        │       ├── ProtocolMismatch    ``protocol_mismatch``
        │       ├── NoCapacity          ``no_capacity``: not enough cards free now
        │       ├── GpuNotReady         ``gpu_not_ready``: cards the engine cannot hand out
        │       ├── DriverTooOld        ``driver_too_old``: the image needs a newer CUDA
        │       ├── NameHeld            ``name_held``: the name is another run's
        │       ├── RunConflict         ``run_conflict``: the run exists with another spec
        │       ├── Cordoned            ``cordoned``: the node takes no launches
        │       ├── NotRunning          ``not_running``: a signal for a job that is not
        │       ├── NoRdma              ``no_rdma``: RDMA asked of a node without it
        │       ├── MemlockUnavailable  ``memlock_unavailable``: the engine's memlock limit
        │       ├── SandboxUnavailable  ``sandbox_unavailable``: no sandbox runtime for it
        │       ├── UsernsUnavailable   ``userns_unavailable``: a mount it cannot id-map
        │       ├── FabricAddressesExhausted  ``fabric_addresses_exhausted``: no address
        │       │                       of the fabric network's range is free
        │       └── EngineConflict      ``engine_conflict``
        └── ServerError (5xx)       the node or its engine failed
            ├── EngineError (500)       ``engine_error``
            ├── EngineRefused (502)     the engine answered and refused
            │   ├── RegistryRefused     ``registry_refused``: the registry refused a pull
            │   └── VolumeFillFailed    ``volume_fill_failed``: a volume's source failed
            ├── EngineUnavailable (503) the engine did not answer: nothing is known, nothing
            │                           is gone; ask again
            └── InsufficientStorage (507)
                └── VolumeStoreFull     ``volume_store_full``: a volume fill cannot fit

There is a class for every code of the node's code table (`BY_CODE`;
`tests/unit/test_client_contract.py` fails on a code without one).

A code this client does not know (a newer node's) gets its status's class; a node that
sends no code (before codes) gets its status's family word (`STATUS_CODES`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

MAX_DETAIL = 2000  # of a non-JSON error page: enough to read, not a whole HTML dump


class ClientError(Exception):
    """Base of every error of the client."""


class ConfigError(ClientError, ValueError):
    """The client was given something it cannot use (raised before any request)."""


@dataclass(frozen=True)
class FieldError:
    """One bad field of a refused request (an answer's ``errors[]``)."""

    field: str
    code: str
    detail: str


class NodeError(ClientError):
    """A call that failed, with the node's own words and codes."""

    family: ClassVar[str] = ""  # the code an answer without one gets

    def __init__(
        self,
        message: str,
        *,
        status: int = 0,
        code: str = "",
        detail: str = "",
        errors: Sequence[FieldError] = (),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or self.family
        self.detail = detail or message
        self.errors = tuple(errors)


class Unreachable(NodeError):
    family = "unreachable"


class RequestError(NodeError):
    pass


class BadRequest(RequestError):
    family = "bad_request"


class Unauthorized(RequestError):
    family = "unauthorized"


class Forbidden(RequestError):
    family = "forbidden_image"


class NotFound(RequestError):
    family = "not_found"


class PayloadTooLarge(RequestError):
    family = "payload_too_large"


class InvalidRequest(RequestError):
    family = "invalid_field"


class TooManyRequests(RequestError):
    family = "too_many_requests"


class Conflict(RequestError):
    family = "conflict"


class ProtocolMismatch(Conflict):
    family = "protocol_mismatch"


class NoCapacity(Conflict):
    family = "no_capacity"


class NameHeld(Conflict):
    family = "name_held"


class Cordoned(Conflict):
    family = "cordoned"


class NotRunning(Conflict):
    family = "not_running"


class MissingProtocol(BadRequest):
    family = "missing_protocol"


class NoClientCertificate(Unauthorized):
    family = "no_client_certificate"


class ForbiddenVolume(Forbidden):
    """A volume the node holds, named by a source that did not show it holds the same
    bytes (or could not be asked): the launch made nothing."""

    family = "forbidden_volume"


class InsufficientScope(Forbidden):
    family = "insufficient_scope"


class UnknownField(InvalidRequest):
    family = "unknown_field"


class SpecRefused(InvalidRequest):
    family = "spec_refused"


class TooManyAuthFailures(TooManyRequests):
    family = "too_many_auth_failures"


class GpuNotReady(Conflict):
    family = "gpu_not_ready"


class DriverTooOld(Conflict):
    """The image needs a newer CUDA than the node's driver gives: the sentence names both."""

    family = "driver_too_old"


class RunConflict(Conflict):
    family = "run_conflict"


class NoRdma(Conflict):
    family = "no_rdma"


class MemlockUnavailable(Conflict):
    """Card jobs would get RDMA devices, but the engine's hard locked-memory limit is
    below ``TUNEPLANE_RDMA_MEMLOCK``: the engine's unit or that setting must change."""

    family = "memlock_unavailable"


class SandboxUnavailable(Conflict):
    """A job the node would sandbox that the engine cannot run under the sandbox runtime
    (not registered, or not for this job): never run under runc instead."""

    family = "sandbox_unavailable"


class UsernsUnavailable(Conflict):
    """``TUNEPLANE_JOB_USERNS=always`` and a writable mount the engine cannot id-map."""

    family = "userns_unavailable"


class FabricAddressesExhausted(Conflict):
    """Every address of the node's fabric network range is held by one of its jobs."""

    family = "fabric_addresses_exhausted"


class EngineConflict(Conflict):
    family = "engine_conflict"


class ServerError(NodeError):
    family = "internal"


class EngineError(ServerError):
    family = "engine_error"


class EngineRefused(ServerError):
    family = "engine_refused"


class RegistryRefused(EngineRefused):
    family = "registry_refused"


class VolumeFillFailed(EngineRefused):
    """A launch's volume could not be filled from its source (refused, missing, dropping,
    or bytes of another digest): the launch failed, its cards are free."""

    family = "volume_fill_failed"


class EngineUnavailable(ServerError):
    family = "engine_unavailable"


class InsufficientStorage(ServerError):
    """No room for a pull. ``needed_bytes``, ``free_bytes``, ``freeable_bytes`` (what an
    image GC run could free) and ``high_percent``: the node's figures, None when it gave
    none (the node's own disk, or a node older than them)."""

    family = "insufficient_storage"
    needed_bytes: int | None = None
    free_bytes: int | None = None
    freeable_bytes: int | None = None
    high_percent: int | None = None


class VolumeStoreFull(InsufficientStorage):
    """No room for a volume fill below the volume store's high threshold, even with
    every entry eviction could remove gone (then nothing was removed); refused before
    its first byte. Its figures as `InsufficientStorage`'s."""

    family = "volume_store_full"


FIGURES = ("needed_bytes", "free_bytes", "freeable_bytes", "high_percent")


NARROWER = (
    MissingProtocol,
    NoClientCertificate,
    ForbiddenVolume,
    InsufficientScope,
    UnknownField,
    SpecRefused,
    TooManyAuthFailures,
    ProtocolMismatch,
    NoCapacity,
    GpuNotReady,
    DriverTooOld,
    NameHeld,
    RunConflict,
    Cordoned,
    NotRunning,
    NoRdma,
    MemlockUnavailable,
    SandboxUnavailable,
    UsernsUnavailable,
    FabricAddressesExhausted,
    EngineConflict,
    EngineError,
    RegistryRefused,
    VolumeFillFailed,
    VolumeStoreFull,
)
BY_CODE: Mapping[str, type[NodeError]] = {
    cls.family: cls
    for cls in (
        BadRequest,
        Unauthorized,
        Forbidden,
        PayloadTooLarge,
        InvalidRequest,
        TooManyRequests,
        Conflict,
        ServerError,
        EngineRefused,
        EngineUnavailable,
        InsufficientStorage,
        *NARROWER,
    )
}
"""Every code of the node's code table, and its class."""
BY_STATUS: Mapping[int, type[NodeError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    413: PayloadTooLarge,
    422: InvalidRequest,
    409: Conflict,
    429: TooManyRequests,
    502: EngineRefused,
    503: EngineUnavailable,
    507: InsufficientStorage,
}
STATUS_CODES: Mapping[int, str] = {status: cls.family for status, cls in BY_STATUS.items()}


def refusal(status: int, raw: bytes, *, url: str) -> NodeError:
    """The error for a 4xx or 5xx answer: its class from its code, else its status."""
    body = _json_object(raw)
    detail = body.get("detail")
    if not isinstance(detail, str):
        detail = raw.decode("utf-8", "replace").strip()[:MAX_DETAIL] or "(no detail)"
    code = body.get("code")
    code = code if isinstance(code, str) else ""
    cls = BY_CODE.get(code) or BY_STATUS.get(status)
    if cls is None:
        cls = RequestError if status < 500 else ServerError
    if status < 500:
        message = f"the node refused ({status}): {detail}"
    else:
        message = f"the node at {url} failed ({status}): {detail}"
    errors = _field_errors(body.get("errors"))
    error = cls(message, status=status, code=code, detail=detail, errors=errors)
    if isinstance(error, InsufficientStorage):
        for name in FIGURES:
            figure = body.get(name)
            if isinstance(figure, int) and not isinstance(figure, bool):
                setattr(error, name, figure)
    return error


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(raw)
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def _field_errors(value: object) -> list[FieldError]:
    """The ``errors`` list, each entry's strings as given; what is no such entry is skipped."""
    if not isinstance(value, list):
        return []
    found = []
    for entry in value:
        if isinstance(entry, dict):
            texts = [entry.get(key) for key in ("field", "code", "detail")]
            found.append(FieldError(*(text if isinstance(text, str) else "" for text in texts)))
    return found
