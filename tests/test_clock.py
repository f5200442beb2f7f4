"""The node's time format: what the console reads in every state."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tuneplane_node.clock import normalise, parse_rfc3339, rfc3339


def test_engine_times_parse_with_nanoseconds_and_zero() -> None:
    moment = parse_rfc3339("2026-11-29T21:00:00.123456789Z")
    assert moment is not None and moment.microsecond == 123456
    assert parse_rfc3339("0001-01-01T00:00:00Z") is None  # Go's zero time: never happened
    assert parse_rfc3339("garbage") is None
    assert parse_rfc3339(None) is None and parse_rfc3339("") is None


def test_an_offset_is_kept_and_a_naive_time_is_utc() -> None:
    with_offset = parse_rfc3339("2026-11-29T21:00:00.5+01:00")
    assert with_offset == datetime(2026, 11, 29, 20, 0, 0, 500000, tzinfo=timezone.utc)
    assert parse_rfc3339("2026-11-29T21:00:00") == datetime(2026, 11, 29, 21, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("moment", "text"),
    [
        (
            datetime(2026, 11, 29, 21, 21, 54, 164779, tzinfo=timezone.utc),
            "2026-11-29T21:21:54.164779Z",
        ),
        (datetime(2026, 11, 29, 21, 21, 54, tzinfo=timezone.utc), "2026-11-29T21:21:54Z"),
        (
            datetime(2026, 11, 29, 22, 0, tzinfo=timezone(timedelta(hours=1))),
            "2026-11-29T21:00:00Z",
        ),
    ],
)
def test_the_node_writes_utc_with_a_z(moment: datetime, text: str) -> None:
    assert rfc3339(moment) == text
    assert parse_rfc3339(text) == moment


def test_normalise_rewrites_an_engine_time_in_the_nodes_format() -> None:
    assert normalise("2026-11-29T21:21:54.164779123Z") == "2026-11-29T21:21:54.164779Z"
    assert normalise("0001-01-01T00:00:00Z") is None
