"""How the node's log lines look: text for people (the default), JSON for log shippers.

A JSON line is one object: ``time``, ``level``, ``logger``, ``message`` and, where the
line is about a job, the facts passed as ``extra`` (`JOB_FIELDS`, and the audit fields).
Values are the record's own: a caller never passes a secret (the token is a SecretStr,
and requests are logged by field, never whole).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import datetime, timezone
from typing import Any, TextIO

from tuneplane_node.printable import printable

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
JOB_FIELDS = ("run_id", "ref", "image", "gpus")
AUDIT_FIELDS = ("action", "client", "subject", "result", "status", "reason")
EXTRA_FIELDS = (*JOB_FIELDS, *AUDIT_FIELDS)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
C1 = re.compile(r"[\x7f-\x9f]")
MAX_FIELD_CHARS = 2000  # a hostile ref or detail cannot make one line huge


class JsonFormatter(logging.Formatter):
    """One JSON object per line; a line never spans two (newlines are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in EXTRA_FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                line[field] = _bounded(value)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        # JSON escapes C0 itself; C1 (U+0080..U+009F, CSI among them) and DEL it leaves.
        return C1.sub(_json_escape, json.dumps(line, default=str, ensure_ascii=False))


def _json_escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, the message's control characters escaped (`printable`): a line
    quotes an engine's, a registry's or a job's words, and whoever reads the log on a
    terminal must not get a registry's escapes, nor a line it forged with a newline.
    The traceback after it is the node's own."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = printable(record.message)
        return super().formatMessage(record)


def _bounded(value: object) -> object:
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return value[:MAX_FIELD_CHARS] + "..."
    if isinstance(value, tuple):
        return list(value)
    return value


def configure(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Set the root logger up once: this level, this format, to stderr."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
