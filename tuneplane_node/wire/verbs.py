"""The requests of the other verbs (the launch's are in `requests`, the image and volume
verbs' in `images` and `volumes`): observe, stop, signal, remove, reap, logs, the jobs
list and its watch, and the node's cordon, drain and uncordon. Each verb's parser reads
its body or query whole: its unknown fields and every bad one refused in one 422.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from tuneplane_node.clock import parse_rfc3339
from tuneplane_node.errors import (
    INVALID,
    MISSING,
    OUT_OF_RANGE,
    REPEATED,
    InvalidCursor,
    InvalidField,
)
from tuneplane_node.wire.fields import (
    EMPTY,
    Body,
    Field,
    Refusals,
    either,
    number,
    or_empty,
    or_null,
    text,
)
from tuneplane_node.wire.readers import (
    MAX_NUMBER_TEXT,
    NUMBER_TEXT,
    SIGNAL,
    SIGNALS_DOC,
    parse_signal,
    read_body,
    read_text,
)
from tuneplane_node.wire.values import DEFAULT_WAIT_S, MAX_WAIT_S, Cursor, StopPlan

MAX_REFS = 10_000
MAX_REF = 300
MAX_TAIL = 100_000
DEFAULT_TAIL = 2000
MAX_GRACE_S = 30 * 86400.0
"""The longest stop grace period a console may ask for: 30 days."""
MAX_REASON = 1024
MAX_AGE_S = 3650 * 86400.0
"""The oldest reap age a console may give: 10 years."""
MAX_EPOCH = 253402300799.0  # 9999-12-31T23:59:59Z: datetime's last second
REF = text(most=MAX_REF, least=1)


def parse_observe(body: Mapping[str, Any]) -> list[str]:
    (refs,) = read_body(body, REFS, parse_refs)
    return refs  # type: ignore[no-any-return]


def parse_stop_body(body: Mapping[str, Any]) -> tuple[str, StopPlan]:
    """A stop's ``ref`` and how to stop it."""
    ref, plan = read_body(body, STOP, parse_ref, parse_stop)
    return ref, plan


def parse_signal_body(body: Mapping[str, Any]) -> tuple[str, str]:
    """The signal verb's ``ref`` and the signal's name."""
    ref, sent = read_body(body, SIGNAL_BODY, parse_ref, parse_sent_signal)
    return ref, sent


def parse_remove(body: Mapping[str, Any]) -> str:
    (ref,) = read_body(body, REF_BODY, parse_ref)
    return ref  # type: ignore[no-any-return]


def parse_reap(body: Mapping[str, Any]) -> float | None:
    (max_age,) = read_body(body, REAP, parse_max_age)
    return max_age  # type: ignore[no-any-return]


def parse_cordon(body: Mapping[str, Any]) -> str | None:
    (reason,) = read_body(body, CORDON, parse_reason)
    return reason  # type: ignore[no-any-return]


def parse_drain(body: Mapping[str, Any]) -> tuple[str | None, StopPlan]:
    """A drain's ``reason`` and how it stops every job."""
    reason, plan = read_body(body, DRAIN, parse_reason, parse_drain_plan)
    return reason, plan


def parse_uncordon(body: Mapping[str, Any]) -> None:
    read_body(body, UNCORDON)


def parse_reset_breaker(body: Mapping[str, Any]) -> None:
    read_body(body, RESET_BREAKER)


def parse_logs(pairs: Iterable[tuple[str, str]]) -> tuple[str, int, datetime | None, bool]:
    """The logs query: ``ref``, ``tail``, ``since``, ``follow``."""
    with Refusals() as refusals:
        query = _query(pairs, LOGS, refusals)
        ref = refusals.read(parse_ref, query)
        tail = refusals.read(parse_tail, query.get("tail"))
        since = refusals.read(parse_since, query.get("since"))
        follow = refusals.read(parse_follow, query.get("follow"))
    return ref, tail, since, follow


def parse_refs(body: Mapping[str, Any]) -> list[str]:
    refs = body.get("refs")
    if not isinstance(refs, list) or not all(
        isinstance(ref, str) and 0 < len(ref) <= MAX_REF for ref in refs
    ):
        problem = MISSING if refs is None else INVALID
        why = f"required, a list of container names (1 to {MAX_REF} long)"
        raise InvalidField("refs", why, problem=problem)
    if len(refs) > MAX_REFS:
        raise InvalidField("refs", f"at most {MAX_REFS} per call", problem=OUT_OF_RANGE)
    return refs


