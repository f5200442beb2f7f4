"""The node's clocks and its one time format.

Everything that measures an interval (pull deadlines, record expiry, ages in health)
reads ``Clock.monotonic``; everything that dates an event for the console (reap ages,
RFC 3339 times) reads ``Clock.now``. The job service takes a clock as a constructor
argument, so a test moves time by hand instead of sleeping.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone


class Clock:
    """The system's clocks."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        """The current moment, in UTC."""
        return datetime.now(timezone.utc)


SYSTEM_CLOCK = Clock()
_FRACTION = re.compile(r"\.(\d+)")


def rfc3339(moment: datetime) -> str:
    """``2026-11-29T21:21:54.164779Z``: UTC, ``Z``, microseconds when there are any."""
    return moment.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def parse_rfc3339(value: str | None) -> datetime | None:
    """An engine timestamp (nanoseconds allowed); None for none, junk, or Go's zero time."""
    if not value or value.startswith("0001-01-01"):
        return None
    # Python takes at most microseconds, and 3.10 only 3 or 6 digits (docker drops
    # trailing zeros: ".5"): make the fraction exactly 6 digits.
    text = _FRACTION.sub(_six_digits, value.strip().replace("Z", "+00:00"))
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def normalise(value: str | None) -> str | None:
    """An engine timestamp in the node's format, or None."""
    moment = parse_rfc3339(value)
    return rfc3339(moment) if moment is not None else None


def _six_digits(match: re.Match[str]) -> str:
    return "." + match.group(1)[:6].ljust(6, "0")
