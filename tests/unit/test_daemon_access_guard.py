"""Who may ask what, without a socket: the bearer token's comparison and every route's
scope, checked the way the guard checks them (`authenticate` on a made request).

tests/http/test_daemon_tokens.py drives the same over a real socket (slow); these are the
fast set's, so a planted bug in a scope table or the comparison fails in seconds
(issue 52: every scope check had only slow tests, and a comparison turned into a prefix
match, which lets ``Authorization: Bearer `` in, failed no test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import make_mocked_request

from tests.conftest import fake_settings
from tuneplane_node.daemon.access.guard import AuthFailures, authenticate, needed_scope
from tuneplane_node.daemon.access.tokens import FULL, METRICS, OBSERVE, OPERATE, TokenSet
from tuneplane_node.daemon.routes import OPERATIONS
from tuneplane_node.errors import InsufficientScope

SECRETS = {
    FULL: "console-0123456789abcdef",
    OPERATE: "operator-0123456789abcdef",
    OBSERVE: "observer-0123456789abcdef",
    METRICS: "scraper-0123456789abcdef",
}
# Each route and the scope it needs: the guard's tables, written out.
NEEDED = {
    ("GET", "/metrics"): METRICS,
    ("GET", "/healthz"): FULL,  # never guarded (app.py): its scope is never asked
    ("GET", "/node/v1/health"): OBSERVE,
    ("GET", "/node/v1/inventory"): OBSERVE,
    ("POST", "/node/v1/observe"): OBSERVE,
    ("GET", "/node/v1/jobs"): OBSERVE,
    ("POST", "/node/v1/stats"): OBSERVE,
    ("GET", "/node/v1/openapi.json"): OBSERVE,
    ("GET", "/node/v1/images"): OPERATE,
    ("GET", "/node/v1/volumes"): OPERATE,
    ("POST", "/node/v1/images/pull"): OPERATE,
    ("POST", "/node/v1/images/gc"): OPERATE,
    ("POST", "/node/v1/volumes/pull"): OPERATE,
    ("POST", "/node/v1/volumes/gc"): OPERATE,
    ("POST", "/node/v1/cordon"): OPERATE,
    ("POST", "/node/v1/uncordon"): OPERATE,
    ("POST", "/node/v1/gpus/reset-breaker"): OPERATE,
    ("POST", "/node/v1/drain"): OPERATE,
    ("POST", "/node/v1/launch"): FULL,
    ("POST", "/node/v1/stop"): FULL,
    ("POST", "/node/v1/signal"): FULL,
    ("POST", "/node/v1/remove"): FULL,
    ("POST", "/node/v1/reap"): FULL,
    ("GET", "/node/v1/logs"): FULL,  # a job's output is the customer's
}
# What each scope buys: a scope buys the narrower ones.
BUYS = {
    FULL: {FULL, OPERATE, OBSERVE, METRICS},
    OPERATE: {OPERATE, OBSERVE, METRICS},
    OBSERVE: {OBSERVE, METRICS},
    METRICS: {METRICS},
}


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> TokenSet:
    path: Path = tmp_path_factory.mktemp("tokens") / "tokens"
    path.write_text("".join(f"{secret} name={scope}-token scope={scope}\n"
                            for scope, secret in SECRETS.items()))  # fmt: skip
    directory = path.parent
    settings = fake_settings(directory, node_token=None, node_token_file=path)
    return TokenSet.from_settings(settings)  # as the daemon reads them


def test_every_route_of_the_node_has_its_scope_in_the_table() -> None:
    routes = {(operation.method.upper(), operation.path) for operation in OPERATIONS}
    assert routes == set(NEEDED)
    for (method, path), scope in NEEDED.items():
        assert needed_scope(method, path) == scope, (method, path)
        if method == "GET":
            assert needed_scope("HEAD", path) == scope  # HEAD is its GET, never less


@pytest.mark.parametrize(("method", "path"), list(NEEDED), ids=[f"{m} {p}" for m, p in NEEDED])
def test_each_scope_buys_its_routes_and_is_refused_the_others(
    tokens: TokenSet, method: str, path: str
) -> None:
    needed = NEEDED[(method, path)]
    for holder, secret in SECRETS.items():
        request = make_mocked_request(method, path, headers={"Authorization": f"Bearer {secret}"})
        if needed in BUYS[holder]:
            token = authenticate(tokens, AuthFailures(), request, scope=needed)
            assert token is not None and token.scope == holder, holder
            continue
        with pytest.raises(InsufficientScope) as refused:
            authenticate(tokens, AuthFailures(), request, scope=needed)
        assert refused.value.message == (
            f"this token's scope is {holder}: {method} {path} needs a token of scope {needed}"
        )


@pytest.mark.parametrize(
    "header",
    [
        "",
        "Bearer",
        "Bearer ",
        "Bearer  ",
        f"Bearer {SECRETS[FULL][:-1]}",  # a prefix of a token
        f"Bearer {SECRETS[FULL][:1]}",
        f"Bearer {SECRETS[FULL]}x",  # a token and more
        f"Bearer {SECRETS[FULL]} {SECRETS[FULL]}",
        f"Basic {SECRETS[FULL]}",
        f"Bearer {SECRETS[FULL].upper()}",
        "Bearer other-0123456789abcdef",
    ],
)
def test_only_a_whole_token_of_the_set_matches(tokens: TokenSet, header: str) -> None:
    assert tokens.match(f"Bearer {SECRETS[FULL]}") is not None  # remembered: a fast path
    assert tokens.match(header) is None


def test_each_token_matches_as_itself_in_any_case_of_the_scheme(tokens: TokenSet) -> None:
    for scope, secret in SECRETS.items():
        for scheme in ("Bearer", "bearer", "BEARER"):
            token = tokens.match(f"{scheme} {secret}")
            assert token is not None and (token.name, token.scope) == (f"{scope}-token", scope)
