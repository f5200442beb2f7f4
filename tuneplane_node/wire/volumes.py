"""The volume verbs, their requests and their answers: ``POST /node/v1/volumes/pull``,
``GET /node/v1/volumes`` and ``POST /node/v1/volumes/gc`` (the answers filled by
`daemon.render`).

The entries of the node's volume store (each by its sha256, with its size, last use,
the containers that bind it and its pin) and the fills under way or failed, with their
bytes, rate and time left (null while unknown, never 0); the store's filesystem. A fill's
source is shown without its query (a signed URL's token). A prefetch answers its entry
(``present``, 200) or its fill (``filling``, 202).

A launch names its volumes in ``container.volumes`` (`VOLUMES`, the container's field and
its reader) and a prefetch one of them (`VOLUME_PULL`), each read by the same rules: a
URL with its sha256, or an OCI reference, each part refused by its own name.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Annotated, Any, TypedDict
from urllib.parse import urlsplit

from tuneplane_node.errors import MISSING, InvalidField
from tuneplane_node.references import FULL_ID, ID_PREFIX, ImageName, names_an_id
from tuneplane_node.wire.fields import (
    Body,
    Field,
    Given,
    Refusals,
    Words,
    anchored,
    closed_object,
    or_empty,
    text,
)
from tuneplane_node.wire.images import (
    IMAGE_ID,
    IMAGE_REFERENCE,
    MAX_IMAGE,
    MAX_IMAGE_NAME,
    SHA256_REFERENCE,
)
from tuneplane_node.wire.mounts import UNMOUNTABLE, read_target
from tuneplane_node.wire.readers import PATH, read_body, read_flag, read_list
from tuneplane_node.wire.values import FAILED, PRESENT, Volume

FILLING = "filling"
VolumePhase = Annotated[
    str,
    Words(
        "VolumePhase",
        (PRESENT, FILLING, FAILED),
        "An entry: present (complete, checked); a fill: filling, or failed.",
    ),
]


class VolumeStoreJson(TypedDict):
    """The volume store's filesystem (each null when it cannot be read) and the bytes of
    the store's own entries and partial files."""

    path: str
    total_bytes: int | None
    free_bytes: int | None
    used_bytes: int | None
    high_percent: int
    low_percent: int


class VolumeEntryJson(TypedDict):
    sha256: str
    size_bytes: int
    phase: VolumePhase
    last_used_at: str | None
    in_use_by: list[str] | None  # null: the engine did not say
    pin_expires_at: str | None


class VolumeFillJson(TypedDict):
    sha256: str
    source: str
    phase: VolumePhase
    bytes_done: int
    bytes_total: int | None
    rate_bytes_per_s: float | None
    eta_s: float | None
    started_at: str
    waiting: int
    error: str | None


class VolumesJson(TypedDict):
    entries: list[VolumeEntryJson]
    fills: list[VolumeFillJson]
    volume_store: VolumeStoreJson


class VolumePullJson(TypedDict):
    sha256: str
    phase: VolumePhase
    pin_expires_at: str
    size_bytes: int | None  # the entry's; null while it fills
    fill: VolumeFillJson | None  # the fill's progress; null once present


class EvictedVolumeJson(TypedDict):
    sha256: str
    size_bytes: int
    last_used_at: str


class VolumeGcJson(TypedDict):
    """One eviction run: what it removed, least recently used first, and the store after."""

    removed: list[EvictedVolumeJson]
    freed_bytes: int
    volume_store: VolumeStoreJson


# --- the requests: a launch's volumes, a prefetch, the GC ------------------------------------

