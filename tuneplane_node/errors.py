"""The errors the node raises, each with the HTTP status the daemon answers with and a
stable ``code``: a word a console's program acts on (a retry rule reads ``code``, never
the sentence).

Every error carries its facts as fields and builds its own sentence; one middleware in
`daemon/app.py` turns any `NodeError` into ``{"detail": <sentence>, "code": <code>}``,
and a request error adds ``"errors": [{"field", "code", "detail"}, ...]``, one entry per
bad field (`FIELD_CODES`). Each class declares its own ``code`` (a test walks the
tree). Third-party SDK errors never travel past the module that imports the SDK: they
are translated there (one table per engine, `runtime/engines/engine.py`) with the cause chained.

    ConfigError                a setting is wrong; the daemon does not start (no status)
    NodeError (500) internal   a bug, or an error nobody classified
    ├── BadRequest (400) bad_request        the request cannot be read at all
    │   └── MissingProtocol missing_protocol    no X-TunePlane-Node-Protocol header
    ├── Unauthorized (401) unauthorized     wrong or missing bearer token
    ├── NoClientCertificate (401) no_client_certificate   mutual TLS, and the
    │                          connection has no client certificate
    ├── InsufficientScope (403) insufficient_scope   the token's scope does not buy the verb
    ├── TooManyAuthFailures (429) too_many_auth_failures   this peer keeps sending wrong
    │                          tokens
    ├── PayloadTooLarge (413) payload_too_large   body over the limit
    ├── ImageAccessDenied (403) forbidden_image   a private image the node pulled,
    │                          without credentials its registry accepts for it now
    ├── InvalidField (422) invalid_field    a field is missing or has a bad value;
    │   │                      names the field, ``errors`` lists every bad one
    │   ├── UnknownField unknown_field      a field the contract does not have
    │   └── InvalidCursor invalid_field     a watch's ``index`` this node never gave out
    ├── TooManyFollows (429) too_many_requests   every slot for following a log is taken
    ├── InsufficientStorage (507) insufficient_storage   the engine's image store has no
    │   │                      room for a pull
    │   ├── DiskPressure insufficient_storage   a launch while the engine's store is
    │   │                      above its high threshold (disk pressure)
    │   ├── StateDiskFull insufficient_storage   the node's own disk (its state
    │   │                      directory) is full
    │   ├── PrivateRecordUnwritable insufficient_storage   a private pull's record
    │   │                      cannot be written (the state directory)
    │   └── VolumeStoreFull volume_store_full   a volume fill cannot fit below the
    │                          volume store's high threshold, even after eviction
    ├── VolumeFillFailed (502) volume_fill_failed   a volume's source did not give the
    │                          bytes its sha256 names (refused, missing, other bytes)
    ├── TooManyWatches (429) too_many_requests   every slot for a waiting watch is taken
    ├── Conflict (409) conflict             well-formed, but this node will not do it now
    │   ├── ProtocolMismatch protocol_mismatch   console and node speak other versions
    │   ├── NoCapacity no_capacity          not enough GPUs free for the job
    │   ├── GpuNotReady gpu_not_ready       the engine cannot hand this node's cards to a
    │   │                                   container
    │   ├── NameTaken name_held             the container name is held by another run
    │   ├── RunConflict run_conflict        the run's container was launched with another spec
    │   ├── NodeCordoned cordoned           the operator took the node out of service
    │   ├── NotRunning not_running          a signal for a job that is not running
    │   ├── NoRdma no_rdma                  a launch needs RDMA devices the node lacks
    │   ├── MemlockUnavailable memlock_unavailable   a launch needs RDMA devices and a
    │   │                                   memlock above the engine's own hard limit
    │   ├── SandboxUnavailable sandbox_unavailable   a sandbox the engine lacks (or
    │   │                                   cannot give this job)
    │   ├── UsernsUnavailable userns_unavailable   TUNEPLANE_JOB_USERNS=always, and a
    │   │                                   writable mount the engine cannot id-map
    │   ├── FabricAddressesExhausted fabric_addresses_exhausted   every address of the
    │   │                                   fabric network's range is held by a job
    │   └── EngineConflict                  (also an EngineRefused) name in use
    └── EngineError engine_error            the container engine
        ├── EngineUnavailable (503) engine_unavailable   did not answer: facts are
        │                                   unknown, nothing is gone
        └── EngineRefused (502) engine_refused   answered and refused; its own words
            ├── EngineConflict (409) engine_conflict
            ├── RegistryRefused registry_refused   ...because the registry refused the
            │                    pull's credentials (or has no such image: engines blur it)
            └── SpecRefused (422) spec_refused   ...because of a field of the request
                                 (a user the image lacks, a command it does not have)

``except Conflict`` catches every 409; ``except EngineError`` every engine failure. The
daemon's own answers that are no NodeError say their status's name: ``not_found``
(404), ``method_not_allowed`` (405).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
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


@dataclass(frozen=True)
class FieldError:
    """One bad field of a request: its path (``container.env.KEY``), one of
    `FIELD_CODES`, and its sentence (the one a 422 of this field alone says)."""

    field: str
    code: str
    detail: str


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


class NoClientCertificate(NodeError):
    """Mutual TLS: the connection has no client certificate, which every path but the
    liveness probe's needs (a probe has no certificate to give)."""

    status = 401
    code: ClassVar[str] = "no_client_certificate"

    def __init__(self, *, setting: str) -> None:
        super().__init__(f"a client certificate signed by the CA of {setting} is required")
        self.setting = setting


