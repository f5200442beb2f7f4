"""The errors the node raises, each with the HTTP status the daemon answers with.

Every error carries its facts as fields and builds its own sentence; one middleware in
`daemon/app.py` turns any `NodeError` into ``{"detail": <sentence>}``. Third-party SDK
errors never travel past the module that imports the SDK: they are translated there
(one table per engine, `runtime/engine.py`) with the cause chained.

    ConfigError                a setting is wrong; the daemon does not start (no status)
    NodeError (500: a bug, or an error nobody classified)
    ├── BadRequest (400)       the request cannot be read at all
    │   └── MissingProtocol    no X-TunePlane-Node-Protocol header
    ├── Unauthorized (401)     wrong or missing bearer token
    ├── PayloadTooLarge (413)  body over the limit
    ├── ImageAccessDenied (403) a private image the node pulled, without credentials
    │                          its registry accepts for it now
    ├── InvalidField (422)     a field is missing or has a bad value; names the field
    │   └── InvalidCursor      a watch's ``index`` this node never gave out
    ├── TooManyFollows (429)   every slot for following a log is taken
    ├── TooManyWatches (429)   every slot for a waiting watch query is taken
    ├── Conflict (409)         well-formed, but this node will not do it now
    │   ├── ProtocolMismatch   console and node speak different wire versions
    │   ├── NoCapacity         not enough GPUs free for the job
    │   ├── NameTaken          the container name is held by another run
    │   ├── NodeCordoned       the operator took the node out of service
    │   ├── NotRunning         a signal for a job that is not running (or still pending)
    │   ├── NoRdma             a launch needs RDMA devices this node does not hand out
    │   └── EngineConflict     (also an EngineRefused) the engine refused: name in use
    └── EngineError            the container engine
        ├── EngineUnavailable (503)  did not answer: facts are unknown, nothing is gone
        └── EngineRefused (502)      answered and refused; carries its own words
            ├── EngineConflict (409)
            ├── RegistryRefused      ...because the registry refused the pull's
            │                        credentials (or has no such image: engines blur it)
            └── SpecRefused (422)    ...because of a field of the request (a user the
                                     image lacks, a command it does not have)

``except Conflict`` catches every 409; ``except EngineError`` every engine failure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class ConfigError(Exception):
    """A setting has a bad value; raised at start-up, naming the variable. Not an HTTP
    error: no request can cause it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NodeError(Exception):
    """Base of every error the node raises on purpose while serving."""

    status = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequest(NodeError):
    status = 400


class MissingProtocol(BadRequest):
    def __init__(self, *, header: str, node: int) -> None:
        super().__init__(f"missing {header} header; this node speaks protocol {node}")
        self.header = header
        self.node = node


class Unauthorized(NodeError):
    status = 401

    def __init__(self) -> None:
        super().__init__("invalid node token")


class PayloadTooLarge(NodeError):
    status = 413

    def __init__(self, *, limit: int) -> None:
        super().__init__(f"request body is larger than {limit} bytes")
        self.limit = limit


class ImageAccessDenied(NodeError):
    """A cached private image is not a free pass: the node pulled it with credentials,
    and this launch has none its registry accepts for it (KEP-2535's rule)."""

    status = 403

    def __init__(self, *, image: str, reason: str) -> None:
        super().__init__(f"no access to the private image {image}: {reason}")
        self.image = image
        self.reason = reason


class InvalidField(NodeError):
    status = 422

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class InvalidCursor(InvalidField):
    """A watch's ``index`` that is no cursor of any node: a console's bug, not a stale
    cursor (which answers the whole list)."""

    code = "invalid_field"

    def __init__(self, field: str = "index") -> None:
        super().__init__(field, "not a cursor this node gave out; omit it to list every job")


class TooManyWatches(NodeError):
    """Each waiting watch query holds a connection: past the limit, the next is refused
    rather than let consoles hold every connection of the node."""

    status = 429
    code = "too_many_requests"

    def __init__(self, *, limit: int) -> None:
        super().__init__(
            f"already {limit} watch queries waiting, the most this node holds at once "
            "(TUNEPLANE_WATCH_MAX); try again later, or ask with wait=0"
        )
        self.limit = limit


class TooManyFollows(NodeError):
    """Each followed log holds an engine thread: past the limit, the next is refused
    rather than starve the other verbs of threads."""

    status = 429

    def __init__(self, *, limit: int) -> None:
        super().__init__(
            f"already following {limit} log{'s' if limit != 1 else ''}, the most this node "
            "streams at once; "
            "try again when one ends, or read the logs without follow"
        )
        self.limit = limit


class Conflict(NodeError):
    status = 409


class ProtocolMismatch(Conflict):
    def __init__(self, *, console: str, node: int) -> None:
        super().__init__(f"wire protocol mismatch: console={console}, node={node}")
        self.console = console
        self.node = node


class NoCapacity(Conflict):
    """Not enough GPUs: says what was asked and where every card is."""

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


class NameTaken(Conflict):
    """The container name belongs to another run: a launch never takes it over."""

    def __init__(self, *, ref: str, run_id: str | None) -> None:
        super().__init__(f"the container name {ref} is held by run {run_id}")
        self.ref = ref
        self.run_id = run_id


class NodeCordoned(Conflict):
    """New launches are refused: the node is cordoned, draining or drained."""

    def __init__(self, *, state: str, reason: str | None) -> None:
        why = f": {reason}" if reason else " (no reason given)"
        super().__init__(f"the node is {state} and takes no new launches{why}")
        self.state = state
        self.reason = reason


class NotRunning(Conflict):
    """A signal asked for a job that is not running: nothing was sent."""

    def __init__(self, *, ref: str, job_status: str) -> None:
        super().__init__(f"{ref} is not running ({job_status}): no signal was sent")
        self.ref = ref
        self.job_status = job_status


class NoRdma(Conflict):
    """``container.rdma: true`` on a node that hands jobs no RDMA devices."""

    def __init__(self, *, why: str) -> None:
        super().__init__(f"container.rdma: this node hands jobs no RDMA devices ({why})")
        self.why = why


class EngineError(NodeError):
    """Something about the container engine (or the process runtime standing in for one)."""

    def __init__(self, message: str, *, engine: str) -> None:
        super().__init__(message)
        self.engine = engine


class EngineUnavailable(EngineError):
    """The engine did not answer. Nothing is known, so nothing may be reported gone."""

    status = 503

    def __init__(self, *, engine: str, reason: str) -> None:
        super().__init__(f"engine unreachable: {engine}: {reason}", engine=engine)
        self.reason = reason


class EngineRefused(EngineError):
    """The engine answered and refused the call; carries the engine's own message."""

    status = 502

    def __init__(self, *, engine: str, action: str, reason: str) -> None:
        super().__init__(f"{engine} refused to {action}: {reason}", engine=engine)
        self.action = action
        self.reason = reason


class EngineConflict(EngineRefused, Conflict):
    """The engine refused because of what is already there (a container name in use):
    the caller's to resolve, not a node fault."""

    status = 409


class RegistryRefused(EngineRefused):
    """The registry refused the pull: wrong or missing credentials, or no such image
    (the engines deliberately say the two alike). Not retried: the same credentials
    would be refused again."""

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

    def __init__(self, *, engine: str, action: str, reason: str, field: str) -> None:
        super().__init__(engine=engine, action=action, reason=reason)
        self.field = field
        self.message = f"{field}: {self.message}"
        self.args = (self.message,)


def is_name_conflict(status: int | None, message: str) -> bool:
    """Engines say "name in use" with 409 (docker) or 500 and a sentence (podman 4)."""
    return status == 409 or "already in use" in message
