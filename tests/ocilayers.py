"""Layers for OCI volume tests: tarballs made in memory, hostile ones included."""

from __future__ import annotations

import gzip
import io
import tarfile
from dataclasses import dataclass


@dataclass(frozen=True)
class Item:
    """One tar entry: ``kind`` one of file, dir, symlink, link, char, fifo."""

    name: str
    data: bytes = b""
    kind: str = "file"
    target: str = ""  # a link's
    mode: int = 0o644


KINDS = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "link": tarfile.LNKTYPE,
    "char": tarfile.CHRTYPE,
    "fifo": tarfile.FIFOTYPE,
}


def tarball(*items: Item, gzipped: bool = True) -> bytes:
    """A layer of ``items``, in order, gzip'd unless told."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for item in items:
            info = tarfile.TarInfo(item.name)
            info.type = KINDS[item.kind]
            info.mode = item.mode
            info.linkname = item.target
            info.size = len(item.data) if item.kind == "file" else 0
            tar.addfile(info, io.BytesIO(item.data) if item.kind == "file" else None)
    return gzip.compress(raw.getvalue(), mtime=0) if gzipped else raw.getvalue()


def file(name: str, data: bytes | str = b"x", mode: int = 0o644) -> Item:
    return Item(name, data.encode() if isinstance(data, str) else data, mode=mode)
