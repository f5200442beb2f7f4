"""What a check finds: a level and one line saying what was found."""

from __future__ import annotations

OK, WARN, FAIL = "ok", "warn", "FAIL"
Finding = tuple[str, str]  # (level, "subject: what was found")
