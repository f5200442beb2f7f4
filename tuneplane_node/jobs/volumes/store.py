"""VolumeStore: the entries on disk, by digest, and the partial files of their fills.

``<root>/sha256/<hex>``: a complete entry, its bytes checked against its name, mode
0444; ``<root>/partial/<hex>``: a fill in progress, kept across a restart so the next
fill resumes from its end. An entry appears only by a rename of its partial file once
its digest matched: no reader ever sees one half-written. Every method blocks (the
fills call them in their own threads).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

ENTRIES, PARTIAL, TRASH = "sha256", "partial", "evicted"
READ = 4 * 2**20


class Hasher(Protocol):
    """hashlib's sha256 object, as far as a fill uses it."""

    def update(self, data: bytes, /) -> None: ...
    def hexdigest(self) -> str: ...


@dataclass(frozen=True)
class Entry:
    digest: str  # hex
    size: int
    path: Path
    used_at: float = 0.0  # its last use (a job's bind, a prefetch): its mtime, epoch seconds


class VolumeStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def entry(self, digest: str) -> Entry | None:
        """The complete entry of ``digest``; None while it is not."""
        path = self.root / ENTRIES / digest
        try:
            found = path.stat()
        except FileNotFoundError:
            return None
        return Entry(digest, found.st_size, path, found.st_mtime)

    def entries(self) -> list[Entry]:
        """Every complete entry."""
        found = (self.entry(path.name) for path in self._listed(ENTRIES))
        return [entry for entry in found if entry is not None]

    def partial(self, digest: str) -> Path:
        """The partial file of ``digest``'s fill (its directories made)."""
        (self.root / PARTIAL).mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.root / PARTIAL / digest

    def resume(self, digest: str) -> tuple[int, Hasher]:
        """Bytes the partial file holds and their hash so far: where a fill resumes."""
        hasher = hashlib.sha256()
        try:
            with self.partial(digest).open("rb") as partial:
                while block := partial.read(READ):
                    hasher.update(block)
                return partial.tell(), hasher
        except FileNotFoundError:
            return 0, hasher

    def commit(self, digest: str) -> Entry:
        """The partial file, whose digest matched, renamed into the store, read-only."""
        partial = self.partial(digest)
        (self.root / ENTRIES).mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(partial, 0o444)
        target = self.root / ENTRIES / digest
        os.rename(partial, target)
        found = target.stat()
        return Entry(digest, found.st_size, target, found.st_mtime)

    def touch(self, digest: str) -> None:
        """The entry's last use now (its mtime); an entry gone meanwhile is no error."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.root / ENTRIES / digest)

    def take_out(self, digest: str) -> Path | None:
        """The entry out of the store at once (renamed away: no launch opens it from now
        on), to be `removed`; None when it was gone."""
        (self.root / TRASH).mkdir(mode=0o700, parents=True, exist_ok=True)
        target = self.root / TRASH / digest
        try:
            os.rename(self.root / ENTRIES / digest, target)
        except FileNotFoundError:
            return None
        return target

    @staticmethod
    def removed(taken: Path) -> None:
        """A taken-out entry's bytes freed (a job that bound it keeps its inode)."""
        taken.unlink(missing_ok=True)

    def empty_trash(self) -> None:
        """The entries taken out but not yet removed (a daemon killed between the two)."""
        for path in self._listed(TRASH):
            self.removed(path)

    def used_bytes(self) -> int:
        """Bytes of the store's entries and partial files."""
        total = 0
        for path in (*self._listed(ENTRIES), *self._listed(PARTIAL)):
            with contextlib.suppress(FileNotFoundError):  # evicted or committed meanwhile
                total += path.stat().st_size
        return total

    def discard(self, digest: str) -> None:
        """The partial file of ``digest`` gone (its bytes were not the ones asked)."""
        self.partial(digest).unlink(missing_ok=True)

    def _listed(self, name: str) -> list[Path]:
        try:
            return sorted(path for path in (self.root / name).iterdir() if path.is_file())
        except FileNotFoundError:
            return []
