"""The docker API's document shapes, read into the runtime contract's types.

Docker speaks these shapes, and podman's docker-compatible endpoints speak them too:
inspect documents, list entries, events, and the pull's progress stream. Pure parsing,
no I/O and no SDK, so both adapters and their tests share it.
"""

from __future__ import annotations

import base64
import json
import re
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping
from datetime import datetime, timezone
from typing import Any

from tuneplane_node.clock import normalise, rfc3339
from tuneplane_node.references import ImageName
from tuneplane_node.runtime.base import Brief, ContainerState, EngineEvent, LogText, PullProgress
from tuneplane_node.runtime.facts import EngineImage, ImageInfo, Usage, cuda_env
from tuneplane_node.signals import engine_stop_signal
from tuneplane_node.wire.values import RegistryAuth

LIBPOD_STATUSES = {"configured": "created", "initialized": "created", "stopped": "exited"}
"""libpod's own words for the states docker calls created and exited."""
_EXITED = ("exited", "dead")
_EXIT_CODE = re.compile(r"^Exited \((-?\d+)\)")


def state_from_inspect(data: Mapping[str, Any]) -> ContainerState:
    """ContainerState from an inspect document (docker's and libpod's share the fields)."""
    state = data.get("State") or {}
    raw = str(state.get("Status", "")).lower()
    status = LIBPOD_STATUSES.get(raw, raw)
    config = data.get("Config") or {}
    return ContainerState(
        name=str(data.get("Name", "")).lstrip("/"),
        exists=True,
        status=status,
        # An exit code means something only once the process has exited.
        exit_code=int(state.get("ExitCode", 0)) if status in _EXITED else None,
        labels=dict(config.get("Labels") or {}),
        created_at=normalise(data.get("Created")),
        started_at=normalise(state.get("StartedAt")),
        finished_at=normalise(state.get("FinishedAt")),
        oom_killed=bool(state.get("OOMKilled")),
        id=data.get("Id"),
        stop_signal=engine_stop_signal(config.get("StopSignal")),
        image_id=image_id(data.get("Image")),
        read_only_root=bool((data.get("HostConfig") or {}).get("ReadonlyRootfs")),
        # libpod's OCIRuntime first: its HostConfig.Runtime is "oci" whatever runs the job
        engine_runtime=data.get("OCIRuntime") or (data.get("HostConfig") or {}).get("Runtime"),
    )


_BARE_ID = re.compile(r"^[0-9a-f]{64}$")


def image_id(value: object) -> str | None:
    """An image id as the node says it, ``sha256:<hex>``: docker's inspect gives that,
    libpod's the bare hex."""
    if not isinstance(value, str) or not value:
        return None
    return f"sha256:{value}" if _BARE_ID.match(value) else value


def image_from_inspect(data: Mapping[str, Any]) -> ImageInfo:
    """ImageInfo from an image's inspect document (docker's, podman's compatible one)."""
    size = data.get("Size")
    return ImageInfo(
        id=image_id(data.get("Id")) or "",
        size_bytes=int(size) if isinstance(size, (int, float)) and size >= 0 else None,
        names=tuple(str(name) for name in data.get("RepoTags") or ()),
        digests=tuple(str(d) for d in data.get("RepoDigests") or () if d and "<none>" not in d),
        cuda_env=cuda_env((data.get("Config") or {}).get("Env") or ()),
    )


def image_named(image: str, doc: Mapping[str, Any] | None) -> ImageInfo | None:
    """The image ``image`` names, of its inspect document (None: the engine has none,
    or it is not what a reference by digest names: `names_by_digest`)."""
    info = image_from_inspect(doc) if doc is not None else None
    return info if info is None or names_by_digest(image, info) else None


