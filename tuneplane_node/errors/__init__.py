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
    ├── VolumeAccessDenied (403) forbidden_volume   a volume the node holds, named by a
    │                          source that did not show it holds the same bytes
    ├── InvalidField (422) invalid_field    a field is missing or has a bad value;
    │   │                      names the field, ``errors`` lists every bad one
    │   ├── UnknownField unknown_field      a field the contract does not have
    │   └── InvalidCursor invalid_field     a watch's ``index`` this node never gave out
    ├── TooManyFollows (429) too_many_requests   every slot for following a log is taken
    ├── InsufficientStorage (507) insufficient_storage   the engine's image store has no
    │   │                      room for a pull
    │   ├── DiskPressure insufficient_storage   a launch while the engine's store is
    │   │                      above its high threshold (disk pressure)
    │   ├── InodePressure insufficient_storage   a launch while the store's inodes are
    │   │                      used above their high threshold (inode pressure)
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
    │   ├── DriverTooOld driver_too_old     the image needs a newer CUDA than the driver's
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

The branches are modules of this package: the root and the field codes (`base`), a
request refused before the node acts (`request`), no room (`storage`), the 409s
(`conflicts`), the engine's failures (`engine`). Every name is imported from here.
"""

from __future__ import annotations

from tuneplane_node.errors.base import (
    FIELD_CODES,
    INVALID,
    MAX_FIELD_ERRORS,
    MISSING,
    OUT_OF_RANGE,
    REPEATED,
    UNKNOWN,
    ConfigError,
    FieldError,
    NodeError,
)
from tuneplane_node.errors.conflicts import (
    Conflict,
    DriverTooOld,
    FabricAddressesExhausted,
    GpuNotReady,
    MemlockUnavailable,
    NameTaken,
    NoCapacity,
    NodeCordoned,
    NoRdma,
    NotRunning,
    ProtocolMismatch,
    RunConflict,
    SandboxUnavailable,
    UsernsUnavailable,
)
from tuneplane_node.errors.engine import (
    EngineConflict,
    EngineError,
    EngineRefused,
    EngineUnavailable,
    RegistryRefused,
    SpecRefused,
    is_name_conflict,
)
from tuneplane_node.errors.request import (
    BadRequest,
    ImageAccessDenied,
    InsufficientScope,
    InvalidCursor,
    InvalidField,
    MissingProtocol,
    NoClientCertificate,
    PayloadTooLarge,
    TooManyAuthFailures,
    TooManyFollows,
    TooManyWatches,
    Unauthorized,
    UnknownField,
    VolumeAccessDenied,
)
from tuneplane_node.errors.storage import (
    DiskPressure,
    InodePressure,
    InsufficientStorage,
    PrivateRecordUnwritable,
    StateDiskFull,
    VolumeFillFailed,
    VolumeStoreFull,
)

__all__ = [
    "FIELD_CODES",
    "INVALID",
    "MAX_FIELD_ERRORS",
    "MISSING",
    "OUT_OF_RANGE",
    "REPEATED",
    "UNKNOWN",
    "BadRequest",
    "ConfigError",
    "Conflict",
    "DiskPressure",
    "DriverTooOld",
    "EngineConflict",
    "EngineError",
    "EngineRefused",
    "EngineUnavailable",
    "FabricAddressesExhausted",
    "FieldError",
    "GpuNotReady",
    "ImageAccessDenied",
    "InodePressure",
    "InsufficientScope",
    "InsufficientStorage",
    "InvalidCursor",
    "InvalidField",
    "MemlockUnavailable",
    "MissingProtocol",
    "NameTaken",
    "NoCapacity",
    "NoClientCertificate",
    "NoRdma",
    "NodeCordoned",
    "NodeError",
    "NotRunning",
    "PayloadTooLarge",
    "PrivateRecordUnwritable",
    "ProtocolMismatch",
    "RegistryRefused",
    "RunConflict",
    "SandboxUnavailable",
    "SpecRefused",
    "StateDiskFull",
    "TooManyAuthFailures",
    "TooManyFollows",
    "TooManyWatches",
    "Unauthorized",
    "UnknownField",
    "UsernsUnavailable",
    "VolumeAccessDenied",
    "VolumeFillFailed",
    "VolumeStoreFull",
    "is_name_conflict",
]
