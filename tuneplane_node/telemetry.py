"""Telemetry: what the layers below the daemon report as it happens.

The runtime's thread pool reports every engine call, the pull coordinator every pull.
This base class does nothing with it; the daemon's `Metrics` overrides it to feed
Prometheus, so nothing below ``daemon/`` knows the metrics library.
"""

from __future__ import annotations


class Telemetry:
    def engine_call(self, call: str, seconds: float, *, failed: bool) -> None:
        """One blocking engine call ended (``call``: the SDK function's name)."""

    def pull_finished(self, outcome: str, seconds: float, bytes_done: int) -> None:
        """One image pull ended: ``ok``, ``failed`` or ``cancelled``."""


NO_TELEMETRY = Telemetry()
