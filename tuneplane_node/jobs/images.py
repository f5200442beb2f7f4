"""ImageKeeper: which credentials a launch pulls with, and whether a cached private image
may run for it.

A private image one run pulled must not run for any other run that names it (the hole
Kubernetes closed with KEP-2535). So the node keeps a record, in its state directory,
of every repository it pulled with credentials: its registry and a salted hash of each
credential that pulled it, never a secret. A later launch of an image of that
repository starts only when its credentials (the launch's, else the node file's) are
one of those, or its registry serves the image's manifest to them now (a HEAD, not a
download); that yes is kept `TUNEPLANE_PRIVATE_IMAGE_RECHECK_S`. Images the node did not
pull (the operator's) are not checked.

The record is by repository (every tag and digest of it), not by image id: a private
repository's other tags, and the digest of one, are as private, and a launch names a
reference, which is what the record is checked against before anything is created.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuneplane_node.clock import Clock, rfc3339
from tuneplane_node.errors import ConfigError, ImageAccessDenied
from tuneplane_node.inventory import fsync_dir
from tuneplane_node.jobs.results import ALWAYS, LaunchRequest
from tuneplane_node.runtime import registry
from tuneplane_node.runtime.base import RegistryAuth
from tuneplane_node.runtime.dockerformat import ImageName
from tuneplane_node.settings import NodeSettings, env_name

log = logging.getLogger(__name__)
RECORD_FILE = "private-images.json"
MAX_CREDENTIALS = 32  # per repository: the newest kept (rotations add one each)
MAX_FILE_BYTES = 16 * 2**20


class CredentialSource(Protocol):
    """The node's own credentials (`runtime.dockerauth.AuthFile`)."""

    def lookup(self, registry: str) -> RegistryAuth | None:
        """The credentials for ``registry``, or None. Blocking."""


class RegistryCheck(Protocol):
    def __call__(self, image: str, auth: RegistryAuth) -> bool:
        """Whether the registry serves the image's manifest to these credentials; raises
        OSError when it cannot be asked. Blocking."""


@dataclass
class PrivateImage:
    """One repository the node pulled with credentials."""

    registry: str
    credentials: list[str] = field(default_factory=list)  # salted hashes, newest last
    pulled_at: str = ""


