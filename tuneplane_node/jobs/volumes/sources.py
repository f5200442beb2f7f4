"""VolumeSources: a launch's OCI volumes resolved to the digests the store names them by,
with the credentials their registry gets and the private rule images keep.

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
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tuneplane_node.errors import VolumeFillFailed
from tuneplane_node.references import ImageName
from tuneplane_node.runtime.base import RegistryAuth, Volume
from tuneplane_node.runtime.facts import ImageInfo
from tuneplane_node.runtime.ociregistry import OciRegistry, by_digest, is_oci

Present = Callable[[str], Awaitable[bool]]


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


def info_of(volume: Volume) -> ImageInfo:
    """The resolved volume as the private record sees an image: its digest is its id."""
    repository = ImageName.parse(volume.source).repository
    return ImageInfo(f"sha256:{volume.sha256}", digests=(f"{repository}@sha256:{volume.sha256}",))


class VolumeSources:
    def __init__(self, registry: OciRegistry, *, images: PrivateRule | None = None) -> None:
        self.registry = registry
        self.images = images  # None: no credentials, no private rule (tests of the store)

    async def resolved(
        self,
        volumes: Sequence[Volume],
        *,
        present: Present,
        image: str | None = None,
        auth: RegistryAuth | None = None,
    ) -> Resolved:
        """Each OCI volume by its digest (URLs as they are); `ImageAccessDenied` for a
        private entry these credentials may not use; `VolumeFillFailed` for a reference
        its registry does not resolve."""
        found: list[Volume] = []
        creds: dict[str, RegistryAuth | None] = {}
        for volume in volumes:
            if not is_oci(volume.source):
                found.append(volume)
                continue
            given = await self._credentials(volume.source, image, auth)
            resolved = await self._resolved(volume, given, present)
            creds[resolved.sha256] = given
            found.append(resolved)
        return Resolved(tuple(found), creds)

    async def _credentials(
        self, source: str, image: str | None, auth: RegistryAuth | None
    ) -> RegistryAuth | None:
        registry = ImageName.parse(source).registry
        own = auth if image is not None and ImageName.parse(image).registry == registry else None
        if self.images is None:
            return own
        return await self.images.credentials_for(source, own)

    async def _resolved(
        self, volume: Volume, auth: RegistryAuth | None, present: Present
    ) -> Volume:
        digest = volume.sha256
        here = bool(digest) and await present(digest)
        if not here and not ImageName.parse(volume.source).by_digest:
            named = await self.registry.resolve(volume.source, auth)
            if digest and named != digest:
                reason = f"its tag names sha256:{named}, not the sha256:{digest} asked"
                raise VolumeFillFailed(source=volume.source, reason=reason)
            digest, here = named, await present(named)
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