def parse_query(pairs: Iterable[tuple[str, str]], query: Body) -> dict[str, str]:
    """A query's parameters, each at most once (``tail=5&tail=9`` has no one meaning: a
    proxy and the node could each read another), none but ``query``'s."""
    with Refusals() as refusals:
        found = _query(pairs, query, refusals)
    return found


def _query(pairs: Iterable[tuple[str, str]], query: Body, refusals: Refusals) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, value in pairs:
        if name not in query.names:
            refusals.unknown({name: value}, query)
        elif name in found:
            refusals.refuse(InvalidField(name, "given more than once", problem=REPEATED))
        found.setdefault(name, value)
        if refusals.full:
            break
    return found


def parse_ref(body: Mapping[str, Any]) -> str:
    return read_text(body, "ref", required=True, limit=MAX_REF)


def parse_seconds(body: Mapping[str, Any], field: str, *, most: float) -> float | None:
    value = body.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidField(field, "must be a number of seconds")
    if not (isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= most:
        raise InvalidField(field, f"must be from 0 to {most:g} seconds", problem=OUT_OF_RANGE)
    return float(value)


def parse_grace(body: Mapping[str, Any]) -> float | None:
    """A stop's ``timeout``: seconds between SIGTERM and SIGKILL."""
    return parse_seconds(body, "timeout", most=MAX_GRACE_S)


def parse_reason(body: Mapping[str, Any]) -> str | None:
    """A cordon's or drain's ``reason``, as the operator wrote it; none: None."""
    return read_text(body, "reason", limit=MAX_REASON) or None


def parse_drain_grace(body: Mapping[str, Any]) -> float | None:
    """A drain's ``grace_s``: seconds between SIGTERM and SIGKILL for every job."""
    return parse_seconds(body, "grace_s", most=MAX_GRACE_S)


def parse_max_age(body: Mapping[str, Any]) -> float | None:
    """A reap's ``max_age_s``."""
    return parse_seconds(body, "max_age_s", most=MAX_AGE_S)


def parse_stop(body: Mapping[str, Any]) -> StopPlan:
    """A stop's ``timeout``, ``signal`` and warning (``warn_signal``, ``warn_s``)."""
    with Refusals() as refusals:
        grace = refusals.read(parse_grace, body)
        signal = refusals.read(parse_signal, body, "signal")
        warning = refusals.read(_warning, body)
    return StopPlan(grace=grace, signal=signal, **warning)


def parse_drain_plan(body: Mapping[str, Any]) -> StopPlan:
    """How a drain stops every job: its ``grace_s`` and warning."""
    with Refusals() as refusals:
        grace = refusals.read(parse_drain_grace, body)
        warning = refusals.read(_warning, body)
    return StopPlan(grace=grace, **warning)


def parse_sent_signal(body: Mapping[str, Any]) -> str:
    """The signal verb's ``signal``, which it needs."""
    name = parse_signal(body, "signal")
    if name is None:
        raise InvalidField("signal", f"required: {SIGNALS_DOC}", problem=MISSING)
    return name


def _warning(body: Mapping[str, Any]) -> dict[str, Any]:
    with Refusals() as refusals:
        warn_signal = refusals.read(parse_signal, body, "warn_signal")
        warn_s = refusals.read(parse_seconds, body, "warn_s", most=MAX_GRACE_S)
        if warn_s is not None and body.get("warn_signal") in (None, ""):
            why = "needs warn_signal: the signal to warn the job with"
            refusals.refuse(InvalidField("warn_s", why, problem=MISSING))
    return {"warn_signal": warn_signal, "warn_s": warn_s}


# ``since`` as a time: a date, then a time of day and a zone if any (RFC 3339's, and the
# date and naive forms Python's isoformat() writes, which clients send).
TIME_TEXT = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"(?:[Tt ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,9})?)?(?:Z|[+-][0-9]{2}:[0-9]{2})?)?"
)


def parse_since(value: str | None) -> datetime | None:
    """``since``: an RFC 3339 time, or seconds since the epoch (``1.7e9`` too); none: the
    whole log. The forms are the document's pattern (`SINCE_SCHEMA`), checked first."""
    if value is None or value == "":
        return None
    moment = None
    if len(value) <= MAX_NUMBER_TEXT and NUMBER_TEXT.fullmatch(value):
        moment = datetime.fromtimestamp(min(float(value), MAX_EPOCH), tz=timezone.utc)
    elif TIME_TEXT.fullmatch(value):
        moment = parse_rfc3339(value)
    if moment is None:
        raise InvalidField("since", "must be an RFC 3339 time or seconds since the epoch")
    return moment