class InsufficientStorage(NodeError):
    """A pull refused before it starts: the filesystem of the engine's data root is at
    or above the high threshold, or the image (the registry's compressed size) would not
    fit in the room left below it, even with every image a GC run may remove gone
    (``freeable_bytes``; then nothing was removed). Nothing was reserved or created. Its
    figures are fields of the answer too (`figures`)."""

    status = 507
    code: ClassVar[str] = "insufficient_storage"

    def __init__(
        self,
        *,
        image: str,
        free_bytes: int,
        high_percent: int,
        needed_bytes: int | None = None,
        room_bytes: int | None = None,
        freeable_bytes: int | None = None,
    ) -> None:
        if needed_bytes is None:
            why = f"the engine's image store is at or above its {high_percent}% threshold"
        else:
            why = (
                f"it is {needed_bytes} bytes compressed, and the engine's image store has "
                f"{room_bytes} bytes left below its {high_percent}% threshold"
            )
        if freeable_bytes is not None:
            why += f", and image GC could free {freeable_bytes} bytes: nothing was removed"
        else:
            why += " after image GC"
        super().__init__(
            f"no room to pull {image}: {why} ({free_bytes} bytes free, threshold {high_percent}%)"
        )
        self.image = image
        self.free_bytes = free_bytes
        self.high_percent = high_percent
        self.needed_bytes = needed_bytes
        self.room_bytes = room_bytes
        self.freeable_bytes = freeable_bytes

    def figures(self) -> dict[str, int | None] | None:
        """The answer's fields: bytes the pull needs below the threshold (null when the
        store is at it already), free now, and what a GC run could free (null: not
        counted)."""
        return {
            "needed_bytes": self.needed_bytes,
            "free_bytes": self.free_bytes,
            "freeable_bytes": self.freeable_bytes,
            "high_percent": self.high_percent,
        }


