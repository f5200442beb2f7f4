"""VolumeSources: a launch's volumes as the store names them, and the rules that decide
whether an entry the node holds may be handed to this launch: the private rule images
keep (OCI volumes), and possession (URLs).

A reference is resolved before anything is decided (as an image is to its id): a tag
through its registry, a digest as given; ``sha256``, when given, pins the entry (a tag is
asked only when the entry must be fetched, and must name that digest). The volume is
then ``registry/repo@sha256:<digest>``: what is filled, labelled and bound is exactly
that content, and two tags of one content are one entry.

Credentials: the launch's own only where the volume's registry is its image's (they
were given for that registry), else the node file's for the volume's registry. The
private rule is the images' (`ImageKeeper`, its record keyed by repository, id and
digest): an entry present is used only when `ImageKeeper.admit` allows these
credentials (the digest as the "image id"), a missing one's repository is recorded
before a fill with credentials, and a finished fill records them (or, without
credentials, makes the repository public), as a pull does.

Possession: a URL naming an entry the node holds, by an access the entry did not record
(`Accesses`: another URL, or the same file's URL signed anew), shows first that its
source holds the same bytes (`Possession`: a few ranges). A source that answers other
bytes or does not answer is a `VolumeAccessDenied` (403) naming the volume; one that
answers ranges with the whole file is left to a fill to prove (the launch waits in
``pulling``, as for a missing volume).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tuneplane_node.errors import InvalidField, VolumeAccessDenied, VolumeFillFailed
from tuneplane_node.fetch.fetching import shown
from tuneplane_node.fetch.ociregistry import OciRegistry, by_digest, is_oci
from tuneplane_node.jobs.volumes.fills import VolumeFills
from tuneplane_node.jobs.volumes.possession import PROOF_S
from tuneplane_node.references import ImageName
from tuneplane_node.runtime.facts import ImageInfo
from tuneplane_node.wire.values import RegistryAuth, Volume

log = logging.getLogger(__name__)
FIELD = "container.volumes"


class PrivateRule(Protocol):
    """What the sources use of the images' keeper (`jobs.images.ImageKeeper`)."""

    async def credentials_for(
        self, image: str, auth: RegistryAuth | None
    ) -> RegistryAuth | None: ...
    async def admit(self, image: str, info: ImageInfo, auth: RegistryAuth | None) -> None: ...
    async def before_pull(self, image: str, auth: RegistryAuth | None) -> None: ...
    async def pulled(
        self, image: str, info: ImageInfo | None, auth: RegistryAuth | None
    ) -> None: ...


@dataclass(frozen=True)
class Resolved:
    """Volumes as the store names them, and each OCI digest's credentials."""

    volumes: tuple[Volume, ...]
    auth: Mapping[str, RegistryAuth | None] = field(default_factory=dict)


def other_kind(volume: Volume, field: str, *, is_tree: bool) -> InvalidField:
    """A 422 for a source of one kind naming an entry of the other: a URL naming a
    registry volume's digest would skip the private rule that guards it (the registry's
    credentials), and a registry reference a file's would skip the possession rule."""
    kind = "a registry volume's directory" if is_tree else "a downloaded file"
    said = f"sha256:{volume.sha256} is {kind} in the volume store"
    return InvalidField(field, f"{said}: a source of the other kind cannot name it")


def info_of(volume: Volume) -> ImageInfo:
    """The resolved volume as the private record sees an image: its digest is its id."""
    repository = ImageName.parse(volume.source).repository
    return ImageInfo(f"sha256:{volume.sha256}", digests=(f"{repository}@sha256:{volume.sha256}",))


