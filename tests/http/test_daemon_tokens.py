"""Scoped and named tokens, and the brake on guessing them (issue 25, findings 2 and 9):
in front of the in-memory engine, over a real socket."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeFakeNode
from tests.fakes.clock import FakeClock
from tests.support.console import TOKEN
from tuneplane_node.daemon.access import guard
from tuneplane_node.daemon.access.guard import AuthFailures, delay_s
from tuneplane_node.daemon.access.tokens import TokenSet, parse_line
from tuneplane_node.errors import ConfigError
from tuneplane_node.wire import PROTOCOL, PROTOCOL_HEADER

# Slow: the tokens end to end over a real socket.
pytestmark = pytest.mark.slow

OBSERVER = "observer-0123456789abcdef"
SCRAPER = "scraper-0123456789abcdef"
CONSOLE = "console-0123456789abcdef"
OPERATOR = "operator-0123456789abcdef"


def headers(token: str, scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {token}", PROTOCOL_HEADER: str(PROTOCOL)}


async def scoped_node(fake_node: MakeFakeNode, tmp_path: Path, **overrides: Any) -> Any:
    tokens = tmp_path / "tokens"
    tokens.write_text(
        f"{CONSOLE} name=console\n{OBSERVER} name=grafana scope=observe\n"
        f"{SCRAPER} scope=metrics name=prometheus\n{OPERATOR} name=ops scope=operate\n"
    )
    return await fake_node(node_token=None, node_token_file=tokens, **overrides)


async def status_of(node: Any, method: str, path: str, token: str, **kwargs: Any) -> int:
    async with node.client.request(method, path, headers=headers(token), **kwargs) as response:
        return int(response.status)


READS: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/node/v1/health", {}),
    ("GET", "/node/v1/inventory", {}),
    ("POST", "/node/v1/observe", {"json": {"refs": ["job-x"]}}),
    ("POST", "/node/v1/stats", {"json": {}}),
    ("GET", "/node/v1/openapi.json", {}),
    ("GET", "/metrics", {}),
]
CARE: list[tuple[str, str, dict[str, Any]]] = [
    ("GET", "/node/v1/images", {}),
    ("POST", "/node/v1/images/pull", {"json": {"image": "registry.test/trainer:1"}}),
    ("POST", "/node/v1/images/gc", {"json": {}}),
    ("POST", "/node/v1/cordon", {"json": {}}),
    ("POST", "/node/v1/drain", {"json": {}}),
    ("POST", "/node/v1/uncordon", {"json": {}}),
]
"""An operator's verbs: an ``operate`` token's, besides the reads."""
JOB_VERBS: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/node/v1/launch", {"json": {}}),
    ("POST", "/node/v1/stop", {"json": {"ref": "job-x"}}),
    ("POST", "/node/v1/signal", {"json": {"ref": "job-x", "signal": "SIGUSR1"}}),
    ("POST", "/node/v1/remove", {"json": {"ref": "job-x"}}),
    ("POST", "/node/v1/reap", {"json": {}}),
    ("GET", "/node/v1/logs", {"params": {"ref": "job-x"}}),
]
ACTS = CARE + JOB_VERBS


async def refused(node: Any, token: str, verbs: list[tuple[str, str, dict[str, Any]]]) -> None:
    """Each verb is a 403 naming its scope, and does nothing."""
    for method, path, kwargs in verbs:
        async with node.client.request(method, path, headers=headers(token), **kwargs) as response:
            assert response.status == 403, path
            detail = (await response.json())["detail"]
        needed = "full" if (method, path, kwargs) in JOB_VERBS else "operate"
        scope = "observe" if token == OBSERVER else "operate"
        assert (
            detail
            == f"this token's scope is {scope}: {method} {path} needs a token of scope {needed}"
        )


async def test_an_observe_token_reads_and_never_acts(
    fake_node: MakeFakeNode, tmp_path: Path
) -> None:
    node = await scoped_node(fake_node, tmp_path)
    for method, path, kwargs in READS:
        assert await status_of(node, method, path, OBSERVER, **kwargs) == 200, path
    await refused(node, OBSERVER, ACTS)
    assert (await node_state(node)) == "ready"
    assert await status_of(node, "POST", "/node/v1/cordon", CONSOLE, json={}) == 200


async def test_an_operate_token_looks_after_the_node_and_never_touches_a_job(
    fake_node: MakeFakeNode, tmp_path: Path
) -> None:
    """Issue 36, finding 2: cordon, drain, GC and prefetch needed the console's token,
    which launches too; the operator's observe token could not even list the images."""
    node = await scoped_node(fake_node, tmp_path)
    job = {"image": "registry.test/trainer:1", "command": ["/bin/sleep", "300"]}
    body = {"run_id": "job-x", "container": job}
    await node.ok("POST", "/node/v1/launch", json=body, headers=headers(CONSOLE))
    await refused(node, OPERATOR, JOB_VERBS)
    observe = {"json": {"refs": ["tuneplane-job-x"]}, "headers": headers(OPERATOR)}
    state = (await node.ok("POST", "/node/v1/observe", **observe))["states"]["tuneplane-job-x"]
    assert state["status"] == "running"  # nothing stopped or removed
    for method, path, kwargs in READS + CARE:
        assert await status_of(node, method, path, OPERATOR, **kwargs) in (200, 202), path
    assert (await node_state(node)) == "ready"  # cordoned, drained, and back


