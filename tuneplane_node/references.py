"""Image references as the engines read them, normalised once for the whole node.

distribution/reference's normaliser, which docker runs on every name and podman on every
fully qualified one: a first part that is no host means Docker Hub (``docker.io``, and
``library/`` for a one-part name), Docker Hub's other spellings (``index.docker.io``,
``registry-1.docker.io``) are ``docker.io``, no tag means ``latest``. Two spellings of one
image are one `ImageName`, so a rule keyed by it cannot be spelt around.

What the engines also accept and a console never needs is told apart here too: an image
id (``sha256:<hex>``, the bare hex) or any prefix of one. docker resolves a name it has no
tag for as an id prefix ("d0" runs the one image whose id starts so), podman resolves
both, and podman matches a short name against its local store by suffix. The node never
hands an engine such a string: it resolves a reference to an id itself
(`jobs.images.ImageKeeper`) and creates the container from that id.
"""

from __future__ import annotations

import re
from typing import NamedTuple

DOCKER_HUB = "docker.io"
DOCKER_HUB_ALIASES = frozenset({"index.docker.io", "registry-1.docker.io"})
"""Docker Hub's other names, which docker's own store folds into ``docker.io``."""
ID_PREFIX = "sha256:"
HEX = re.compile(r"[0-9a-f]+")
FULL_ID = re.compile(r"(?:sha256:)?[0-9a-f]{64}")


class ImageName(NamedTuple):
    """An image reference as the engines read it: the registry's host, the repository's
    path there (``library/x`` for a bare Docker Hub name), and the tag or digest."""

    registry: str
    path: str
    reference: str

    @classmethod
    def parse(cls, image: str) -> ImageName:
        name, _, digest = image.partition("@")
        first, _, rest = name.partition("/")
        if rest and _is_host(first):
            registry, path = first, rest
        else:
            registry, path = DOCKER_HUB, name
        if registry in DOCKER_HUB_ALIASES:
            registry = DOCKER_HUB
        tag = ""
        if ":" in path.rsplit("/", 1)[-1]:
            path, tag = path.rsplit(":", 1)
        if registry == DOCKER_HUB and "/" not in path:
            path = f"library/{path}"
        return cls(registry, path, digest or tag or "latest")

    @property
    def repository(self) -> str:
        """``registry/path``: every tag and digest of one repository."""
        return f"{self.registry}/{self.path}"

    @property
    def by_digest(self) -> bool:
        return ":" in self.reference

    @property
    def canonical(self) -> str:
        """``registry/path:tag`` or ``registry/path@digest``: one spelling per image, and
        one no engine reads as an id or a short name."""
        return f"{self.repository}{'@' if self.by_digest else ':'}{self.reference}"


def _is_host(first: str) -> bool:
    """distribution/reference's rule: a first part with a dot or a port, ``localhost``,
    or upper case is a registry's host."""
    return "." in first or ":" in first or first == "localhost" or first != first.lower()


def canonical(image: str) -> str:
    return ImageName.parse(image).canonical


def names_an_id(image: str) -> bool:
    """Whether an engine could read ``image`` as an image id or id prefix: ``sha256:...``,
    or hexadecimal digits alone (no host, path, tag or digest)."""
    return image.startswith(ID_PREFIX) or HEX.fullmatch(image) is not None
