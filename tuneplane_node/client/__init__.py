"""A console's client of the node's HTTP API: `NodeClient` (sync) and `AsyncNodeClient`
(asyncio), one method per verb, the answers as typed objects (`answers`), every failure
a `NodeError` of its code's family (`errors`), and `watch()` over the blocking query.

It stands on httpx alone and imports nothing else of ``tuneplane_node``, so a console
installs it without the daemon (the ``tuneplane-node-client`` distribution,
``clients/python``); ``tuneplane-node ctl`` is one of its users::

    async with AsyncNodeClient("https://gpu-7:8470", token=token, tls=Tls(cacert=ca)) as node:
        launched = await node.launch("run-1", Container(image="trainer:1"), requested_gpus=1)
        jobs: dict[str, JobState] = {}
        async for answer in node.watch():
            answer.apply(jobs)
"""

from tuneplane_node.client.aio import AsyncNodeClient
from tuneplane_node.client.answers import (
    CardUsage,
    Conditions,
    Health,
    Image,
    ImageGc,
    ImagePull,
    Images,
    ImageStore,
    Inventory,
    JobDisk,
    Jobs,
    JobState,
    Launched,
    Logs,
    NodeState,
    Prefetch,
    RemovedImage,
    Runtime,
    Stopping,
    Usage,
)
from tuneplane_node.client.calls import Call, Container, Mount, Scratch
from tuneplane_node.client.endpoint import PROTOCOL, PROTOCOL_HEADER, Tls
from tuneplane_node.client.errors import (
    BadRequest,
    ClientError,
    ConfigError,
    Conflict,
    Cordoned,
    EngineRefused,
    EngineUnavailable,
    FieldError,
    Forbidden,
    InsufficientStorage,
    InvalidRequest,
    NameHeld,
    NoCapacity,
    NodeError,
    NotFound,
    NotRunning,
    PayloadTooLarge,
    ProtocolMismatch,
    RequestError,
    ServerError,
    TooManyRequests,
    Unauthorized,
    Unreachable,
)
from tuneplane_node.client.sync import NodeClient
from tuneplane_node.client.watch import Backoff

__all__ = [
    "PROTOCOL",
    "PROTOCOL_HEADER",
    "AsyncNodeClient",
    "Backoff",
    "BadRequest",
    "Call",
    "CardUsage",
    "ClientError",
    "Conditions",
    "ConfigError",
    "Conflict",
    "Container",
    "Cordoned",
    "EngineRefused",
    "EngineUnavailable",
    "FieldError",
    "Forbidden",
    "Health",
    "Image",
    "ImageGc",
    "ImagePull",
    "ImageStore",
    "Images",
    "InsufficientStorage",
    "InvalidRequest",
    "Inventory",
    "JobDisk",
    "JobState",
    "Jobs",
    "Launched",
    "Logs",
    "Mount",
    "NameHeld",
    "NoCapacity",
    "NodeClient",
    "NodeError",
    "NodeState",
    "NotFound",
    "NotRunning",
    "PayloadTooLarge",
    "Prefetch",
    "ProtocolMismatch",
    "RemovedImage",
    "RequestError",
    "Runtime",
    "Scratch",
    "ServerError",
    "Stopping",
    "Tls",
    "TooManyRequests",
    "Unauthorized",
    "Unreachable",
    "Usage",
]
