"""The guard's brake on a guessing peer, on a clock moved by hand (issue 52: the mutants of
`daemon/access/guard.py` the other tests let live).

What a guesser meets (free typos, then answers delayed longer each time, then 429s), how
many of its delayed answers wait at once, the one log line a second an operator reads
(its counts and the peer), which peers are remembered, and a right token forgetting its
peer's failures.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from aiohttp.test_utils import make_mocked_request

from tests.conftest import fake_settings
from tests.fakes.clock import FakeClock
from tuneplane_node.clock import Clock
from tuneplane_node.daemon.access import guard
from tuneplane_node.daemon.access.guard import TOKEN_KEY, AuthFailures, authenticate, refuse
from tuneplane_node.daemon.access.tokens import TokenSet
from tuneplane_node.errors import TooManyAuthFailures, Unauthorized

PEER, OTHER = "10.0.0.9", "10.0.0.8"
SECRET = "console-0123456789abcdef"


class StandingClock(Clock):
    """Time stands still and a sleep ends at once: each is noted."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


async def refused(failures: AuthFailures, peer: str = PEER) -> Unauthorized | TooManyAuthFailures:
    try:
        await asyncio.wait_for(refuse(failures, peer), 1)  # a wait never ended fails, not hangs
    except (Unauthorized, TooManyAuthFailures) as answer:
        return answer
    raise AssertionError("refuse returned")


async def test_a_guesser_is_answered_free_then_delayed_then_refused_for_the_window() -> None:
    clock = StandingClock()
    failures = AuthFailures(clock=clock)
    answers = [await refused(failures) for _ in range(guard.REFUSE_AFTER + 1)]

    assert [a.status for a in answers] == [401] * (guard.REFUSE_AFTER - 1) + [429, 429]
    last = answers[-1]
    assert isinstance(last, TooManyAuthFailures)
    assert (last.failures, last.window_s) == (guard.REFUSE_AFTER + 1, guard.WINDOW_S)
    # The first SLOW_AFTER never wait; then 0.1 s more each, up to 1.5 s.
    assert clock.slept == pytest.approx(
        [min(0.1 * n, guard.MAX_DELAY_S) for n in range(1, guard.REFUSE_AFTER + 2 - 5)]
    )
    assert (failures.recent(PEER), failures.recent(OTHER)) == (guard.REFUSE_AFTER + 1, 0)


async def test_a_guesser_waits_four_answers_at_a_time_each_counted_until_answered() -> None:
    """A delayed answer holds a connection: at most `MAX_WAITING` of one peer's at once,
    the next is a 429 at once, and each answered one is let go of its count."""
    clock = FakeClock()
    failures = AuthFailures(clock=clock)
    for _ in range(guard.SLOW_AFTER):
        await refused(failures)
    waiting = [asyncio.create_task(refuse(failures, PEER)) for _ in range(guard.MAX_WAITING)]
    await asyncio.sleep(0)
    assert failures.waiting == {PEER: 4}

    at_once = await refused(failures)
    assert isinstance(at_once, TooManyAuthFailures) and at_once.failures == 10

    clock.advance(0.05)  # the delays end at 0.1, 0.2, 0.3 and 0.4 s
    for n, answer in enumerate(waiting):
        clock.advance(0.1)
        with pytest.raises(Unauthorized):
            await answer
        assert failures.waiting == ({PEER: 3 - n} if n < 3 else {})


async def test_failures_are_said_once_a_second_with_the_peer_and_the_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger=guard.__name__)
    clock = FakeClock(start=0.0)  # the first failure is said even at the clock's zero
    failures = AuthFailures(clock=clock)
    failures.failed(PEER)
    failures.failed(OTHER)
    failures.failed(OTHER)
    clock.advance(guard.SAY_EVERY_S)
    failures.failed(PEER)

    said = [(r.getMessage(), r.__dict__.get("client")) for r in caplog.records]
    assert said == [
        (
            "1 failed authentication(s) since the last such line; the latest from 10.0.0.9, "
            "its 1 in the last 10 s (1 in all)",
            PEER,
        ),
        (
            "3 failed authentication(s) since the last such line; the latest from 10.0.0.9, "
            "its 2 in the last 10 s (4 in all)",
            PEER,
        ),
    ]
    assert failures.total == 4


def test_a_failure_leaves_the_window_when_the_window_has_passed() -> None:
    clock = FakeClock()
    failures = AuthFailures(clock=clock)
    failures.failed(PEER)
    clock.advance(guard.WINDOW_S / 2)
    failures.failed(PEER)
    clock.advance(guard.WINDOW_S / 2)
    assert failures.recent(PEER) == 1  # the first is WINDOW_S old: gone


def test_past_max_peers_the_oldest_peer_is_forgotten_never_the_newest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(guard, "MAX_PEERS", 8)  # 4,096 peers: the same rule, slower
    failures = AuthFailures(clock=StandingClock())
    peers = [f"10.0.0.{n}" for n in range(guard.MAX_PEERS + 1)]
    for peer in peers:
        failures.failed(peer)
    assert [failures.recent(p) for p in (peers[0], peers[1], peers[-1])] == [0, 1, 1]


async def test_a_right_token_forgets_its_peers_failures_and_is_on_the_request(
    tmp_path: Path,
) -> None:
    tokens = TokenSet.from_settings(fake_settings(tmp_path, node_token=SECRET))
    failures = AuthFailures(clock=StandingClock())
    for peer in ("unknown", OTHER):  # a request without an address is "unknown" (app.py)
        await refused(failures, peer)

    anonymous = make_mocked_request("GET", "/node/v1/health")
    assert authenticate(tokens, failures, anonymous, scope="observe") is None
    request = make_mocked_request(
        "GET", "/node/v1/health", headers={"Authorization": f"Bearer {SECRET}"}
    )
    token = authenticate(tokens, failures, request, scope="observe")

    assert token is not None and request[TOKEN_KEY] is token  # the audit line names it
    assert (failures.recent("unknown"), failures.recent(OTHER)) == (0, 1)
