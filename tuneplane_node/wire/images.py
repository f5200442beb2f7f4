"""The image verbs, their requests and their answers: ``POST /node/v1/images/pull`` and
``GET /node/v1/images``.

A prefetch answers ``{"image", "phase"}``: ``pulling`` (202: the pull runs in the
background) or ``present`` (200). The list answers the images the node pulled or its
containers use, and the pulls in flight with their progress, rate and time left (null
while unknown, never 0), and the failed prefetches with their error.

An image is named by the distribution grammar (`IMAGE_REFERENCE`), never by an id; the
launch's ``container.image``, ``registry_auth`` and ``pull_policy`` and the prefetch's
fields are read by the same readers here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, TypedDict

from tuneplane_node.errors import InvalidField
from tuneplane_node.references import FULL_ID, ID_PREFIX, ImageName
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
from tuneplane_node.wire.readers import CONTROL, NO_CONTROL, empty_as, read_body, read_text
from tuneplane_node.wire.values import (
    FAILED,
    IF_NOT_PRESENT,
    PRESENT,
    PULL_POLICIES,
    PULLING,
    PrefetchRequest,
    RegistryAuth,
)

PrefetchPhase = Annotated[
    str, Words("PrefetchPhase", (PULLING, PRESENT), "A prefetch: pulling, or present already.")
]
PullPhase = Annotated[str, Words("PullPhase", (PULLING, FAILED), "A pull: under way, or failed.")]


class PrefetchJson(TypedDict):
    image: str
    phase: PrefetchPhase


class ImageJson(TypedDict):
    image: str
    id: str
    size_bytes: int | None
    pulled_at: str | None
    last_used_at: str | None
    in_use_by: list[str]
    private: bool


class PullJson(TypedDict):
    image: str
    phase: PullPhase
    bytes_done: int
    bytes_total: int
    layers_done: int
    layers_total: int
    rate_bytes_per_s: float | None
    eta_s: float | None
    started_at: str
    waiting: list[str]
    error: str | None


class ImagesJson(TypedDict):
    images: list[ImageJson]
    pulls: list[PullJson]


# --- the requests: an image's name, its registry's credentials, its pull --------------------

MAX_IMAGE = 1000
# The distribution reference grammar (github.com/distribution/reference): what the
# engines accept as an image, and nothing that reads as a flag, a path or a URL.
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
# No bracketed IPv6 host: docker 20.10's reference parser refuses one ("invalid reference
# format", which reached the console as a 502).
# A port the host can have: a larger one reaches the engine only to fail its dial.
_PORT = r"(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_DOMAIN = rf"{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*(?::{_PORT})?"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_NAME_PART = rf"(?:{_DOMAIN}/)?{_PATH_PART}(?:/{_PATH_PART})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"  # \w would take any letter: é
# A digest as the engines take it (go-digest): a hash they have, its length, lower-case hex;
# the grammar's looser form reaches the engine only to be refused there (a 502).
_DIGEST = r"(?:sha256:[0-9a-f]{64}|sha384:[0-9a-f]{96}|sha512:[0-9a-f]{128})"
IMAGE_REFERENCE = re.compile(rf"(?P<name>{_NAME_PART})(?::{_TAG})?(?:@{_DIGEST})?")
# A volume's: its digest names the manifest it is kept by, a sha256 alone.
SHA256_REFERENCE = re.compile(rf"(?P<name>{_NAME_PART})(?::{_TAG})?(?:@sha256:[0-9a-f]{{64}})?")
# An image id, which the engines run whoever pulled it: never an image a console names.
IMAGE_ID = rf"(?!{ID_PREFIX}|{FULL_ID.pattern}$)"
MAX_IMAGE_NAME = 255
"""The longest name the engines take, counted as they count it: after normalising."""
MAX_CREDENTIAL = 8192  # a cloud registry's identity token runs to a few KiB
MAX_USERNAME = 512
AUTH_FORMS = ({"username", "password"}, {"identity_token"})


def read_image(given: Given) -> str:
    image = read_text(given.body, given.field, required=True, limit=MAX_IMAGE)
    match = IMAGE_REFERENCE.fullmatch(image)
    if match is None or len(ImageName.parse(match.group("name")).repository) > MAX_IMAGE_NAME:
        raise InvalidField(
            given.field, "must be an image reference like registry/name:tag (lower case)"
        )
    if image.startswith(ID_PREFIX) or FULL_ID.fullmatch(image):
        raise InvalidField(given.field, "must name a repository, not an image id")
    return image


def read_registry_auth(given: Given) -> RegistryAuth | None:
    """A user and password, or an identity token; read apart from the spec (it must never
    reach labels or env), and its refusals never echo a value."""
    value = empty_as(given.value, None)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidField(given.field, "must be {username, password} or {identity_token}")
    if set(value) not in AUTH_FORMS:
        raise InvalidField(given.field, "must be {username, password} or {identity_token}")
    found = {key: _credential(value[key], f"{given.field}.{key}") for key in sorted(value)}
    return RegistryAuth(**found, source="launch")


def _credential(value: object, field: str) -> str:
    limit = MAX_USERNAME if field.endswith("username") else MAX_CREDENTIAL
    if not isinstance(value, str) or not 0 < len(value) <= limit or CONTROL.search(value):
        raise InvalidField(field, f"must be 1 to {limit} characters, no control characters")
    return value


def read_pull_policy(given: Given) -> str:
    policy = empty_as(given.value, IF_NOT_PRESENT)
    if policy not in PULL_POLICIES:
        raise InvalidField(given.field, f"must be one of {', '.join(PULL_POLICIES)}")
    return str(policy)


IMAGE_SCHEMA = text(most=MAX_IMAGE, least=1, pattern=anchored(IMAGE_ID + IMAGE_REFERENCE.pattern))
IMAGE_DOC = (
    "Image reference, by the distribution grammar (`registry:port/path/name:tag@sha256:...`, "
    f"lower-case path, a port up to 65535, the name before the tag at most {MAX_IMAGE_NAME} "
    "characters counted as the engines count it, with `docker.io/` (and `library/`) added "
    "to a name without a registry); an image id (`sha256:...`, 64 hex digits) is "
    "refused, and so is a bare hex string the node pulled no repository by (an id prefix); "
    "anything else (`UPPER/Case`, `--help`, `../containers/x`) is refused before the "
    "engine sees it."
)
REGISTRY_AUTH_SCHEMA = or_empty(
    closed_object(
        username=text(most=MAX_USERNAME, least=1, pattern=NO_CONTROL),
        password=text(most=MAX_CREDENTIAL, least=1, pattern=NO_CONTROL),
    ),
    closed_object(identity_token=text(most=MAX_CREDENTIAL, least=1, pattern=NO_CONTROL)),
)
REGISTRY_AUTH_DOC = (
    '`{"username", "password"}` or `{"identity_token"}` (a user of at most '
    f"{MAX_USERNAME} characters, a secret of at most {MAX_CREDENTIAL}, no control "
    "characters). None: the node's `TUNEPLANE_REGISTRY_AUTH_FILE`, else anonymous."
)
PULL_POLICY_SCHEMA = or_empty({"enum": list(PULL_POLICIES)})


def parse_prefetch(body: Mapping[str, Any]) -> PrefetchRequest:
    """``POST /node/v1/images/pull``: a launch's image, credentials and pull policy, by
    the same rules, each named by its own field."""
    with Refusals() as refusals:
        refusals.unknown(body, PREFETCH)
        image = refusals.read(read_image, Given(body, "image", ""))
        auth = refusals.read(read_registry_auth, Given(body, "registry_auth", ""))
        policy = refusals.read(read_pull_policy, Given(body, "pull_policy", ""))
    return PrefetchRequest(image, auth=auth, pull_policy=policy)


PREFETCH = Body(
    "PrefetchBody",
    closed=True,
    fields=(
        Field("image", IMAGE_SCHEMA, IMAGE_DOC, required=True),
        Field(
            "registry_auth",
            REGISTRY_AUTH_SCHEMA,
            f"Credentials for the registry of `image`, for this pull only: {REGISTRY_AUTH_DOC} "
            "Never logged, stored or shown; a wrong one fails the pull as it fails a launch.",
        ),
        Field(
            "pull_policy",
            PULL_POLICY_SCHEMA,
            f"`{IF_NOT_PRESENT}` (the default): an image that is here is `present`, nothing "
            "is pulled; `always`: pull the tag again (a digest reference never is).",
        ),
    ),
)


def parse_image_gc(body: Mapping[str, Any]) -> None:
    read_body(body, IMAGE_GC)


IMAGE_GC = Body("ImageGcBody", (), doc="Nothing is read from it.")