def names_by_digest(image: str, info: ImageInfo) -> bool:
    """Whether ``info`` is what ``image`` names, where ``image`` names a digest: one of
    the image's registry digests is that digest of that repository. Podman resolves
    ``repo@sha256:...`` by the digest alone, whatever the repository: a reference to a
    public registry's name would resolve to another tenant's private image (pulled from
    another registry), and the private rule would ask that registry with credentials
    given for the public one. A reference by tag is the engine's to resolve."""
    name = ImageName.parse(image)
    if not name.by_digest:
        return True
    return any(ImageName.parse(digest) == name for digest in info.digests)


def brief_from_list(entry: Mapping[str, Any]) -> Brief:
    """A Brief from a list entry; the exit code is read from ``Exited (3) 2 minutes ago``."""
    raw = str(entry.get("State", "")).lower()
    status = LIBPOD_STATUSES.get(raw, raw)
    code = _EXIT_CODE.match(str(entry.get("Status", "")))
    names = entry.get("Names") or [""]
    exit_code = int(code.group(1)) if code and status in _EXITED else None
    return Brief(
        str(entry.get("Id")),
        str(names[0]).lstrip("/"),
        (status, exit_code),
        labels={str(k): str(v) for k, v in (entry.get("Labels") or {}).items()},
        created_at=_listed_created(entry.get("Created")),
        image_id=image_id(entry.get("ImageID")),
    )


def _listed_created(created: Any) -> str | None:
    """A list entry's creation time: docker's list gives seconds since the epoch (and
    podman's compat list the same); anything else is taken as a time string."""
    if isinstance(created, (int, float)) and not isinstance(created, bool):
        return rfc3339(datetime.fromtimestamp(created, timezone.utc))
    return normalise(str(created)) if created else None


_HEX_ID = re.compile(r"^[0-9a-f]{64}$")


def sha_id(value: Any) -> str:
    """An image id as the node says it, ``sha256:<hex>``: docker lists it so, podman's
    compat list of containers at times as the bare hex."""
    text = str(value or "")
    return f"sha256:{text}" if _HEX_ID.match(text) else text


def image_from_list(entry: Mapping[str, Any], *, used: Collection[str]) -> EngineImage:
    """An image of the engine's list (docker's shape; podman's compat list alike);
    ``used``: the ids (`sha_id`) of the images any container is made from."""
    tags = [str(t) for t in entry.get("RepoTags") or () if t and t != "<none>:<none>"]
    digests = [str(d) for d in entry.get("RepoDigests") or () if d and "<none>" not in d]
    image_id = sha_id(entry.get("Id"))
    return EngineImage(
        id=image_id,
        refs=tuple(tags + digests),
        size=max(0, int(entry.get("Size") or 0)),
        created=_listed_created(entry.get("Created")),
        in_use=image_id in used,
    )


def event_from_docker(event: Mapping[str, Any]) -> EngineEvent:
    """An EngineEvent from an event document (docker's, or podman's compat one)."""
    actor = event.get("Actor") or {}
    attributes = actor.get("Attributes") or {}
    code = str(attributes.get("exitCode", ""))
    nanos = event.get("timeNano")
    moment = datetime.fromtimestamp(nanos / 1e9, tz=timezone.utc) if nanos else None
    return EngineEvent(
        id=str(event.get("id") or actor.get("ID")),
        action=str(event.get("Action") or event.get("status", "")),
        exit_code=int(code) if code.lstrip("-").isdigit() else None,
        at=rfc3339(moment) if moment else None,
    )


def event_labels(event: Mapping[str, Any]) -> Mapping[str, Any]:
    """An event's actor attributes, where engines copy the container's labels."""
    actor = event.get("Actor") or {}
    return actor.get("Attributes") or {}


def pull_params(image: str) -> dict[str, str]:
    """``/images/create`` parameters: an untagged name means ``latest``.

    Without a tag the engine would pull EVERY tag of the repository.
    """
    last = image.rsplit("/", 1)[-1]
    if "@" in image or ":" in last:
        return {"fromImage": image}
    return {"fromImage": image, "tag": "latest"}