class VolumeSources:
    def __init__(
        self, registry: OciRegistry, fills: VolumeFills, *, images: PrivateRule | None = None
    ) -> None:
        self.registry = registry
        self.fills = fills  # the store's entries, their accesses and the proofs
        self.images = images  # None: no credentials, no private rule (tests of the store)

    async def resolved(
        self,
        volumes: Sequence[Volume],
        *,
        image: str | None = None,
        auth: RegistryAuth | None = None,
        field: str = FIELD,
    ) -> Resolved:
        """Each OCI volume by its digest, each URL as it is (its possession proved where
        the node holds its entry for another access); `ImageAccessDenied` for a private
        entry these credentials may not use; `VolumeAccessDenied` for a URL whose source
        did not prove it; `VolumeFillFailed` for a reference its registry does not
        resolve."""
        found: list[Volume] = []
        creds: dict[str, RegistryAuth | None] = {}
        if volumes:  # the store's salt, read (or made) in a thread: accesses are then pure
            await self.fills.io(self.fills.accesses.load)
        for i, volume in enumerate(volumes):
            if not is_oci(volume.source):
                await self._possessed(volume, f"{field}[{i}]" if field else "source")
                found.append(volume)
                continue
            given = await self._credentials(volume.source, image, auth)
            resolved = await self._resolved(volume, given)
            creds[resolved.sha256] = given
            found.append(resolved)
        return Resolved(tuple(found), creds)

    async def _possessed(self, volume: Volume, field: str) -> None:
        """Return when the entry is missing (a fill makes it), recorded for this URL, or
        its source proved it holds its bytes (recorded now); left to a fill's proof when
        the source answers ranges with the whole file; else `VolumeAccessDenied` (a 422
        naming ``field`` where the entry is a registry volume's)."""
        fills, digest = self.fills, volume.sha256
        entry = await fills.entry(digest)
        access = fills.accesses.of(volume.source)
        if entry is not None and await fills.io(entry.path.is_dir):
            raise other_kind(volume, field, is_tree=True)
        if entry is None or await fills.io(fills.accesses.holds, digest, access):
            return
        try:
            proof = await fills.possession.ranged(volume.source, entry)
        except VolumeFillFailed as exc:
            raise VolumeAccessDenied(
                digest=digest, source=shown(volume.source),
                reason=f"its source did not show it holds the bytes: {exc.reason}",
            ) from None  # fmt: skip
        except asyncio.TimeoutError:
            raise VolumeAccessDenied(
                digest=digest, source=shown(volume.source),
                reason=f"its source did not answer the node's ranges within {PROOF_S:g} s",
            ) from None  # fmt: skip
        if proof is False:
            raise VolumeAccessDenied(
                digest=digest, source=shown(volume.source),
                reason="its source serves other bytes than the node holds for that sha256",
            )  # fmt: skip
        if proof:
            await fills.io(fills.accesses.record, digest, access)
            log.info("volume sha256:%s: %s proved it holds the bytes", digest, shown(volume.source))

    async def _credentials(
        self, source: str, image: str | None, auth: RegistryAuth | None
    ) -> RegistryAuth | None:
        registry = ImageName.parse(source).registry
        own = auth if image is not None and ImageName.parse(image).registry == registry else None
        if self.images is None:
            return own
        return await self.images.credentials_for(source, own)

    async def _present(self, digest: str) -> bool:
        return await self.fills.entry(digest) is not None

    async def _resolved(self, volume: Volume, auth: RegistryAuth | None) -> Volume:
        digest = volume.sha256
        here = bool(digest) and await self._present(digest)
        if not here and not ImageName.parse(volume.source).by_digest:
            async with self.fills.fetcher.session() as http:
                named = await self.registry.resolve(http, volume.source, auth)
            if digest and named != digest:
                reason = f"its tag names sha256:{named}, not the sha256:{digest} asked"
                raise VolumeFillFailed(source=volume.source, reason=reason)
            digest, here = named, await self._present(named)
        resolved = Volume(by_digest(volume.source, digest), volume.path, digest)
        if self.images is not None and here:
            await self.images.admit(volume.source, info_of(resolved), auth)
        elif self.images is not None:
            await self.images.before_pull(volume.source, auth)  # no record, no fill
        return resolved

    async def pulled(
        self, volumes: Sequence[Volume], auth: Mapping[str, RegistryAuth | None]
    ) -> None:
        """The private record told of the OCI volumes just filled, as of a pull."""
        if self.images is None:
            return
        for volume in volumes:
            if is_oci(volume.source):
                await self.images.pulled(volume.source, info_of(volume), auth.get(volume.sha256))
