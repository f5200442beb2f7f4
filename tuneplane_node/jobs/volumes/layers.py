"""The layers of an OCI volume unpacked into one directory, safe against hostile tarballs.

A layer is a customer's file: every name is checked (no absolute path, no ``..``, no
deeper than `MAX_DEPTH`), and the tree is written openat-style: each directory opened
from its parent's descriptor without following a link (``O_NOFOLLOW``), each file
created there (``O_EXCL``), so no link a layer made, inside or out, redirects a write.
Symlinks are kept as they are (the job reads them in its own mount namespace; the node
never follows one); a hard link must name a regular file the tree already holds; device
nodes and FIFOs are refused; setuid, setgid, sticky and group/other write bits are
dropped, every file readable and every directory 0755 (a job runs as any user). OCI
whiteouts apply in layer order: ``.wh.<name>`` removes ``<name>`` of the layers below,
``.wh..wh..opq`` everything below in its directory. Entries and bytes are bounded
(`Budget`). Blocking: the fills run it in their threads.
"""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_Make = Callable[[int, str], None]  # makes the entry ``name`` under the directory ``at``

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
WHITEOUT, OPAQUE = ".wh.", ".wh..wh..opq"
MAX_DEPTH = 256
COPY = 4 * 2**20
GZIP, ZSTD = b"\x1f\x8b", b"\x28\xb5\x2f\xfd"


class HostileLayer(ValueError):
    """A layer that cannot be unpacked safely, or past the volume's bounds: the reason."""


@dataclass
class Budget:
    """What the layers of one volume may still write: entries and bytes."""

    entries: int
    bytes: int
    given: tuple[int, int] = (0, 0)  # (entries, bytes) at first: what a refusal says

    def __post_init__(self) -> None:
        self.given = (self.entries, self.bytes)

    def spend(self, *, entries: int = 0, size: int = 0) -> None:
        self.entries -= entries
        self.bytes -= size
        if self.entries < 0:
            raise HostileLayer(
                f"its layers hold more entries than its budget of {self.given[0]} "
                "(taken from its manifest's size)"
            )
        if self.bytes < 0:
            raise HostileLayer(
                f"its layers unpack to more bytes than its budget of {self.given[1]} "
                "(taken from its manifest's size)"
            )


@dataclass
class _Layer:
    root: int  # the directory's descriptor
    budget: Budget
    made: set[tuple[str, ...]] = field(default_factory=set)  # this layer's own paths


def unpack(blob: Path, into: Path, budget: Budget) -> None:
    """The layer ``blob`` (a tar, gzip'd or not) unpacked over the directory ``into``."""
    with blob.open("rb") as raw:
        magic = raw.read(4)
        raw.seek(0)
        if magic.startswith(ZSTD):
            raise HostileLayer("a zstd layer is not served (gzip or plain tar only)")
        gzipped = magic.startswith(GZIP)
        root = os.open(into, DIRECTORY)
        try:
            with tarfile.open(fileobj=raw, mode="r|gz" if gzipped else "r|") as tar:
                layer = _Layer(root, budget)
                for member in tar:
                    layer.budget.spend(entries=1)
                    _apply(layer, tar, member)
        except (tarfile.TarError, EOFError) as exc:
            raise HostileLayer(f"a layer is not a readable tar ({exc})") from None
        finally:
            os.close(root)


def _parts(name: str) -> tuple[str, ...]:
    if name.startswith("/"):
        raise HostileLayer(f"an absolute path in a layer: {name[:200]!r}")
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    if ".." in parts:
        raise HostileLayer(f"a '..' in a layer's path: {name[:200]!r}")
    if len(parts) > MAX_DEPTH:
        raise HostileLayer(f"a path deeper than {MAX_DEPTH} in a layer")
    return parts


