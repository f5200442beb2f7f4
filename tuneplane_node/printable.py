"""Text from others (a registry's error, a job's reason, an engine's words) made safe to
print on an operator's terminal: every C0 and C1 control character written as an
escape (``\\x1b``), so no answer or log line can set a window title, clear the screen,
write the clipboard (OSC 52) or forge a line of its own.
"""

from __future__ import annotations

import re

CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with each control character as ``\\xNN`` (newline and tab too: a line
    of the log or a cell of a table stays one)."""
    return CONTROLS.sub(lambda match: f"\\x{ord(match.group()):02x}", text)