PULL_DENIED = re.compile(
    r"unauthorized|authentication required|no basic auth credentials|denied|forbidden"
    r"|401 Unauthorized|403 Forbidden",
    re.IGNORECASE,
)
"""What docker 20.10+ and podman 4 say when the registry refuses a pull's credentials
(or, deliberately alike, has no such repository)."""


def auth_header(auth: RegistryAuth, registry: str) -> str:
    """The ``X-Registry-Auth`` header both engines read on a pull: docker's AuthConfig
    as URL-safe base64 JSON (podman's compat and libpod endpoints decode the same)."""
    if auth.identity_token:
        document = {"identitytoken": auth.identity_token, "serveraddress": registry}
    else:
        document = {"username": auth.username, "password": auth.password}
        document["serveraddress"] = registry
    return base64.urlsafe_b64encode(json.dumps(document).encode()).decode("ascii")


def json_lines(lines: Iterator[bytes]) -> Iterator[dict[str, Any]]:
    """Decoded JSON documents from a stream of lines (podman's compat streams)."""
    for line in lines:
        if line:
            yield json.loads(line)


def follow_params(tail: int, since: datetime | None) -> dict[str, int | float]:
    """``/containers/{id}/logs`` parameters of a followed log, timestamps on (both engines'
    compat endpoints read them alike)."""
    params: dict[str, int | float] = {
        "stdout": 1,
        "stderr": 1,
        "timestamps": 1,
        "follow": 1,
        "tail": tail,
    }
    if since is not None:
        params["since"] = since.timestamp()
    return params


FRAME_HEADER = 8
"""A multiplexed stream's frame header: stream, three zeros, the payload's size (BE)."""


def log_pieces(read: Callable[[int], bytes], *, piece: int) -> Iterator[bytes]:
    """The text of a multiplexed log stream (a non-tty container's), as `LogFold` shows
    it: each entry's payload, in pieces of at most ``piece`` bytes, the time of an entry
    that continues a line (engines cut lines at 16 KiB) dropped. ``read(n)`` returns n
    bytes, or fewer at the end of the stream."""
    midline = False
    while len(header := read(FRAME_HEADER)) == FRAME_HEADER:
        left = int.from_bytes(header[4:], "big")
        first, data = True, b""
        while left > 0:
            data = read(min(left, piece))
            if not data:
                return
            left -= len(data)
            out = data.partition(b" ")[2] if first and midline else data
            first = False
            if out:
                yield out
        midline = bool(data) and not data.endswith(b"\n")


class ProgressFold:
    """Folds the pull's progress messages into bytes and layers.

    ``moved`` changes whenever anything advances (download or extraction bytes, a layer
    done): that, not the bytes alone, is what the stall deadline watches.
    """

    _DONE = frozenset({"Download complete", "Pull complete", "Already exists"})

    def __init__(self) -> None:
        self._download: dict[str, tuple[int, int]] = {}
        self._extract: dict[str, int] = {}
        self._layers: set[str] = set()
        self._done: set[str] = set()
        self._downloaded: set[str] = set()
        self.moved = 0

    def update(self, message: Mapping[str, Any]) -> bool:
        """Fold one message in; True when it moved the pull forward."""
        layer, status = message.get("id"), str(message.get("status", ""))
        detail = message.get("progressDetail") or {}
        if not layer or not isinstance(layer, str) or status.startswith("Pulling from"):
            return False
        before = self._position()
        self._layers.add(layer)
        current, total = int(detail.get("current") or 0), int(detail.get("total") or 0)
        if status == "Downloading" and total:
            self._download[layer] = (current, total)
        elif status == "Extracting":
            self._extract[layer] = current
        if status in self._DONE:
            (self._downloaded if status == "Download complete" else self._done).add(layer)
            size = self._download.get(layer, (0, 0))[1]
            if size:
                self._download[layer] = (size, size)
        changed = self._position() != before
        self.moved += changed
        return changed

    def progress(self) -> PullProgress:
        # A layer counts once its bytes are here: podman's compat stream stops at
        # "Download complete", and docker's extraction shows up in `moved` instead.
        return PullProgress(
            bytes_done=sum(c for c, _ in self._download.values()),
            bytes_total=sum(t for _, t in self._download.values()),
            layers_done=len(self._done | self._downloaded),
            layers_total=len(self._layers),
        )

    def _position(self) -> tuple[PullProgress, int, int]:
        return self.progress(), sum(self._extract.values()), len(self._done)


