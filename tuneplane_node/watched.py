"""FileStamp: whether a file the node re-reads (the token file, the registry auth file)
changed since it was last read. Compared by inode, size and mtime: an editor's rename,
an operator's rewrite and a truncation all change one of them."""

from __future__ import annotations

import os
from pathlib import Path

Stamp = tuple[int, int, int]  # (inode, size, mtime in ns)


class FileStamp:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._read: Stamp | None = None

    def now(self) -> Stamp | None:
        """The file's stamp now; None when it cannot be read."""
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        return stat.st_ino, stat.st_size, stat.st_mtime_ns

    def reading(self) -> None:
        """Note the stamp before a read: a change during the read is seen next time."""
        self._read = self.now()

    def changed(self) -> bool:
        """Blocking (a stat): call it off the loop."""
        return self.now() != self._read
