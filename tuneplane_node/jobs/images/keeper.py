"""ImageKeeper: which credentials a launch pulls with, and whether a cached private image
may run for it.

A private image one run pulled must not run for any other run that names it (the hole
Kubernetes closed with KEP-2535). So the node keeps a record, in its state directory,
of every repository it pulled with credentials, with the image ids and registry digests
those pulls left on the engine, its registry and a salted hash of each credential that
pulled it, never a secret.

The rule is checked against what the engine will run, not against the spelling: the
launcher resolves a reference to an image id first (`ImageInfo`, from the canonical
reference, `references.canonical`) and creates the container from that id. An image is
private when its repository is recorded (every tag and digest of it), or its id or one
of its digests is (another repository's tag of it, an operator's re-tag). It runs only
for credentials (the launch's, else the node file's) that pulled it, or that the
registry of the recorded repository serves its manifest to now (a HEAD, not a
download); that yes is kept `TUNEPLANE_PRIVATE_IMAGE_RECHECK_S`. Images the node did
not pull with credentials (the operator's) are not checked.

Fail closed on the record: a repository is written in it before its first pull with
credentials (`before_pull`; no record, no pull). A later write that fails keeps the
record in memory and is retried; until it is written, only credentials the record
holds admit its images (no registry yes). At start, an image the ledger says was pulled
with credentials and the record lacks is private, and temporary files of interrupted
writes are removed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tuneplane_node.clock import Clock, rfc3339
from tuneplane_node.durable import remove_leftovers, write_atomically
from tuneplane_node.errors import (
    ConfigError,
    ImageAccessDenied,
    InvalidField,
    PrivateRecordUnwritable,
)
from tuneplane_node.fetch import registry
from tuneplane_node.jobs.words.launch import LaunchRequest
from tuneplane_node.references import ImageName, names_an_id
from tuneplane_node.runtime.facts import ImageInfo
from tuneplane_node.settings import ImageSettings, env_name
from tuneplane_node.tasks import BackgroundTasks
from tuneplane_node.wire.values import ALWAYS, RegistryAuth

log = logging.getLogger(__name__)
RECORD_FILE = "private-images.json"
MAX_CREDENTIALS = 32  # per repository: the newest kept (rotations add one each)
MAX_IDS = 64  # image ids (and digests) per repository: the newest kept
MAX_FILE_BYTES = 16 * 2**20
RETRY_S = 5.0  # a record that could not be written is tried again this often


class CredentialSource(Protocol):
    """The node's own credentials (`runtime.authfile.AuthFile`)."""

    def lookup(self, registry: str) -> RegistryAuth | None:
        """The credentials for ``registry``, or None. Blocking."""


class RegistryCheck(Protocol):
    def __call__(self, image: str, auth: RegistryAuth) -> bool:
        """Whether the registry serves the image's manifest to these credentials; raises
        OSError when it cannot be asked. Blocking."""


class PulledImages(Protocol):
    """What the keeper reads of the image ledger (`imageledger.ImageLedger`)."""

    def pulled_repositories(self) -> set[str]:
        """The repositories (`ImageName.repository`) of every reference the node pulled."""

    def pulled_privately(self) -> Iterable[tuple[str, tuple[str, ...]]]:
        """(id, references) of each image the node pulled with credentials."""


@dataclass
class PrivateImage:
    """One repository the node pulled with credentials, and what those pulls left on the
    engine: image ids and manifest digests (``sha256:...``), newest last. ``reference``
    is the canonical reference last pulled, what its registry is asked about."""

    registry: str
    credentials: list[str] = field(default_factory=list)  # salted hashes, newest last
    pulled_at: str = ""
    ids: list[str] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    reference: str = ""

    def holds(self, info: ImageInfo) -> bool:
        """Whether the engine's image is one these pulls left (by id or by digest)."""
        return info.id in self.ids or any(_digest(d) in self.digests for d in info.digests)

    def add(self, info: ImageInfo) -> None:
        self.ids = _newest(self.ids, [info.id])
        self.digests = _newest(self.digests, [_digest(d) for d in info.digests])


def _digest(repo_digest: str) -> str:
    """``sha256:...`` of ``repo@sha256:...``: the manifest, whichever repository holds it."""
    return repo_digest.rpartition("@")[2]


def _newest(kept: list[str], new: list[str]) -> list[str]:
    return [*[old for old in kept if old not in new], *new][-MAX_IDS:]


