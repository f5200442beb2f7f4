"""PullRate: a pull's download rate and time left, from its progress reports.

The rate is the bytes downloaded over the last `WINDOW_S` seconds (a sliding window:
the oldest report inside it, or the last one before it, against the newest), measured up
to the moment asked, so a stalled pull's rate falls towards 0 instead of holding its last
burst. Unknown (None) until the pull has run `MIN_SPAN_S`: a rate over a few
milliseconds says nothing. The time left is the bytes still to come at that rate; the
engines announce layers as they go, so it grows when a layer is announced.
"""

from __future__ import annotations

from collections import deque

WINDOW_S = 10.0
MIN_SPAN_S = 1.0


class PullRate:
    """Reports of (monotonic time, bytes done), the newest `WINDOW_S` of them kept."""

    def __init__(self, started: float) -> None:
        self._reports: deque[tuple[float, int]] = deque([(started, 0)])

    def add(self, now: float, bytes_done: int) -> None:
        self._reports.append((now, bytes_done))
        # Keep one report at or before the window's start: the baseline.
        while len(self._reports) > 2 and self._reports[1][0] <= now - WINDOW_S:
            self._reports.popleft()

    def rate(self, now: float) -> float | None:
        """Bytes per second over the window ending now; None while unknown."""
        first, last = self._reports[0], self._reports[-1]
        for report in self._reports:  # the baseline: the last report before the window
            if report[0] > now - WINDOW_S:
                break
            first = report
        span = now - first[0]
        if span < MIN_SPAN_S:
            return None
        return round(max(last[1] - first[1], 0) / span, 1)

    def eta(self, now: float, *, bytes_done: int, bytes_total: int) -> float | None:
        """Seconds until ``bytes_total`` at the rate now; None while the rate is unknown or
        0, or no size is known yet."""
        rate = self.rate(now)
        if not rate or bytes_total <= 0:
            return None
        return round(max(bytes_total - bytes_done, 0) / rate, 1)