SINCE_SCHEMA = text(
    most=MAX_NUMBER_TEXT, pattern=f"^(?:{NUMBER_TEXT.pattern}|{TIME_TEXT.pattern})?$"
)


FOLLOW_WORDS = {"1": True, "true": True, "0": False, "false": False}


def parse_follow(value: str | None) -> bool:
    """``follow``: stream the log until the job exits; absent or empty: no."""
    if value is None or value == "":
        return False
    if value.lower() not in FOLLOW_WORDS:
        raise InvalidField("follow", "must be 1, true, 0 or false")
    return FOLLOW_WORDS[value.lower()]


def parse_tail(value: str | None) -> int:
    if value is None or value == "":
        return DEFAULT_TAIL
    # isascii: "²" is a digit to str.isdigit, and not a number to int().
    if not (value.isascii() and value.isdigit()) or not 1 <= int(value) <= MAX_TAIL:
        problem = OUT_OF_RANGE if value.isascii() and value.isdigit() else INVALID
        raise InvalidField("tail", f"must be a whole number from 1 to {MAX_TAIL}", problem=problem)
    return int(value)


def _seconds(name: str, *, most: float, doc: str) -> Field:
    """A field of seconds, from 0 to ``most``, or null."""
    bounds = f"0 to {most / 86400:g} days"
    return Field(name, or_null(number(least=0, most=most)), doc.format(bounds=bounds))


def _grace(name: str, *, jobs: str) -> Field:
    """A stop's grace period, ``name``, for ``jobs``."""
    doc = f"Seconds from the stop signal to SIGKILL for {jobs}, {{bounds}}; default "
    doc += "`TUNEPLANE_LOCAL_STOP_TIMEOUT`. Engines take whole seconds: it is rounded up."
    return _seconds(name, most=MAX_GRACE_S, doc=doc)


REF_FIELD = Field(
    "ref",
    REF,
    f"The container's name (its launch's `container.name`), 1 to {MAX_REF} characters.",
    required=True,
)
REFS_LIST = {
    "type": "array",
    "maxItems": MAX_REFS,
    "items": text(most=MAX_REF, least=1, pattern=None),
}
REFS_DOC = (
    f"Container names, at most {MAX_REFS} of 1 to {MAX_REF} characters; duplicates answered once."
)
REFS = Body("RefsBody", (Field("refs", REFS_LIST, REFS_DOC, required=True),))
REF_BODY = Body("RefBody", (REF_FIELD,))
WARNING = (
    Field(
        "warn_signal",
        or_empty(SIGNAL),
        f"A signal sent before the stop signal, for the job to checkpoint and end by "
        f"itself: {SIGNALS_DOC}. Absent: no warning. Sent only to a job that catches it "
        "(a process below its init has a handler): to one that does not, it would be "
        "the end at once, so that job gets its stop signal without the warning phase "
        "(observe: `warning skipped: not caught`).",
    ),
    _seconds(
        "warn_s",
        most=MAX_GRACE_S,
        doc="Seconds from `warn_signal` to the stop signal, {bounds}, if the job has not "
        "ended by then; default: as long as the grace period. Needs `warn_signal`.",
    ),
)
# `warn_s` given (a number) needs a `warn_signal` that is one: the parser's rule (`_warning`).
WARN_S_NEEDS_SIGNAL = {
    "if": {"required": ["warn_s"], "properties": {"warn_s": {"type": "number"}}},
    "then": {
        "required": ["warn_signal"],
        "properties": {"warn_signal": {"not": {"enum": ["", None]}}},
    },
}
STOP = Body(
    "StopBody",
    (
        REF_FIELD,
        _grace("timeout", jobs="the job"),
        Field(
            "signal",
            or_empty(SIGNAL),
            f"The stop signal for this stop: {SIGNALS_DOC}. Absent: the job's own "
            "(`container.stop_signal`, else the image's `STOPSIGNAL`, else `SIGTERM`).",
        ),
        *WARNING,
    ),
    rule=WARN_S_NEEDS_SIGNAL,
)
SIGNAL_BODY = Body(
    "SignalBody",
    (
        REF_FIELD,
        Field("signal", SIGNAL, f"The signal: {SIGNALS_DOC}.", required=True),
    ),
)
REAP = Body(
    "ReapBody",
    (
        _seconds(
            "max_age_s",
            most=MAX_AGE_S,
            doc="Seconds since a container ended for it to be removed, {bounds}; default "
            "`TUNEPLANE_LOCAL_CONTAINER_TTL_S`.",
        ),
    ),
)
REASON = Field(
    "reason",
    or_null(text(most=MAX_REASON)),
    f"Why, in the operator's words (at most {MAX_REASON} characters); health and a refused "
    "launch say it.",
)
CORDON = Body("CordonBody", (REASON,))
DRAIN = Body(
    "DrainBody",
    (
        REASON,
        _grace("grace_s", jobs="every job"),
        *WARNING,
    ),
    rule=WARN_S_NEEDS_SIGNAL,
)
UNCORDON = Body("UncordonBody", (), doc="Nothing is read from it.")
RESET_BREAKER = Body("ResetBreakerBody", (), doc="Nothing is read from it.")
LOGS = Body(
    "LogsQuery",
    (
        REF_FIELD,
        Field(
            "tail",
            {"anyOf": [number(least=1, most=MAX_TAIL, whole=True), EMPTY], "default": DEFAULT_TAIL},
            f"How many of the newest lines, 1 to {MAX_TAIL}; default {DEFAULT_TAIL}.",
        ),
        Field(
            "since",
            SINCE_SCHEMA,
            "Only lines from then on: an RFC 3339 time (`2026-12-01T13:23:04Z`; a date "
            "alone is its midnight, a time without a zone is UTC), or seconds since the "
            "epoch (`1764595384`, `1.7e9`).",
        ),
        Field(
            "follow",
            {"type": "string", "pattern": either(*FOLLOW_WORDS)},
            "`1` or `true`: stream `text/plain` until the job exits; `0`, `false` or absent: no.",
        ),
    ),
    doc="The query of GET /node/v1/logs.",
)