MAX_VOLUMES = 16
MAX_URL = 2048
# A host as DNS names one (letters, digits, ``-`` and ``_`` in labels of at most 63, the
# last not all digits), an IPv4 address, or an IPv6 one in brackets: anything else is
# refused before any lookup.
LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
TOP_LABEL = rf"(?=[A-Za-z0-9_-]*[A-Za-z_]){LABEL}"
OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IPV4 = rf"(?:{OCTET}\.){{3}}{OCTET}"
HOST = rf"(?:\[[0-9A-Fa-f:.]+\]|{IPV4}|(?:{LABEL}\.)*{TOP_LABEL}\.?)"
USER = r"(?:[A-Za-z0-9._~!$&'()*+,;=:%-]+@)?"
URL = re.compile(rf"https?://{USER}{HOST}(?::[0-9]{{1,5}})?(?:[/?#][\x21-\x7e]*)?")
SHA256 = re.compile(r"(?:sha256:)?([0-9a-f]{64})")
VOLUME_SOURCE = {
    "anyOf": [
        text(most=MAX_URL, pattern=anchored(URL.pattern)),
        text(most=MAX_IMAGE, least=1, pattern=anchored(IMAGE_ID + SHA256_REFERENCE.pattern)),
    ]
}


def _volumes(given: Given) -> tuple[Volume, ...]:
    """``[{"source", "path", "sha256"}]``, each part refused by its own name
    (``container.volumes[1].sha256``); the insecure-host rule is the launcher's."""
    value = read_list(given, most=MAX_VOLUMES, what='{"source", "path", "sha256"}')
    with Refusals() as refusals:
        volumes = [
            refusals.read(_volume, entry, f"{given.field}[{i}]") for i, entry in enumerate(value)
        ]
        paths = [volume.path for volume in volumes if volume is not None]
        for i, path in enumerate(paths):
            if path in paths[:i]:
                refusals.refuse(InvalidField(f"{given.field}[{i}].path", f"{path}: given twice"))
    return tuple(volumes)


def _volume(entry: object, field: str) -> Volume:
    if not isinstance(entry, Mapping) or set(entry) - {"source", "path", "sha256"}:
        raise InvalidField(field, 'must be {"source": "https://...", "path": ..., "sha256": ...}')
    with Refusals() as refusals:
        source = refusals.read(_volume_source, entry.get("source"), f"{field}.source")
        path = refusals.read(read_target, entry.get("path"), f"{field}.path")
        digest = refusals.read(_volume_digest, entry.get("sha256"), f"{field}.sha256", source)
    return Volume(source, path, digest)


def _volume_source(source: object, field: str) -> str:
    """An ``https://`` URL (``http://`` too: the insecure-host rule is the launcher's), or
    an OCI reference (``registry/repo:tag``, ``@sha256:...``) as images are read."""
    if source is None or source == "":
        raise InvalidField(field, "required, an https:// URL or an OCI reference", problem=MISSING)
    if isinstance(source, str) and "://" not in source and len(source) <= MAX_IMAGE:
        return _volume_reference(source, field)
    if not isinstance(source, str) or len(source) > MAX_URL or not is_url(source):
        raise InvalidField(
            field,
            f"must be an https:// URL of at most {MAX_URL} printable ASCII characters "
            "naming a host (a DNS name, an IPv4 address or a bracketed IPv6 one) and a "
            "port from 1 to 65535 if any, or an OCI reference like registry/repo:tag",
        )
    return source


def is_url(source: str) -> bool:
    """Whether ``source`` is a URL the node fetches: http or https, a host as `HOST`
    reads it, a port from 1 to 65535, printable ASCII. A redirect's target is held to
    it too (`fetch.fetching`): nothing else is looked up."""
    if len(source) > MAX_URL or not URL.fullmatch(source):
        return False
    try:
        parts = urlsplit(source)
        port = parts.port
        host = parts.hostname or ""
        if ":" in host:
            ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return bool(host) and port != 0


def _volume_reference(source: str, field: str) -> str:
    match = IMAGE_REFERENCE.fullmatch(source)
    if match is None or len(ImageName.parse(match.group("name")).repository) > MAX_IMAGE_NAME:
        raise InvalidField(field, "must be an OCI reference like registry/repo:tag (lower case)")
    if names_an_id(source) or FULL_ID.fullmatch(source):
        raise InvalidField(field, "must name a repository, not an image id")
    if "@" in source and not source.rpartition("@")[2].startswith(ID_PREFIX):
        raise InvalidField(field, "a volume's digest must be a sha256")
    return source