class DiskPressure(InsufficientStorage):
    """A launch refused before anything is made: the filesystem of the engine's data root
    is at or above its high threshold (the node's ``disk_pressure`` condition)."""

    code = "insufficient_storage"

    def __init__(
        self, *, used_ratio: float, free_bytes: int, total_bytes: int, high_percent: int
    ) -> None:
        NodeError.__init__(
            self,
            f"disk pressure: the engine's store is {used_ratio * 100:.1f}% used "
            f"({free_bytes} bytes free of {total_bytes}), at or above its {high_percent}% "
            "threshold; no job is launched here until it is below",
        )
        self.image = ""
        self.used_ratio = used_ratio
        self.total_bytes = total_bytes
        self.free_bytes = free_bytes
        self.high_percent = high_percent
        self.needed_bytes = None
        self.room_bytes = None
        self.freeable_bytes = None


class StateDiskFull(InsufficientStorage):
    """The node state file could not be written for want of space. The state asked for
    is in force, but a restart would not keep it: the operator frees space, asks again."""

    code = "insufficient_storage"

    def __init__(self, *, state: str, path: str, reason: str) -> None:
        NodeError.__init__(
            self,
            f"the node is {state} now, but {path} could not be written ({reason}): a "
            "restart would not keep it; free space on that disk and ask again",
        )
        self.state = state
        self.path = path
        self.reason = reason

    def figures(self) -> dict[str, int | None] | None:
        return None  # the node's own disk: the engine's figures do not apply


class PrivateRecordUnwritable(InsufficientStorage):
    """A pull with credentials refused before it starts: the private-image record could
    not be written, and an image pulled without its record would run for anyone."""

    code = "insufficient_storage"

    def __init__(self, *, image: str, path: str, reason: str) -> None:
        NodeError.__init__(
            self,
            f"no pull of {image} with credentials: the private-image record {path} could "
            f"not be written ({reason}); free space on that disk and launch again",
        )
        self.image = image
        self.path = path
        self.reason = reason

    def figures(self) -> dict[str, int | None] | None:
        return None  # the node's own disk: the engine's figures do not apply


class VolumeFillFailed(NodeError):
    """A volume could not be filled from its source: the server refused or has no such
    file, the connection kept dropping, or the bytes hash to another digest (then nothing
    of them is kept). ``retryable``: a dropped connection, which a fill resumes."""

    status = 502
    code: ClassVar[str] = "volume_fill_failed"

    def __init__(self, *, source: str, reason: str, retryable: bool = False) -> None:
        super().__init__(f"volume {source} cannot be filled: {reason}")
        self.source = source
        self.reason = reason
        self.retryable = retryable


class VolumeStoreFull(InsufficientStorage):
    """A volume fill refused before its first byte: the file (its size as its server
    said, less what a partial file of it holds) does not fit below the store's high
    threshold, even with every entry eviction may remove gone (then nothing was
    removed). Its figures are fields of the answer too (`figures`)."""

    code = "volume_store_full"

    def __init__(
        self, *, source: str, needed_bytes: int, room_bytes: int, freeable_bytes: int,
        free_bytes: int, high_percent: int,
    ) -> None:  # fmt: skip
        NodeError.__init__(
            self,
            f"no room to fill volume {source}: it needs {needed_bytes} bytes, the volume "
            f"store has {room_bytes} bytes left below its {high_percent}% threshold and "
            f"eviction could free {freeable_bytes} bytes: nothing was removed "
            f"({free_bytes} bytes free)",
        )
        self.source = source
        self.room_bytes = room_bytes
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        self.freeable_bytes = freeable_bytes
        self.high_percent = high_percent


class Conflict(NodeError):
    status = 409
    code: ClassVar[str] = "conflict"


class ProtocolMismatch(Conflict):
    code: ClassVar[str] = "protocol_mismatch"

    def __init__(self, *, console: str, node: int) -> None:
        super().__init__(f"wire protocol mismatch: console={console}, node={node}")
        self.console = console
        self.node = node