# --- the jobs list and its watch ------------------------------------------------------------

MAX_CURSOR = 40


def parse_jobs(pairs: Iterable[tuple[str, str]]) -> tuple[Cursor | None, float]:
    """The jobs query: its ``index`` (None: the list) and ``wait``, refused together."""
    with Refusals() as refusals:
        query = _query(pairs, JOBS, refusals)
        cursor = refusals.read(parse_index, query.get("index"))
        wait = refusals.read(parse_wait, query.get("wait"))
    return cursor, wait


def parse_index(value: str | None) -> Cursor | None:
    """``index``: the cursor of an earlier answer; absent or empty: the list itself."""
    if value is None or value == "":
        return None
    cursor = Cursor.read(value) if len(value) <= MAX_CURSOR else None
    if cursor is None:
        raise InvalidCursor("index")
    return cursor


def parse_wait(value: str | None) -> float:
    """``wait``: seconds a watch query may wait for a change, 0 to `MAX_WAIT_S`."""
    if value is None or value == "":
        return DEFAULT_WAIT_S
    number = len(value) <= MAX_NUMBER_TEXT and NUMBER_TEXT.fullmatch(value)
    seconds = float(value) if number else -1.0  # 1e1 and 10.0 as well as 10
    if not 0 <= seconds <= MAX_WAIT_S:
        raise InvalidField("wait", f"must be a number of seconds from 0 to {MAX_WAIT_S:g}")
    return seconds


JOBS = Body(
    "JobsQuery",
    (
        Field(
            "index",
            text(most=MAX_CURSOR, pattern="^(?:[0-9a-f]{16}-[0-9]{1,19})?$"),
            "The `index` of an earlier answer: answer what changed since (a blocking query). "
            "Absent or empty: every job. A cursor of an earlier daemon process, or older "
            "than the node's history (`TUNEPLANE_WATCH_HISTORY`), answers every job with "
            "`full: true`.",
        ),
        Field(
            "wait",
            {"anyOf": [number(least=0, most=MAX_WAIT_S), EMPTY], "default": DEFAULT_WAIT_S},
            f"With `index`: seconds to hold the query when nothing changed, 0 to "
            f"{MAX_WAIT_S:g}; default {DEFAULT_WAIT_S:g}. The node adds up to a sixteenth "
            "more at random, so a fleet's consoles do not ask again at once.",
        ),
    ),
    doc="The query of GET /node/v1/jobs.",
)