def _volume_digest(digest: object, field: str, source: str | None) -> str:
    """The hex of a URL's file or of an OCI manifest (``""``: an OCI reference's tag
    resolves it, or its own digest pins it). ``source`` None: refused already."""
    oci = source is not None and "://" not in source
    if digest is None or digest == "":
        if oci or source is None:
            return _pinned(source or "")
        raise InvalidField(field, "required for a URL: the file's sha256", problem=MISSING)
    found = SHA256.fullmatch(digest) if isinstance(digest, str) else None
    if found is None:
        raise InvalidField(field, "must be 64 lower-case hex digits (sha256:... too)")
    if oci and _pinned(source or "") not in ("", found[1]):
        raise InvalidField(field, "must be the digest the source names, or left out")
    return found[1]


def _pinned(source: str) -> str:
    """The sha256 an OCI reference names by digest (hex), else ``""``."""
    found = SHA256.fullmatch(source.rpartition("@")[2]) if "@" in source else None
    return found[1] if found is not None else ""


# A URL names its file's sha256 (an OCI reference's tag or digest resolves it): in the
# document as the node reads it (`_volume_digest`), so a generated pull of a URL has one.
URL_NEEDS_SHA256 = {
    "if": {"properties": {"source": {"type": "string", "pattern": "^https?://"}}},
    "then": {
        "properties": {"sha256": {"type": "string", "minLength": 64}},
        "required": ["sha256"],
    },
}
VOLUMES = Field(
    "volumes",
    or_empty(
        {
            "type": "array",
            "maxItems": MAX_VOLUMES,
            "items": {
                **closed_object(
                    source=VOLUME_SOURCE,
                    path=PATH,
                    sha256=or_empty(text(most=71, pattern=anchored(SHA256.pattern))),
                ),
                "required": ["source", "path"],
                **URL_NEEDS_SHA256,
            },
        }
    ),
    f"At most {MAX_VOLUMES} read-only files or directories of the node's volume "
    'store, each `{"source": "https://...", "path": "/models/base.safetensors", '
    '"sha256": "<64 hex>"}` or `{"source": "registry/repo:tag", "path": '
    '"/models/base"}`: the node fetches `source` once per machine however many jobs '
    "name it, checks every byte, keeps it under `TUNEPLANE_VOLUME_ROOT`, and binds it "
    "read-only at `path` (a write is `EROFS`). A URL is one file, resumed with "
    "`Range` after a dropped connection or a restart, and its `sha256` is required; "
    "a server whose certificate a private CA signed is trusted through the operator's "
    "`TUNEPLANE_VOLUME_CA_FILE`. "
    "An OCI reference (`registry/repo:tag` or `registry/repo@sha256:...`, read as "
    "`container.image` is) names an artifact or image whose layers (tar, gzip'd or "
    "not; zstd refused) the node unpacks in order, whiteouts applied, into one "
    "directory: the entry is named by the manifest's digest (two tags of one "
    "content are one entry; an index is followed to this machine's `linux` "
    "manifest, or refused), `sha256` is optional and, if given, must be that "
    "digest. The node fetches for the launch with the launch's authority alone: "
    "only public addresses (never loopback, link-local, private, CGNAT or the node's "
    "own, unless the operator lists the network in `TUNEPLANE_VOLUME_ALLOWED_NETWORKS`), "
    "redirects only to `https://`, no cookie or connection shared with another fill, "
    "and a fill shared only by launches naming the same source (and credentials). An "
    "entry the node holds is bound at once for a source that filled it or proved it "
    "holds its bytes; any other URL proves it first (4 ranges of 64 KiB at random "
    "offsets compared with the stored bytes; a server that ignores ranges sends the "
    "whole file, hashed in the background while the launch is `pulling`), else `403` "
    "`forbidden_volume`. A fill's failure never says what the bytes it got hash to. "
    "The node asks the registry itself with the launch's "
    "`registry_auth` (only where the volume's registry is the image's), else the "
    "node's `TUNEPLANE_REGISTRY_AUTH_FILE`; a volume pulled with credentials is "
    "private as a private image is: a later launch naming it, by any tag or digest, "
    "needs credentials its registry accepts (`403` `forbidden_image`), and a URL "
    "naming its digest is a `422` (a source binds only an entry of its kind). Layers "
    "with absolute paths, `..`, paths through links, device nodes, more bytes "
    "than 20 times their size and 1 GiB, or more entries than one per 128 bytes of it "
    "and 10,000 (2^20 at most: budgets taken from the manifest before the first byte, "
    "counted while unpacking) fail the fill with the reason, nothing left in the store. "
    "Plain `http://` (a URL's, a "
    "registry's) only for the hosts in `TUNEPLANE_VOLUME_INSECURE_HOSTS`. A launch "
    "whose volumes are not all in the store answers `phase: pulling` at once, holds "
    "its cards, and starts when every volume and its image are there; a fill that "
    "fails (the server's `404`, other bytes than the digest names, a volume that "
    "does not fit below `TUNEPLANE_VOLUME_GC_HIGH_PERCENT` of the store even after "
    "eviction: the sum of an OCI manifest's layer sizes; entries are evicted only as "
    "its bytes come, never for its claimed size; a source that brings less than a MiB "
    "in `TUNEPLANE_LOCAL_IMAGE_PULL_STALL_S`, 5 times in a row; a fill past "
    "`TUNEPLANE_VOLUME_FILL_TIMEOUT_S`) fails the launch with the reason and lets its "
    "cards go. `path`: absolute, not another volume's, and as "
    f"for mounts, {UNMOUNTABLE}. A bad one is a `422` naming "
    '`container.volumes[i].source`, `.path` or `.sha256`. `""` or none: no '
    'volumes (a `""` `sha256` is none given). The process runtime and an engine '
    "on another machine refuse them (`422`).",
    read=_volumes,
)


