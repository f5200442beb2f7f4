"""VolumeStore: the entries on disk, by digest, and the partial files of their fills.

``<root>/sha256/<hex>``: a complete entry, its bytes checked against its name, mode
0444; ``<root>/partial/<key>``: a fill in progress, kept across a restart so the next
fill of the same access resumes from its end. A partial file's key is its digest and the
access that writes it (`partial_key`): two fills of one digest from two sources never
share bytes, and a fill never resumes what another source left. An entry appears only
by a link (a rename, for a directory) of its partial file once its digest matched: no
reader ever sees one half-written, and the first of two fills to finish makes it. An
OCI volume's entry is a directory named by its manifest's digest, unpacked under
``partial/<key>.d`` (its layer blobs beside it as ``partial/<key>.<layer hex>``) and
renamed in once every layer was checked and unpacked. Every method blocks (the fills
call them in their own threads).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import threading
from pathlib import Path

from tuneplane_node.jobs.words.volumes import Entry, Hasher

ENTRIES, PARTIAL, TRASH = "sha256", "partial", "evicted"
READ = 4 * 2**20


class VolumeStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._tree_sizes: dict[str, int] = {}  # a directory entry's bytes: it never changes
        self._trees: dict[str, threading.RLock] = {}  # held while a digest's tree is written
        # One more at every entry made or taken out: a reading of the store is kept only
        # while it holds (`VolumeKeeper.reading`).
        self.generation = 0

    def tree_lock(self, key: str) -> threading.RLock:
        """Held around every write of the unpacked tree of ``key`` (`partial_key`): a
        cancelled fill's thread may still be unpacking a layer when the next fill of it
        starts afresh."""
        return self._trees.setdefault(key, threading.RLock())

    def entry(self, digest: str) -> Entry | None:
        """The complete entry of ``digest``; None while it is not."""
        path = self.root / ENTRIES / digest
        try:
            found = path.lstat()
        except FileNotFoundError:
            return None
        size = found.st_size
        if stat.S_ISDIR(found.st_mode):
            if digest not in self._tree_sizes:
                self._tree_sizes[digest] = tree_bytes(path)
            size = self._tree_sizes[digest]
        return Entry(digest, size, path, found.st_mtime)

    def entries(self) -> list[Entry]:
        """Every complete entry."""
        found = (self.entry(path.name) for path in self._listed(ENTRIES))
        return [entry for entry in found if entry is not None]

    def partial(self, key: str) -> Path:
        """The partial file of ``key`` (`partial_key`; its directories made)."""
        (self.root / PARTIAL).mkdir(mode=0o700, parents=True, exist_ok=True)
        return self.root / PARTIAL / key

    def resume(self, key: str) -> tuple[int, Hasher]:
        """Bytes the partial file holds and their hash so far: where a fill resumes."""
        hasher = hashlib.sha256()
        try:
            with self.partial(key).open("rb") as partial:
                while block := partial.read(READ):
                    hasher.update(block)
                return partial.tell(), hasher
        except FileNotFoundError:
            return 0, hasher

    def unpacking(self, key: str) -> Path:
        """An empty directory the layers of ``key``'s fill are unpacked into (what an
        interrupted fill left there gone: its layers are unpacked again)."""
        target = self.partial(f"{key}.d")
        with self.tree_lock(key):
            _removed(target)
            target.mkdir(mode=0o755)
        return target

    def commit_tree(self, key: str, digest: str) -> Entry:
        """The unpacked directory of ``key``'s fill, every layer checked, renamed into
        the store as ``digest``; where another fill made it first, that entry (this
        tree goes)."""
        (self.root / ENTRIES).mkdir(mode=0o755, parents=True, exist_ok=True)
        target = self.root / ENTRIES / digest
        with self.tree_lock(key):
            try:
                os.rename(self.partial(f"{key}.d"), target)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                _removed(self.partial(f"{key}.d"))
        self.generation += 1
        entry = self.entry(digest)
        assert entry is not None  # made just now; only an eviction takes it
        return entry

    def commit(self, key: str, digest: str) -> Entry:
        """The partial file of ``key``, whose bytes matched ``digest``, made the entry,
        read-only: linked in, so where another fill made it first, that one stays."""
        partial = self.partial(key)
        (self.root / ENTRIES).mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(partial, 0o444)
        target = self.root / ENTRIES / digest
        with contextlib.suppress(FileExistsError):
            os.link(partial, target)
        partial.unlink()
        self.generation += 1
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
        self._tree_sizes.pop(digest, None)
        self.generation += 1
        return target

    @staticmethod
    def removed(taken: Path) -> None:
        """A taken-out entry's bytes freed (a job that bound it keeps its inode)."""
        _removed(taken)

    def empty_trash(self) -> None:
        """The entries taken out but not yet removed (a daemon killed between the two)."""
        for path in self._listed(TRASH):
            self.removed(path)

    def used_bytes(self) -> int:
        """Bytes of the store's entries and partial files."""
        total = sum(entry.size for entry in self.entries())
        for path in self._listed(PARTIAL):
            with contextlib.suppress(FileNotFoundError):  # committed meanwhile
                total += tree_bytes(path) if path.is_dir() else path.lstat().st_size
        return total

    def discard(self, key: str) -> None:
        """The partial file of ``key`` gone (its bytes were not the ones asked)."""
        self.partial(key).unlink(missing_ok=True)

    def discard_tree(self, key: str) -> None:
        """The unpacked directory and layer blobs of ``key``'s fill gone (a layer was
        not the one its manifest named, or not safe to unpack)."""
        for path in self._listed(PARTIAL):
            if path.name.startswith(f"{key}."):
                _removed(path)

    def discard_others(self, digest: str, keep: set[str]) -> None:
        """Every partial file of ``digest`` but those of the keys in ``keep`` (the fills
        under way) gone: another source's bytes are never resumed, and an earlier
        release's (named by the digest alone) were written by nobody known."""
        for path in self._listed(PARTIAL):
            key = path.name.split(".", 1)[0]
            if key.split("~", 1)[0] == digest and key not in keep:
                with self.tree_lock(key):
                    _removed(path)

    def partials(self, writing: set[str]) -> list[Entry]:
        """The partial files (and unpacked trees) no fill is writing now (``writing``:
        the keys of those under way), each as an `Entry` of its bytes and last write."""
        found = []
        for path in self._listed(PARTIAL):
            if path.name.split(".", 1)[0] in writing:
                continue
            with contextlib.suppress(FileNotFoundError):
                stamp = path.lstat()
                size = tree_bytes(path) if path.is_dir() else stamp.st_size
                found.append(Entry(path.name, size, path, stamp.st_mtime))
        return found

    def _listed(self, name: str) -> list[Path]:
        """The files and directories (never a link) under ``name``."""
        try:
            found = os.scandir(self.root / name)
        except FileNotFoundError:
            return []
        with found:
            return sorted(
                Path(each.path)
                for each in found
                if each.is_file(follow_symlinks=False) or each.is_dir(follow_symlinks=False)
            )


def tree_bytes(path: Path) -> int:
    """The bytes of the regular files under ``path`` (links not followed)."""
    total = 0
    for top, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                found = os.lstat(os.path.join(top, name))
                total += found.st_size if stat.S_ISREG(found.st_mode) else 0
    return total


def _removed(path: Path) -> None:
    """``path`` gone, a directory with all it holds (shutil's descriptor-based walk on
    Linux: no link inside redirects it)."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