class PrivateImageFile:
    """The record on disk: a salt of the node's own, and the private repositories.
    Written atomically (a temporary file, fsync, rename); small, so callers run its
    reads and writes in a thread."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / RECORD_FILE
        self.salt = b""
        self.images: dict[str, PrivateImage] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        """Read the record; none is an empty one with a new salt. An unreadable record
        stops the start: taken for empty, it would hand out every private image."""
        try:
            raw = self.path.read_bytes()[:MAX_FILE_BYTES]
        except FileNotFoundError:
            self.salt = secrets.token_bytes(32)
            return
        except OSError as exc:
            raise ConfigError(f"{env_name('node_state_dir')}: {self.path}: {exc}") from None
        try:
            self.salt, self.images = _parse(json.loads(raw))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ConfigError(
                f"{env_name('node_state_dir')}: {self.path} is not a private-image record "
                f"({exc}); remove it to start, and every private image is pulled again"
            ) from None

    def save(self) -> None:
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_name(f".{RECORD_FILE}.{os.getpid()}.tmp")
            data = json.dumps(_unparse(self.salt, self.images), indent=1).encode()
            with temporary.open("wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
            fsync_dir(self.path.parent)


def _parse(document: Any) -> tuple[bytes, dict[str, PrivateImage]]:
    salt = bytes.fromhex(document["salt"])
    images = {
        str(repository): PrivateImage(
            registry=str(entry["registry"]),
            credentials=[str(h) for h in entry["credentials"]],
            pulled_at=str(entry.get("pulled_at", "")),
        )
        for repository, entry in document["images"].items()
    }
    return salt, images


def _unparse(salt: bytes, images: dict[str, PrivateImage]) -> dict[str, Any]:
    return {
        "salt": salt.hex(),
        "images": {
            repository: {
                "registry": image.registry,
                "credentials": image.credentials,
                "pulled_at": image.pulled_at,
            }
            for repository, image in sorted(images.items())
        },
    }


class ImageKeeper:
    """Credentials for a launch's pull, and the private-image rule."""

    def __init__(
        self,
        settings: NodeSettings,
        *,
        credentials: CredentialSource | None,
        clock: Clock,
        check: RegistryCheck = registry.accepts,
    ) -> None:
        self.enabled = settings.private_image_check
        self.recheck_s = settings.private_image_recheck_s
        self.credentials_file = credentials
        self.clock = clock
        self.check = check
        self.record = PrivateImageFile(settings.state_dir)
        self._yes: dict[tuple[str, str], float] = {}  # (repository, hash) -> trusted until

    async def start(self) -> None:
        await asyncio.to_thread(self.record.load)
        if self.record.images:
            log.info("private images: %d repositories recorded", len(self.record.images))

    async def credentials(self, request: LaunchRequest) -> RegistryAuth | None:
        """The launch's own credentials, else the node file's for the image's registry."""
        return await self.credentials_for(request.spec.image, request.auth)

    async def credentials_for(self, image: str, auth: RegistryAuth | None) -> RegistryAuth | None:
        """``auth`` (a launch's or a prefetch's own), else the node file's for the
        image's registry."""
        if auth is not None or self.credentials_file is None:
            return auth
        registry_name = ImageName.parse(image).registry
        return await asyncio.to_thread(self.credentials_file.lookup, registry_name)

    @staticmethod
    def must_pull(image: str, pull_policy: str) -> bool:
        """Whether a present image is pulled again: ``always``, unless it is named by
        digest (that content never changes)."""
        return pull_policy == ALWAYS and not ImageName.parse(image).by_digest

    def private(self, names: Iterable[str]) -> bool:
        """Whether an image of these names is one the node pulled with credentials."""
        recorded = self.record.images
        return any(ImageName.parse(name).repository in recorded for name in names)

    async def admit(self, image: str, auth: RegistryAuth | None) -> None:
        """Return when a present image may run for these credentials; else
        `ImageAccessDenied`."""
        name = ImageName.parse(image)
        recorded = self.record.images.get(name.repository) if self.enabled else None
        if recorded is None:
            return  # not pulled with credentials by this node
        if auth is None:
            raise ImageAccessDenied(
                image=image,
                reason="the node pulled it with credentials, and this launch has none "
                "(container.registry_auth, or the node's TUNEPLANE_REGISTRY_AUTH_FILE)",
            )
        digest = auth.fingerprint(self.record.salt)
        if digest in recorded.credentials or self._trusted(name.repository, digest):
            return
        try:
            accepted = await asyncio.to_thread(self.check, image, auth)
        except OSError as exc:
            reason = f"its registry could not be asked whether these credentials may ({exc})"
            raise ImageAccessDenied(image=image, reason=reason) from None
        if not accepted:
            reason = "its registry does not accept this launch's credentials for it"
            raise ImageAccessDenied(image=image, reason=reason)
        self._yes[(name.repository, digest)] = self.clock.monotonic() + self.recheck_s
        log.info("private image %s: the registry accepts the %s credentials", image, auth.source)

    def _trusted(self, repository: str, digest: str) -> bool:
        now = self.clock.monotonic()
        self._yes = {key: until for key, until in self._yes.items() if until > now}
        return (repository, digest) in self._yes

    async def pulled(self, image: str, auth: RegistryAuth | None) -> None:
        """Record a finished pull: with credentials, its repository is private (and these
        credentials its); without, the registry serves it to anyone, so it is not."""
        name = ImageName.parse(image)
        images = self.record.images
        if auth is None:
            if images.pop(name.repository, None) is None:
                return
            log.info("private image %s pulled without credentials: now public", name.repository)
        else:
            entry = images.setdefault(name.repository, PrivateImage(registry=name.registry))
            digest = auth.fingerprint(self.record.salt)
            kept = [h for h in entry.credentials if h != digest]
            entry.credentials = [*kept, digest][-MAX_CREDENTIALS:]
            entry.pulled_at = rfc3339(self.clock.now())
        try:
            await asyncio.to_thread(self.record.save)
        except OSError as exc:
            # The image is here already: failing the launch would not take it away. The
            # record in memory keeps the rule until a restart.
            log.error("private-image record %s not written (%s)", self.record.path, exc)