def parse_volume_pull(body: Mapping[str, Any]) -> tuple[Volume, bool]:
    """``POST /node/v1/volumes/pull``: a volume as one of ``container.volumes`` names it
    (its ``source`` and ``sha256``; no ``path``), each part refused by its own name, and
    whether the answer waits for the fill (``wait``)."""
    with Refusals() as refusals:
        refusals.unknown(body, VOLUME_PULL)
        source = refusals.read(_volume_source, body.get("source"), "source")
        digest = refusals.read(_volume_digest, body.get("sha256"), "sha256", source)
        wait = refusals.read(read_flag, Given(body, "wait", ""))
    return Volume(source, "", digest), bool(wait)


def parse_volume_gc(body: Mapping[str, Any]) -> None:
    read_body(body, VOLUME_GC)


VOLUME_PULL = Body(
    "VolumePullBody",
    closed=True,
    fields=(
        Field(
            "source",
            VOLUME_SOURCE,
            "Where the volume is, as a launch's `container.volumes[i].source`: an "
            "`https://` URL (shown without its query) or an OCI reference "
            "(`registry/repo:tag`, `@sha256:...`), asked with the node's "
            "`TUNEPLANE_REGISTRY_AUTH_FILE` credentials for its registry (plain `http://` "
            "only for the hosts in `TUNEPLANE_VOLUME_INSECURE_HOSTS`).",
            required=True,
        ),
        Field(
            "sha256",
            or_empty(text(most=71, pattern=anchored(SHA256.pattern))),
            "The file's sha256 (64 hex digits, `sha256:` before them too): the entry's "
            "name, which its bytes must hash to. Required for a URL; for an OCI "
            "reference, its manifest's digest (optional: the reference resolves it).",
        ),
        Field(
            "wait",
            or_empty({"type": "boolean"}),
            "`true`: answer when the fill has ended (`200`, or its error: `502` "
            "`volume_fill_failed`); `false` (the default): answer once the fill is admitted "
            "(`202`), its room found and its size asked.",
        ),
    ),
    rule=URL_NEEDS_SHA256,
)
VOLUME_GC = Body("VolumeGcBody", (), doc="Nothing is read from it.")