async def node_state(node: Any) -> str:
    health = await node.ok("GET", "/node/v1/health", headers=headers(OPERATOR))
    return str(health["node_state"]["state"])


async def test_a_metrics_token_buys_the_scrape_alone(
    fake_node: MakeFakeNode, tmp_path: Path
) -> None:
    """Issue 25, finding 2: a scraper needed the token that launches containers."""
    node = await scoped_node(fake_node, tmp_path)
    assert await status_of(node, "GET", "/metrics", SCRAPER) == 200
    async with node.client.get("/node/v1/health", headers=headers(SCRAPER)) as response:
        assert response.status == 403
        assert (await response.json())["detail"] == (
            "this token's scope is metrics: GET /node/v1/health needs a token of scope observe"
        )
    assert await status_of(node, "POST", "/node/v1/launch", SCRAPER, json={}) == 403


async def test_audit_and_access_lines_name_the_token_never_show_it(
    fake_node: MakeFakeNode, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    node = await scoped_node(fake_node, tmp_path)
    assert await status_of(node, "POST", "/node/v1/cordon", CONSOLE, json={}) == 200
    assert await status_of(node, "POST", "/node/v1/cordon", OBSERVER, json={}) == 403
    assert await status_of(node, "GET", "/metrics", SCRAPER) == 200
    assert await status_of(node, "POST", "/node/v1/images/pull", SCRAPER, json={}) == 403
    audit = [r for r in caplog.records if r.name == "tuneplane_node.audit"]
    assert [(r.action, r.token, r.result) for r in audit] == [  # type: ignore[attr-defined]
        ("cordon", "console", "cordoned"),
        ("cordon", "grafana", "refused"),  # issue 52, part 9: a scope refusal is audited
        ("images pull", "prometheus", "refused"),
    ]
    assert " with token console: " in audit[0].getMessage()
    assert audit[1].getMessage() == (
        "audit: cordon - by 127.0.0.1 with token grafana: refused: this token's scope is "
        "observe: POST /node/v1/cordon needs a token of scope operate"
    )
    assert audit[1].status == 403  # type: ignore[attr-defined]
    access = [r for r in caplog.records if r.name == "tuneplane_node.access"]
    assert [r.token for r in access] == ["console", "grafana", "prometheus", "prometheus"]  # type: ignore[attr-defined]
    for secret in (CONSOLE, OBSERVER, SCRAPER):
        assert secret not in caplog.text


async def test_the_bearer_scheme_is_case_insensitive(fake_node: MakeFakeNode) -> None:
    """RFC 7235: ``bearer`` and ``BEARER`` are the scheme too."""
    node = await fake_node()
    for scheme in ("bearer", "BEARER", "Bearer"):
        async with node.client.get("/node/v1/health", headers=headers(TOKEN, scheme)) as response:
            assert response.status == 200, scheme
    async with node.client.get("/node/v1/health", headers=headers(TOKEN, "Basic")) as response:
        assert response.status == 401


async def test_a_guessing_peer_is_slowed_then_refused_and_a_right_token_never(
    fake_node: MakeFakeNode, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 25, finding 9: 4,900 bad tokens a second, no 429 and not one log line."""
    caplog.set_level(logging.WARNING, logger="tuneplane_node.daemon.access.guard")
    node = await fake_node()

    async def guess(n: int) -> int:
        return await status_of(node, "GET", "/node/v1/health", f"guess-{n:020d}")

    statuses = await asyncio.gather(*(guess(n) for n in range(60)))
    assert statuses.count(401) >= guard.SLOW_AFTER and statuses.count(429) >= 30, statuses
    started = time.monotonic()
    assert await status_of(node, "GET", "/node/v1/health", TOKEN) == 200  # never slowed
    assert time.monotonic() - started < guard.MAX_DELAY_S  # not a failure's delay
    async with node.client.get("/metrics", headers=headers(TOKEN)) as response:
        text = await response.text()
    counted = {
        status: float(line.split()[-1])
        for line in text.splitlines()
        for status in ("401", "429")
        if line.startswith(f'tuneplane_node_auth_failures_total{{status="{status}"}}')
    }
    assert counted == {"401": statuses.count(401), "429": statuses.count(429)}
    said = [
        r.getMessage() for r in caplog.records if r.name == "tuneplane_node.daemon.access.guard"
    ]
    assert 1 <= len(said) <= 3, said  # at most one a second, with the peer and the count
    assert "127.0.0.1" in said[0] and "failed authentication" in said[0]


def test_the_delay_grows_past_the_free_failures_and_is_bounded() -> None:
    assert [delay_s(n) for n in (1, guard.SLOW_AFTER)] == [0, 0]
    assert 0 < delay_s(guard.SLOW_AFTER + 1) < delay_s(guard.SLOW_AFTER + 5)
    assert delay_s(10_000) == guard.MAX_DELAY_S


def test_failures_age_out_of_the_window_and_a_success_forgets_them() -> None:
    clock = FakeClock()
    failures = AuthFailures(clock=clock)
    for _ in range(guard.REFUSE_AFTER):
        failures.failed("10.0.0.1")
    failures.failed("10.0.0.2")
    assert failures.recent("10.0.0.1") == guard.REFUSE_AFTER
    clock.advance(guard.WINDOW_S + 0.1)
    assert failures.recent("10.0.0.1") == 0
    failures.failed("10.0.0.2")
    failures.succeeded("10.0.0.2")
    assert failures.recent("10.0.0.2") == 0 and failures.total == guard.REFUSE_AFTER + 2


def test_a_token_line_carries_a_name_and_a_scope() -> None:
    bare = parse_line("a" * 16, 1)
    assert (bare.scope, bare.name) == ("full", bare.name)
    assert bare.name.startswith("sha256:") and "a" * 16 not in repr(bare)
    named = parse_line(f"{'b' * 20} scope=metrics name=prom", 2)
    assert (named.name, named.scope) == ("prom", "metrics")
    for bad, why in (
        (f"{'c' * 20} scope=admin", "scope 'admin' is not one of full, operate, observe, metrics"),
        (f"{'c' * 20} role=x", "'role' is not name=... or scope=..."),
        ("short", "a token of 5 characters is too easy to guess"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_line(bad, 3)


def test_a_short_token_stops_the_start(tmp_path: Path) -> None:
    from tests.conftest import fake_settings

    with pytest.raises(ConfigError, match=r"TUNEPLANE_NODE_TOKEN: .*`openssl rand -hex 32`"):
        TokenSet.from_settings(fake_settings(tmp_path, node_token="x" * 15))
    TokenSet.from_settings(fake_settings(tmp_path, node_token="x" * 16))
