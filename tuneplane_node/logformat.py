"""How the node's log lines look: text for people (the default), JSON for log shippers.

A JSON line is one object: ``time``, ``level``, ``logger``, ``message`` and, where the
line is about a job, the facts passed as ``extra`` (`JOB_FIELDS`, and the audit fields).
Values are the record's own: a caller never passes a secret (the token is a SecretStr,
and requests are logged by field, never whole).
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any, TextIO

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
JOB_FIELDS = ("run_id", "ref", "image", "gpus")
AUDIT_FIELDS = ("action", "client", "subject", "result", "status", "reason")
IMAGE_FIELDS = ("image_id", "size_bytes", "why")  # an image the image GC removed
EXTRA_FIELDS = (*JOB_FIELDS, *AUDIT_FIELDS, *IMAGE_FIELDS)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
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
        return json.dumps(line, default=str, ensure_ascii=False)


def _bounded(value: object) -> object:
    if isinstance(value, str) and len(value) > MAX_FIELD_CHARS:
        return value[:MAX_FIELD_CHARS] + "..."
    if isinstance(value, tuple):
        return list(value)
    return value


def configure(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Set the root logger up once: this level, this format, to stderr."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
