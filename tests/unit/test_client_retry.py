"""The client's retries and per-call timeouts, against a transport that answers as a
node in trouble would: a safe verb is asked again after a failure that says nothing was
done, a launch only where the console opted in, a refusal never."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tuneplane_node.client import (
    NO_RETRY,
    AsyncNodeClient,
    Container,
    EngineUnavailable,
    InvalidRequest,
    NodeClient,
    Retry,
    TooManyAuthFailures,
    Unreachable,
)

Handler = Callable[[httpx.Request], httpx.Response]
QUICK = Retry(attempts=3, first_s=0.0, jitter=0.0)  # no sleeping in the fast suite
HEALTH = {"ok": True, "protocol": 1}
LAUNCHED = {"phase": "running", "ref": "tuneplane-r", "gpus": [], "idempotent": True}


def node(*failures: int | str, answer: object = HEALTH) -> tuple[list[httpx.Request], Handler]:
    """A transport that fails as ``failures`` say (a status, or ``"drop"``: no answer),
    in turn, then answers ``answer``; and the requests it saw."""
    seen: list[httpx.Request] = []
    left = list(failures)

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if left:
            failure = left.pop(0)
            if failure == "drop":
                raise httpx.ConnectError("refused", request=request)
            code = {503: "engine_unavailable", 422: "invalid_field", 429: "too_many_auth_failures"}
            body = {"detail": "no", "code": code[int(failure)]}
            return httpx.Response(int(failure), json=body)
        return httpx.Response(200, json=answer)

    return seen, handle


def client(handle: Handler, retry: Retry = QUICK) -> NodeClient:
    return NodeClient(
        "http://node:8470", token="t", transport=httpx.MockTransport(handle), retry=retry
    )


def test_a_read_is_asked_again_after_no_answer_and_an_engine_outage() -> None:
    seen, handle = node("drop", 503)
    with client(handle) as c:
        assert c.health().ok is True
    assert len(seen) == 3


def test_retries_end_after_their_attempts_with_the_last_failure() -> None:
    seen, handle = node(503, 503, 503, 503)
    with client(handle) as c, pytest.raises(EngineUnavailable):
        c.health()
    assert len(seen) == 3


def test_a_refusal_is_never_asked_again() -> None:
    for failure, error in ((422, InvalidRequest), (429, TooManyAuthFailures)):
        seen, handle = node(failure)
        with client(handle) as c, pytest.raises(error):
            c.observe(["a"])
        assert len(seen) == 1


def test_a_launch_is_asked_again_only_where_the_console_opted_in() -> None:
    seen, handle = node("drop", answer=LAUNCHED)
    with client(handle) as c, pytest.raises(Unreachable):
        c.launch("r", Container(image="x"))
    assert len(seen) == 1
    seen, handle = node("drop", answer=LAUNCHED)
    with client(handle, Retry(first_s=0.0, launch=True)) as c:
        assert c.launch("r", Container(image="x")).idempotent
    assert len(seen) == 2 and seen[0].content == seen[1].content  # the same launch again


def test_a_stop_is_never_asked_again() -> None:
    seen, handle = node("drop", answer={"ok": True})
    with client(handle) as c, pytest.raises(Unreachable):
        c.stop("tuneplane-r", timeout=1)
    assert len(seen) == 1


def test_options_set_one_calls_timeout_and_retries() -> None:
    seen, handle = node("drop")
    with client(handle) as c:
        with pytest.raises(Unreachable):
            c.options(retry=NO_RETRY).health()
        assert len(seen) == 1
        c.options(timeout=2.5).health()
        assert seen[-1].extensions["timeout"]["read"] == 2.5
        c.health()
        assert seen[-1].extensions["timeout"]["read"] == c.timeout  # the client's own again


def test_backoff_grows_to_its_bound() -> None:
    delays = list(Retry(attempts=6, first_s=1.0, factor=2.0, most_s=5.0, jitter=0.0).delays())
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert list(NO_RETRY.delays()) == []


async def test_the_async_client_retries_as_the_sync_one() -> None:
    seen, handle = node("drop", 503)
    transport = httpx.MockTransport(handle)
    async with AsyncNodeClient("http://n:8470", token="t", transport=transport, retry=QUICK) as c:
        assert (await c.health()).ok is True
    assert len(seen) == 3
    seen, handle = node("drop", answer=LAUNCHED)
    transport = httpx.MockTransport(handle)
    async with AsyncNodeClient("http://n:8470", token="t", transport=transport, retry=QUICK) as c:
        with pytest.raises(Unreachable):
            await c.launch("r", Container(image="x"))
        assert len(seen) == 1
        assert (
            await c.options(retry=Retry(first_s=0.0, launch=True)).launch("r", Container(image="x"))
        ).idempotent