class LogFold:
    """Log entries, as the engines stream them, folded into the newest lines.

    An entry is ``TIMESTAMP text``: a whole line, or a piece of one (engines cut lines
    at 16 KiB; a piece that does not end the line has no newline). Pieces are joined
    into their line under the first piece's time. At most ``keep`` lines and
    ``max_bytes`` bytes are held, the newest (the oldest line kept may lose its front);
    what the cap drops sets ``truncated``.
    Memory stays within the cap however long the log or a line is.
    """

    def __init__(self, *, keep: int, max_bytes: int) -> None:
        self.keep = keep
        self.max_bytes = max_bytes
        self.lines: deque[bytes] = deque()
        self.size = 0
        self.partial = bytearray()
        self.entries = 0
        self.complete = 0  # lines ended, in all
        self.truncated = False

    def add(self, entry: bytes) -> None:
        self.entries += 1
        if self.partial:  # a continuation: its own timestamp goes
            entry = entry.partition(b" ")[2]
        self.partial += entry
        if len(self.partial) > self.max_bytes:
            del self.partial[: len(self.partial) - self.max_bytes]
            self.truncated = True
        if entry.endswith(b"\n"):
            line = bytes(self.partial)
            self.partial.clear()
            self._line(line)

    def _line(self, line: bytes) -> None:
        self.complete += 1
        self.lines.append(line)
        self.size += len(line)
        while len(self.lines) > self.keep:
            self.size -= len(self.lines.popleft())
        while (excess := self.size + len(self.partial) - self.max_bytes) > 0 and self.lines:
            self.truncated = True
            oldest = self.lines[0]
            if len(oldest) <= excess:
                self.size -= len(self.lines.popleft())
            else:  # the newest part of the oldest line fills what the cap leaves
                self.lines[0] = oldest[excess:]
                self.size -= excess

    def text(self, *, skip_first: bool) -> LogText:
        """The lines folded, the unfinished one last; ``skip_first`` drops a first line
        that may have begun before the part read."""
        lines = list(self.lines)
        if skip_first and self.complete == len(lines) and lines:
            lines = lines[1:]
        joined = b"".join(lines) + bytes(self.partial)
        return LogText(joined.decode("utf-8", errors="replace"), self.truncated)


def usage_from_stats(doc: Mapping[str, Any], *, machine_memory: int | None) -> Usage:
    """A `Usage` from a one-shot ``/containers/{id}/stats`` document (docker's, and
    podman's compat one). Engines give the machine's memory as the limit of a container
    without one: a limit of at least ``machine_memory`` reads as none."""
    cpu = ((doc.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
    memory = doc.get("memory_stats") or {}
    stat = memory.get("stats") or {}
    charged = memory.get("usage")
    inactive = stat.get("inactive_file", stat.get("total_inactive_file", 0))
    limit = memory.get("limit") or 0
    unlimited = limit <= 0 or (machine_memory is not None and limit >= machine_memory)
    return Usage(
        cpu_seconds=cpu / 1e9 if isinstance(cpu, (int, float)) else None,
        memory_bytes=max(0, int(charged) - int(inactive)) if charged is not None else None,
        memory_limit_bytes=None if unlimited else int(limit),
        pids=(doc.get("pids_stats") or {}).get("current"),
        source="engine",
    )