class NoCapacity(Conflict):
    """Not enough GPUs: says what was asked and where every card is."""

    code: ClassVar[str] = "no_capacity"

    def __init__(
        self,
        *,
        requested: int,
        free: Sequence[int],
        held: Mapping[int, str],
        reserved: int = 0,
        external: Sequence[int] = (),
        unhealthy: Mapping[int, str] | None = None,
    ) -> None:
        unhealthy = dict(unhealthy or {})
        parts = [f"{len(free)} free {list(free)}", f"{len(held)} held by jobs"]
        if reserved:
            parts.append(f"{reserved} reserved for pending launches")
        if external:
            parts.append(f"{len(external)} used by processes outside the node {list(external)}")
        if unhealthy:
            parts.append(f"{len(unhealthy)} unhealthy {sorted(unhealthy)}")
        super().__init__(f"not enough GPUs: asked for {requested}; " + ", ".join(parts))
        self.requested = requested
        self.free = list(free)
        self.held = dict(held)
        self.reserved = reserved
        self.external = list(external)
        self.unhealthy = unhealthy


class GpuNotReady(Conflict):
    """A launch asking for cards on a node whose engine cannot hand them to a container
    (no NVIDIA runtime, no CDI specification for a card) or whose card count is unknown:
    refused before the engine is asked, with the fix, never a 502 from the engine."""

    code = "gpu_not_ready"

    def __init__(self, *, reason: str) -> None:
        super().__init__(f"this node cannot run GPU jobs: {reason}")
        self.reason = reason


class NameTaken(Conflict):
    """The container name belongs to another run: a launch never takes it over."""

    code: ClassVar[str] = "name_held"

    def __init__(self, *, ref: str, run_id: str | None) -> None:
        super().__init__(f"the container name {ref} is held by run {run_id}")
        self.ref = ref
        self.run_id = run_id


class RunConflict(Conflict):
    """A launch of a run whose container (or pending launch) exists with another spec: a
    retry is idempotent only when it asks for the same job; nothing is done."""

    code: ClassVar[str] = "run_conflict"

    def __init__(self, *, ref: str, run_id: str, fields: Sequence[str]) -> None:
        super().__init__(
            f"run {run_id} already has {ref}, launched with another spec ({', '.join(fields)} "
            "differ): remove it to launch the new one, or send the spec it was launched with"
        )
        self.ref = ref
        self.run_id = run_id
        self.fields = tuple(fields)


class NodeCordoned(Conflict):
    """New launches are refused: the node is cordoned, draining or drained."""

    code: ClassVar[str] = "cordoned"

    def __init__(self, *, state: str, reason: str | None) -> None:
        why = f": {reason}" if reason else " (no reason given)"
        super().__init__(f"the node is {state} and takes no new launches{why}")
        self.state = state
        self.reason = reason


class NotRunning(Conflict):
    """A signal asked for a job that is not running: nothing was sent."""

    code: ClassVar[str] = "not_running"

    def __init__(self, *, ref: str, job_status: str) -> None:
        super().__init__(f"{ref} is not running ({job_status}): no signal was sent")
        self.ref = ref
        self.job_status = job_status


class NoRdma(Conflict):
    """``container.rdma: true`` on a node that hands jobs no RDMA devices."""

    code: ClassVar[str] = "no_rdma"

    def __init__(self, *, why: str) -> None:
        super().__init__(f"container.rdma: this node hands jobs no RDMA devices ({why})")
        self.why = why


class MemlockUnavailable(Conflict):
    """A launch that would get RDMA devices, whose memlock (``TUNEPLANE_RDMA_MEMLOCK``) is
    above the engine's own hard limit: the engine would refuse to start it (a 502)."""

    code: ClassVar[str] = "memlock_unavailable"

    def __init__(self, *, engine: str, why: str) -> None:
        super().__init__(
            f"container.rdma: the {engine} engine cannot give a job with RDMA devices its "
            f"locked memory: {why}; set LimitMEMLOCK=infinity in the engine's unit, or "
            "TUNEPLANE_RDMA_MEMLOCK to a size within the limit"
        )
        self.engine = engine


