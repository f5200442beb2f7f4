"""The process runtime's logs: the stamper that writes them, and reading them back.

A job's stdout and stderr go through a pipe to the stamper, which appends each line to
``output.log`` prefixed with the RFC 3339 nanosecond time it arrived, as an engine's
timestamps would. Reads go backwards from the end, so a huge log costs no more than
the answer.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from tuneplane_node.clock import parse_rfc3339
from tuneplane_node.runtime.base import LogQuery, LogText

TAIL_CHUNK = 64 * 1024
"""The most one read of the log takes: a step of a tail, or what a follow reads on."""

# Reads the job's merged stdout/stderr from a pipe and appends each line, stamped with
# the time it arrived, to the log (its stdout). It is a process of its own, in a session
# of its own, so it survives a daemon restart and a stop of the job's group, and ends
# when the last writer closes the pipe.
STAMPER = """\
import sys, time
src, out = sys.stdin.buffer, sys.stdout.buffer
while True:
    line = src.readline(65536)
    if not line:
        break
    ns = time.time_ns()
    head = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9))
    out.write(b"%s.%09dZ %s" % (head.encode(), ns % 10**9, line))
    if not line.endswith(b"\\n"):
        out.write(b"\\n")
    out.flush()
"""


def tail(path: Path, query: LogQuery) -> LogText:
    """The last lines, read backwards, so a huge log costs no more than the answer."""
    return tail_at(path, query)[0]


def read_at(path: Path, offset: int) -> bytes:
    """At most a tail chunk of the log from ``offset`` on; none when there is no log."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read(TAIL_CHUNK)
    except FileNotFoundError:
        return b""


def tail_at(path: Path, query: LogQuery) -> tuple[LogText, int]:
    """`tail`, and the offset of the log's end it read up to (a follow reads on there)."""
    end = 0
    try:
        with path.open("rb") as file:
            position = end = file.seek(0, os.SEEK_END)
            data = b""
            while position > 0 and data.count(b"\n") <= query.tail:
                if len(data) > query.max_bytes:
                    break  # the cap is reached: older lines would be cut anyway
                step = min(TAIL_CHUNK, position)
                position -= step
                file.seek(position)
                data = file.read(step) + data
    except FileNotFoundError:
        return LogText(""), 0
    lines = data.splitlines(keepends=True)
    if position > 0:
        lines = lines[1:]  # it may have begun before what was read
    lines = [line for line in lines[max(0, len(lines) - query.tail) :] if _since(line, query.since)]
    return _capped(lines, query.max_bytes), end


def _since(line: bytes, since: datetime | None) -> bool:
    stamp = parse_rfc3339(line.partition(b" ")[0].decode("ascii", "replace"))
    return since is None or stamp is None or stamp >= since


def _capped(lines: list[bytes], max_bytes: int) -> LogText:
    """The newest lines within ``max_bytes``; the front of a longer last line is cut."""
    kept: list[bytes] = []
    size, truncated = 0, False
    for line in reversed(lines):
        if size + len(line) > max_bytes:
            truncated = True
            kept.append(line[len(line) - (max_bytes - size) :])  # its newest part
            break
        kept.append(line)
        size += len(line)
    return LogText(b"".join(reversed(kept)).decode("utf-8", "replace"), truncated)