class PrivateImageFile:
    """The record on disk: a salt of the node's own, and the private repositories.
    Written atomically (`durable`); small, so callers run its reads and writes in a
    thread."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / RECORD_FILE
        self.salt = b""
        self.images: dict[str, PrivateImage] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        """Read the record (the temporary files of interrupted writes removed first);
        none is an empty one with a new salt. An unreadable record stops the start:
        taken for empty, it would hand out every private image."""
        try:
            remove_leftovers(self.path)
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
            write_atomically(self.path, json.dumps(_unparse(self.salt, self.images)).encode())


def _parse(document: Any) -> tuple[bytes, dict[str, PrivateImage]]:
    salt = bytes.fromhex(document["salt"])
    images = {
        str(repository): PrivateImage(
            registry=str(entry["registry"]),
            credentials=[str(h) for h in entry["credentials"]],
            pulled_at=str(entry.get("pulled_at", "")),
            ids=[str(i) for i in entry.get("ids", ())],
            digests=[str(d) for d in entry.get("digests", ())],
            reference=str(entry.get("reference", "")),
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
                "ids": image.ids,
                "digests": image.digests,
                "reference": image.reference,
            }
            for repository, image in sorted(images.items())
        },
    }


class ImageKeeper:
    """Credentials for a launch's pull, and the private-image rule."""

    def __init__(
        self,
        settings: ImageSettings,
        *,
        credentials: CredentialSource | None,
        clock: Clock,
        ledger: PulledImages | None = None,
        check: RegistryCheck = registry.accepts,
    ) -> None:
        self.enabled = settings.private_image_check
        self.recheck_s = settings.private_image_recheck_s
        self.credentials_file = credentials
        self.clock = clock
        self.ledger = ledger
        self.check = check
        self.record = PrivateImageFile(settings.state_dir)
        self._yes: dict[tuple[str, str], float] = {}  # (repository, hash) -> trusted until
        self.unwritten = False  # the record on disk is behind the one in memory
        self._tasks = BackgroundTasks(log)

    async def start(self) -> None:
        await asyncio.to_thread(self.record.load)
        self._adopt_ledger()
        if self.record.images:
            log.info("private images: %d repositories recorded", len(self.record.images))

    def _adopt_ledger(self) -> None:
        """An image the ledger says was pulled with credentials, which the record lacks
        (its write failed before a crash), is private: no credential is known to be
        good for it, so only its registry's yes admits."""
        if self.ledger is None:
            return
        images = self.record.images
        for image_id, references in self.ledger.pulled_privately():
            info = ImageInfo(image_id)
            if not references or any(entry.holds(info) for entry in images.values()):
                continue
            name = ImageName.parse(references[-1])
            entry = images.setdefault(name.repository, PrivateImage(registry=name.registry))
            entry.reference = entry.reference or name.canonical
            entry.add(info)
            log.warning(
                "private image %s (%s): the ledger says it was pulled with credentials and "
                "the private-image record lacks it: private until pulled again",
                name.canonical, image_id[:19],
            )  # fmt: skip

    def refuse_id(self, image: str, *, field: str) -> None:
        """`InvalidField` for a reference an engine would read as an image id prefix
        (hex digits alone) that names no repository the node pulled."""
        if not names_an_id(image):
            return
        pulled = self.ledger.pulled_repositories() if self.ledger is not None else set()
        if ImageName.parse(image).repository not in pulled:
            raise InvalidField(field, "must name a repository, not an image id or id prefix")

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

    def private(self, names: Iterable[str], image_id: str = "") -> bool:
        """Whether an image of these names (or this id) is one the node pulled with
        credentials."""
        recorded = self.record.images
        info = ImageInfo(image_id) if image_id else None
        if info is not None and any(entry.holds(info) for entry in recorded.values()):
            return True
        return any(ImageName.parse(name).repository in recorded for name in names)

    def _guarding(self, image: str, info: ImageInfo) -> dict[str, PrivateImage]:
        """The recorded repositories whose rule covers this image: its own, and every
        one whose pulls left this id or digest."""
        recorded = self.record.images
        own = ImageName.parse(image).repository
        return {repo: e for repo, e in recorded.items() if repo == own or e.holds(info)}

    async def admit(self, image: str, info: ImageInfo, auth: RegistryAuth | None) -> None:
        """Return when the engine's image ``info`` (what ``image`` resolves to) may run
        for these credentials; else `ImageAccessDenied`."""
        guarding = self._guarding(image, info) if self.enabled else {}
        if not guarding:
            return  # not pulled with credentials by this node
        if auth is None:
            raise ImageAccessDenied(
                image=image,
                reason="the node pulled it with credentials, and this launch has none "
                "(container.registry_auth, or the node's TUNEPLANE_REGISTRY_AUTH_FILE)",
            )
        digest = auth.fingerprint(self.record.salt)
        if any(digest in entry.credentials for entry in guarding.values()):
            return
        if self.unwritten:
            reason = "its record is not written yet, and only the credentials that pulled it may"
            raise ImageAccessDenied(image=image, reason=reason)
        given_for = ImageName.parse(image).registry
        for repository, entry in guarding.items():
            if entry.registry != given_for:
                continue  # credentials go only to the registry they were given for
            if self._trusted(repository, digest) or await self._accepts(image, entry, auth):
                self._yes[(repository, digest)] = self.clock.monotonic() + self.recheck_s
                return
        reason = "its registry does not accept this launch's credentials for it"
        if all(entry.registry != given_for for entry in guarding.values()):
            reason = (
                "the node pulled it from another registry than the one this launch's "
                "credentials are for"
            )
        raise ImageAccessDenied(image=image, reason=reason)

    async def _accepts(self, image: str, entry: PrivateImage, auth: RegistryAuth) -> bool:
        """The registry's word on the recorded repository (not the launch's spelling,
        which may name a public registry's image of another content), asked only where
        the credentials were given for that registry (`admit`): the node's auth file's
        entry for a registry, or a launch's credentials for its image's, never reach
        another host."""
        asked = entry.reference or image
        try:
            accepted = await asyncio.to_thread(self.check, asked, auth)
        except OSError as exc:
            reason = f"its registry could not be asked whether these credentials may ({exc})"
            raise ImageAccessDenied(image=image, reason=reason) from None
        if accepted:
            log.info(
                "private image %s: the registry accepts the %s credentials", asked, auth.source
            )
        return accepted

    def _trusted(self, repository: str, digest: str) -> bool:
        now = self.clock.monotonic()
        self._yes = {key: until for key, until in self._yes.items() if until > now}
        return (repository, digest) in self._yes

    async def before_pull(self, image: str, auth: RegistryAuth | None) -> None:
        """Write the repository in the record before its first pull with credentials
        (no credential is recorded as good yet: the pull has not succeeded); no record,
        no pull (`PrivateRecordUnwritable`), since the image would run for anyone."""
        name = ImageName.parse(image)
        if auth is None or not self.enabled or name.repository in self.record.images:
            return
        self.record.images[name.repository] = PrivateImage(
            registry=name.registry, reference=name.canonical
        )
        try:
            await asyncio.to_thread(self.record.save)
        except OSError as exc:
            del self.record.images[name.repository]
            path = str(self.record.path)
            raise PrivateRecordUnwritable(image=image, path=path, reason=str(exc)) from None

    async def pulled(self, image: str, info: ImageInfo | None, auth: RegistryAuth | None) -> None:
        """Record a finished pull: with credentials, its repository is private (and these
        credentials, ids and digests its); without, the registry serves it to anyone, so
        neither the repository nor its content is."""
        name = ImageName.parse(image)
        images = self.record.images
        if auth is None:
            if not self._made_public(name.repository, info):
                return
        else:
            entry = images.setdefault(name.repository, PrivateImage(registry=name.registry))
            digest = auth.fingerprint(self.record.salt)
            kept = [h for h in entry.credentials if h != digest]
            entry.credentials = [*kept, digest][-MAX_CREDENTIALS:]
            entry.pulled_at = rfc3339(self.clock.now())
            entry.reference = name.canonical
            if info is not None:
                entry.add(info)
        await self._save()

    def _made_public(self, repository: str, info: ImageInfo | None) -> bool:
        """A pull without credentials: the repository, and what it pulled, are public."""
        images = self.record.images
        changed = images.pop(repository, None) is not None
        if changed:
            log.info("private image %s pulled without credentials: now public", repository)
        if info is not None:
            for entry in images.values():
                if entry.holds(info):
                    entry.ids = [i for i in entry.ids if i != info.id]
                    gone = {_digest(d) for d in info.digests}
                    entry.digests = [d for d in entry.digests if d not in gone]
                    changed = True
        return changed

    async def _save(self) -> None:
        """Write the record; one that fails is kept in memory, retried every `RETRY_S`,
        and said once in the log (the image is here: failing the launch would not take
        it away)."""
        try:
            await asyncio.to_thread(self.record.save)
        except OSError as exc:
            if not self.unwritten:
                log.error(
                    "private-image record %s not written (%s): only the credentials that "
                    "pulled its images admit them until it is; retried every %g s",
                    self.record.path, exc, RETRY_S,
                )  # fmt: skip
                self.unwritten = True
                self._tasks.spawn(self._retry(), name="private-image record retry")
            return
        self.unwritten = False

    async def _retry(self) -> None:
        while self.unwritten:
            await self.clock.sleep(RETRY_S)
            try:
                await asyncio.to_thread(self.record.save)
            except OSError:
                continue
            self.unwritten = False
            log.info("private-image record %s written", self.record.path)

    async def close(self) -> None:
        await self._tasks.close()
