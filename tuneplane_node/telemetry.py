"""Telemetry: what the layers below the daemon report as it happens.

The runtime's thread pool reports every engine call, the pull coordinator every pull,
the image GC every run and every image it removes, the disk monitor every walk, the
volume store every byte it fetches, every entry it hands a job and every eviction.
This base class does nothing with it; the daemon's `Metrics` overrides it to feed
Prometheus, so nothing below ``daemon/`` knows the metrics library.
"""

from __future__ import annotations


class Telemetry:
    def engine_call(self, call: str, seconds: float, *, failed: bool) -> None:
        """One blocking engine call ended (``call``: the SDK function's name)."""

    def pull_finished(self, outcome: str, seconds: float, bytes_done: int) -> None:
        """One image pull ended: ``ok``, ``failed`` or ``cancelled``."""

    def image_gc_run(self) -> None:
        """One image GC run ended."""

    def image_removed(self, image: str, image_id: str, size_bytes: int, why: str) -> None:
        """The image GC removed an image (its audit line, and the counts)."""

    def disk_walked(self, seconds: float) -> None:
        """The disk monitor walked one job's writable layer and volumes."""

    def volume_fetched(self, size_bytes: int) -> None:
        """A volume fill downloaded these bytes."""

    def volume_served(self, size_bytes: int) -> None:
        """A job was handed an entry of the volume store of this size (bound, not fetched)."""

    def volume_evicted(self, digest: str, size_bytes: int) -> None:
        """Eviction removed an entry of the volume store of this size."""


NO_TELEMETRY = Telemetry()