class SandboxUnavailable(Conflict):
    """A job the node would sandbox (its rule, or ``container.isolation: "sandbox"``)
    that the engine cannot run under the sandbox runtime: never run under runc instead."""

    code: ClassVar[str] = "sandbox_unavailable"

    def __init__(self, *, runtime: str, why: str, fix: str) -> None:
        super().__init__(f"container.isolation: no sandbox runtime {runtime} for it: {why}; {fix}")
        self.runtime = runtime
        self.why = why


class UsernsUnavailable(Conflict):
    """``TUNEPLANE_JOB_USERNS=always`` and a writable host mount the engine cannot id-map
    into the job's own user namespace (its root could not write it)."""

    code: ClassVar[str] = "userns_unavailable"

    def __init__(self, *, mount: str, why: str, fix: str) -> None:
        super().__init__(f"{mount}: {why}, under TUNEPLANE_JOB_USERNS=always; {fix}")
        self.mount = mount
        self.why = why


class FabricAddressesExhausted(Conflict):
    """A launch for the fabric network while every address of the operator's range is
    held by a container of the node (or a launch being made)."""

    code: ClassVar[str] = "fabric_addresses_exhausted"

    def __init__(self, *, fabric: str, range_: str, held: int) -> None:
        super().__init__(
            f"fabric {fabric}: all {held} addresses of its range {range_} are held by the "
            "node's jobs; remove finished jobs or widen the range (TUNEPLANE_FABRICS)"
        )
        self.fabric = fabric
        self.range = range_


class EngineError(NodeError):
    """Something about the container engine (or the process runtime standing in for one)."""

    code: ClassVar[str] = "engine_error"

    def __init__(self, message: str, *, engine: str) -> None:
        super().__init__(message)
        self.engine = engine


class EngineUnavailable(EngineError):
    """The engine did not answer. Nothing is known, so nothing may be reported gone."""

    status = 503
    code: ClassVar[str] = "engine_unavailable"

    def __init__(self, *, engine: str, reason: str) -> None:
        super().__init__(f"engine unreachable: {engine}: {reason}", engine=engine)
        self.reason = reason


class EngineRefused(EngineError):
    """The engine answered and refused the call; carries the engine's own message."""

    status = 502
    code: ClassVar[str] = "engine_refused"

    def __init__(self, *, engine: str, action: str, reason: str) -> None:
        super().__init__(f"{engine} refused to {action}: {reason}", engine=engine)
        self.action = action
        self.reason = reason


class EngineConflict(EngineRefused, Conflict):
    """The engine refused because of what is already there (a container name in use):
    the caller's to resolve, not a node fault."""

    status = 409
    code: ClassVar[str] = "engine_conflict"


class RegistryRefused(EngineRefused):
    """The registry refused the pull: wrong or missing credentials, or no such image
    (the engines deliberately say the two alike). Not retried: the same credentials
    would be refused again."""

    code: ClassVar[str] = "registry_refused"

    def __init__(self, *, engine: str, image: str, reason: str) -> None:
        super().__init__(
            engine=engine,
            action=f"pull {image}",
            reason=f"the registry refused access to {image} (wrong or missing credentials, "
            f"or no such image): {reason}",
        )
        self.image = image


class SpecRefused(EngineRefused):
    """The engine refused a container for one of its fields: the console's to fix."""

    status = 422
    code: ClassVar[str] = "spec_refused"

    def __init__(self, *, engine: str, action: str, reason: str, field: str) -> None:
        super().__init__(engine=engine, action=action, reason=reason)
        self.field = field
        self.message = f"{field}: {self.message}"
        self.args = (self.message,)
        self.errors = (FieldError(field, INVALID, self.message),)


def is_name_conflict(status: int | None, message: str) -> bool:
    """Engines say "name in use" with 409 (docker) or 500 and a sentence (podman 4)."""
    return status == 409 or "already in use" in message
