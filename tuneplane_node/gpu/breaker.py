"""The circuit breaker on the cards the node takes out by itself.

A bad driver update, a flaky check or a firmware bug can make every card of a fleet read
faulty at once; a node that believed each one would take the fleet down by itself
(NVSentinel stops automatic quarantines past a rate for this). So at most
``TUNEPLANE_GPU_BREAKER_PER_HOUR`` cards are taken out automatically in any hour (a card
out, and the node cordoned for a card's fault, alike); past it the faulted cards are kept
in, reported (health, the ``tuneplane_node_gpu_breaker_*`` series, an error log line),
until an operator resets the breaker (``ctl gpus reset-breaker``: the count starts again,
the cards kept in stay in) or the node restarts.
Used on the event loop only.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from tuneplane_node.clock import Clock

log = logging.getLogger(__name__)
HOUR_S = 3600.0


@dataclass(frozen=True)
class BreakerState:
    """``limit`` per hour; ``taken``: cards taken out in the last hour; ``kept_in``: faults
    refused since the last reset (``tripped`` while any)."""

    limit: int
    taken: int
    kept_in: int

    @property
    def tripped(self) -> bool:
        return self.kept_in > 0


class CardBreaker:
    """Each fault (its key: the card, the scope, since when) decided once: taken out
    while the hour's count is under the limit, else kept in."""

    def __init__(self, per_hour: int, *, clock: Clock) -> None:
        self.per_hour = per_hour
        self.clock = clock
        self._taken: collections.deque[float] = collections.deque()  # monotonic times
        self._decided: dict[Hashable, bool] = {}
        self._waived: set[Hashable] = set()  # kept in, and the operator reset since
        self.resets = 0

    def admits(self, key: Hashable, what: str) -> bool:
        """Whether the fault ``key`` (``what``, for the log) may take its card out."""
        decided = self._decided.get(key)
        if decided is not None:
            return decided
        now = self.clock.monotonic()
        while self._taken and now - self._taken[0] >= HOUR_S:
            self._taken.popleft()
        admitted = len(self._taken) < self.per_hour
        if admitted:
            self._taken.append(now)
        else:
            log.error(
                "GPU circuit breaker: %s kept in: %d card(s) already taken out this hour "
                "(TUNEPLANE_GPU_BREAKER_PER_HOUR=%d); reset with `ctl gpus reset-breaker`",
                what, len(self._taken), self.per_hour,
            )  # fmt: skip
        self._decided[key] = admitted
        return admitted

    def keep_only(self, keys: Iterable[Hashable]) -> None:
        """Forget the decisions of faults that are over (the map stays bounded)."""
        live = set(keys)
        if len(live) < len(self._decided):
            self._decided = {k: v for k, v in self._decided.items() if k in live}
            self._waived &= live

    def reset(self) -> None:
        """The operator's word, having looked: the hour's count starts again, and the
        faults kept in stay in, no longer counted as the breaker's (a new fault of the
        same card is decided afresh)."""
        self._taken.clear()
        self._waived |= {key for key, admitted in self._decided.items() if not admitted}
        self.resets += 1
        log.warning("GPU circuit breaker reset")

    def state(self) -> BreakerState:
        now = self.clock.monotonic()
        taken = sum(1 for at in self._taken if now - at < HOUR_S)
        kept = sum(
            1 for key, admitted in self._decided.items() if not admitted and key not in self._waived
        )
        return BreakerState(self.per_hour, taken, kept)