def _apply(layer: _Layer, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
    parts = _parts(member.name)
    if not parts:
        return  # the layer's root itself
    base = parts[-1]
    if base == OPAQUE:
        _opaque(layer, parts[:-1])
    elif base.startswith(WHITEOUT):
        _whiteout(layer, (*parts[:-1], base[len(WHITEOUT) :]))
    elif member.isdir():
        if parts not in layer.made:  # a lower layer's file or link there: replaced
            _whiteout(layer, parts, keep_directory=True)
        os.close(_directory(layer, parts, readable=True))
    elif member.isreg():
        _file(layer, tar, member, parts)
    elif member.issym():
        _replaced(layer, parts, lambda at, name: os.symlink(member.linkname, name, dir_fd=at))
    elif member.islnk():
        _hardlink(layer, parts, _parts(member.linkname))
    else:
        raise HostileLayer(f"a device node or FIFO in a layer: {member.name[:200]!r}")
    layer.made.add(parts)


def _directory(layer: _Layer, parts: tuple[str, ...], *, readable: bool = False) -> int:
    """The directory ``parts`` opened (made where missing), never through a link;
    ``readable``: mode 0755, whatever the layer said (its files are every job user's)."""
    fd = os.dup(layer.root)
    try:
        for i, part in enumerate(parts):
            try:
                child = os.open(part, DIRECTORY, dir_fd=fd)
            except FileNotFoundError:
                os.mkdir(part, 0o755, dir_fd=fd)
                child = os.open(part, DIRECTORY, dir_fd=fd)
            except (NotADirectoryError, OSError) as exc:
                where = "/".join(parts[: i + 1])
                raise HostileLayer(f"a path through a link or a file: {where[:200]!r}") from exc
            os.close(fd)
            fd = child
        if readable:
            os.fchmod(fd, 0o755)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _replaced(layer: _Layer, parts: tuple[str, ...], make: _Make) -> None:
    """``make(parent fd, name)`` where whatever a lower layer had at ``parts`` went."""
    parent = _directory(layer, parts[:-1])
    try:
        _remove(parent, parts[-1])
        make(parent, parts[-1])
    finally:
        os.close(parent)


def _file(
    layer: _Layer, tar: tarfile.TarFile, member: tarfile.TarInfo, parts: tuple[str, ...]
) -> None:
    source = tar.extractfile(member)
    assert source is not None  # a regular file's
    mode = (member.mode & 0o755) | 0o444

    def make(at: int, name: str) -> None:
        fd = os.open(name, CREATE, 0o600, dir_fd=at)
        with os.fdopen(fd, "wb") as target:
            _copy(layer.budget, source, target)
            os.fchmod(target.fileno(), mode)

    _replaced(layer, parts, make)


def _copy(budget: Budget, source: IO[bytes], target: IO[bytes]) -> None:
    while block := source.read(COPY):
        budget.spend(size=len(block))
        target.write(block)


def _hardlink(layer: _Layer, parts: tuple[str, ...], target: tuple[str, ...]) -> None:
    if not target:
        raise HostileLayer("a hard link to the layer's root")
    held = _directory(layer, target[:-1])
    try:
        found = os.lstat(target[-1], dir_fd=held)
        if not stat.S_ISREG(found.st_mode):
            raise HostileLayer(f"a hard link to no regular file: {'/'.join(target)[:200]!r}")

        def make(at: int, name: str) -> None:
            os.link(target[-1], name, src_dir_fd=held, dst_dir_fd=at, follow_symlinks=False)

        _replaced(layer, parts, make)
    except FileNotFoundError:
        raise HostileLayer(f"a hard link to nothing: {'/'.join(target)[:200]!r}") from None
    finally:
        os.close(held)


def _whiteout(layer: _Layer, parts: tuple[str, ...], *, keep_directory: bool = False) -> None:
    """``parts`` of the lower layers gone (a whiteout never removes its own layer's);
    ``keep_directory``: unless it is a directory (a layer's directory entry over it)."""
    if parts in layer.made:
        return
    parent = _directory(layer, parts[:-1])
    try:
        if keep_directory and _is_directory(parent, parts[-1]):
            return
        _remove(parent, parts[-1])
    finally:
        os.close(parent)


def _is_directory(parent: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(name, dir_fd=parent).st_mode)
    except FileNotFoundError:
        return False


def _opaque(layer: _Layer, parts: tuple[str, ...]) -> None:
    """Everything the lower layers put in the directory ``parts`` gone."""
    fd = _directory(layer, parts)
    try:
        for name in os.listdir(fd):
            if (*parts, name) not in layer.made:
                _remove(fd, name)
    finally:
        os.close(fd)


def _remove(parent: int, name: str) -> None:
    """``name`` under ``parent`` gone, a directory with all it holds; nothing there is
    no error. Never follows a link."""
    try:
        found = os.lstat(name, dir_fd=parent)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(found.st_mode):
        os.unlink(name, dir_fd=parent)
        return
    fd = os.open(name, DIRECTORY, dir_fd=parent)
    try:
        for child in os.listdir(fd):
            _remove(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)
