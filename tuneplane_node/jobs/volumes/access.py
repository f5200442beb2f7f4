"""Accesses: how a request reaches a volume's bytes, and which accesses an entry was
handed to, so that what the node keeps goes only to a request that shows the same right.

An access is a salted hash (HMAC under the store's own salt: nothing of a secret is kept)
of what a request fetches with: a URL's whole text (a signed URL's query is its
credential), or an OCI volume's repository and its credentials' fingerprint (none:
anonymous). The fills are shared by one access only (`VolumeFills`), and a partial file
is resumed only by the access that wrote it (`store.partial_key`). An entry records
each access that filled it or proved it holds its bytes (`Possession`), in
``<root>/accesses/<hex>``, the newest `MAX_KEPT`: a launch naming an entry by an access
it records is bound at once, any other proves possession first.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
from pathlib import Path

from tuneplane_node import durable
from tuneplane_node.fetch.ociregistry import is_oci
from tuneplane_node.references import ImageName
from tuneplane_node.wire.values import RegistryAuth

SALT_FILE = "access.salt"
RECORDS = "accesses"
MAX_KEPT = 64  # accesses remembered per entry: a signed URL's every signature is one


class Accesses:
    """The store's salt and each entry's recorded accesses. Blocking: the fills call it
    in their threads (`of` reads the salt at its first call: `VolumeSources` loads it in
    a thread before any)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._salt: bytes | None = None
        self._kept: dict[str, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        """The salt, made at the store's first use and kept (accesses outlive restarts:
        a partial file is resumed by the access that wrote it)."""
        if self._salt is None:
            path = self.root / SALT_FILE
            self._salt = durable.create_once(path, secrets.token_bytes(32), mode=0o600)

    def of(self, source: str, auth: RegistryAuth | None = None) -> str:
        """The access of a request for ``source`` with ``auth`` (an OCI source's)."""
        self.load()
        assert self._salt is not None
        if is_oci(source):
            credential = "" if auth is None else auth.fingerprint(self._salt)
            material = f"oci\x00{ImageName.parse(source).repository}\x00{credential}"
        else:
            material = f"url\x00{source}"
        return hmac.new(self._salt, material.encode(), hashlib.sha256).hexdigest()

    def recorded(self, digest: str) -> tuple[str, ...]:
        """The accesses ``digest``'s entry was handed to, oldest first."""
        with self._lock:
            if digest not in self._kept:
                self._kept[digest] = self._read(digest)
            return self._kept[digest]

    def holds(self, digest: str, access: str) -> bool:
        return access in self.recorded(digest)

    def record(self, digest: str, access: str) -> None:
        """``access`` may be handed ``digest``'s entry from now on (written to disk)."""
        kept = self.recorded(digest)
        if access in kept:
            return
        newest = (*kept, access)[-MAX_KEPT:]
        durable.write_atomically(self._path(digest), "\n".join(newest).encode(), mode=0o600)
        with self._lock:
            self._kept[digest] = newest

    def forget(self, digest: str) -> None:
        """The entry is gone: so are the accesses it was handed to."""
        with self._lock:
            self._kept.pop(digest, None)
        self._path(digest).unlink(missing_ok=True)

    def _read(self, digest: str) -> tuple[str, ...]:
        try:
            text = self._path(digest).read_text()
        except FileNotFoundError:
            return ()
        return tuple(line for line in text.split("\n") if len(line) == 64)[-MAX_KEPT:]

    def _path(self, digest: str) -> Path:
        return self.root / RECORDS / digest
