"""Driving a live daemon from its OpenAPI document with schemathesis: every operation's
generated cases, each answer held to the document (no 5xx, the schema, the codes). Its
own module, imported by the fuzz tests alone: schemathesis takes a fifth of a second to
import, which the fast suite, running none of them, should not pay."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.specs.openapi.examples import get_strategies_from_examples

from tests.support.console import TOKEN
from tuneplane_node.daemon.routes import document


def code_declared(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """An error's ``code`` is one its operation's document lists for its status."""
    if response.status_code < 400:
        return None
    operation = document()["paths"][case.operation.path][case.operation.method.lower()]
    declared = operation["responses"].get(str(response.status_code), {}).get("x-codes")
    code = response.json().get("code")
    assert declared is not None and code in declared, (response.status_code, code, declared)
    return None


def not_the_nodes_error(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """schemathesis' not_a_server_error, but for a volume prefetch's declared ``502
    volume_fill_failed``: its source's refusal (a generated URL names no file), which
    the node answers as a gateway would, not a failure of its own."""
    if case.operation.path == "/node/v1/volumes/pull" and response.status_code == 502:
        assert response.json().get("code") == "volume_fill_failed", response.text
        return None
    return not_a_server_error(ctx, response, case)  # type: ignore[no-any-return]


CONFORMANCE = [
    not_the_nodes_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    code_declared,
]


def negative_data_refused(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """schemathesis' negative_data_rejection, but for a blank body: the API reads an
    empty body, whitespace or not, as {} (docs/api.md, "API reference"); and a 413 is a
    refusal too (a body over the node's bound is refused before it is read: a generated
    list past its ``maxItems`` once came to more than 1 MiB)."""
    if isinstance(case.body, (str, bytes)) and not case.body.strip():
        return None
    if response.status_code == 413:
        return None
    return negative_data_rejection(ctx, response, case)  # type: ignore[no-any-return]


def unwaited(case: schemathesis.Case) -> None:
    """A volume prefetch answers without waiting for its fill: a generated source's host
    resolves nowhere, and a dropped connection is retried after backoff sleeps that the
    fake engine's clock never ends (a waited fill would outlast the request's timeout;
    tests/http/test_daemon_volume_verbs.py waits for real fills)."""
    body = case.body
    if case.operation.path == "/node/v1/volumes/pull" and isinstance(body, dict):
        body["wait"] = False if body.get("wait") is True else body.get("wait", False)


AUTH = {"Authorization": f"Bearer {TOKEN}"}  # the protocol header is the case's own
Adjust = Callable[[schemathesis.Case], None]
Seen = Callable[[schemathesis.Case, Any], None]  # a case and its answer, once checked


def fuzz(
    base_url: str,
    *,
    examples: int,
    negative: bool = False,
    skip: frozenset[str] = frozenset(),
    adjust: Adjust = lambda case: None,
    seen: Seen = lambda case, response: None,
) -> int:
    """Drive every operation (but ``skip``) from the document; the requests sent.
    ``seen`` is told each case and its answer, once the answer passed the checks."""
    api = schemathesis.openapi.from_dict(document())
    modes = [schemathesis.GenerationMode.POSITIVE]
    modes += [schemathesis.GenerationMode.NEGATIVE] if negative else []
    sent = itertools.count()
    for result in api.get_all_operations():
        operation = result.ok()
        if operation.path in skip:
            continue
        # The document's own examples first (a launch that runs), once each.
        for example in get_strategies_from_examples(operation):
            send = sender(
                operation, example, base_url=base_url, adjust=adjust, sent=sent, seen=seen
            )
            seed(SEED)(settings(max_examples=1, **QUICK)(send))()
        for mode in modes:
            strategy = operation.as_strategy(generation_mode=mode)
            negative = mode == schemathesis.GenerationMode.NEGATIVE
            send = sender(
                operation, strategy, base_url=base_url, adjust=adjust, sent=sent, seen=seen,
                negative=negative,
            )  # fmt: skip
            try:
                seed(SEED)(settings(max_examples=examples, **QUICK)(send))()
            except Unsatisfiable:  # nothing to get wrong (/healthz): no negative case
                assert negative, operation.label
    return next(sent)


SEED = int(os.environ.get("TUNEPLANE_FUZZ_SEED", "20261130"))
"""The same cases in every run, so that CI fails on a change, not on a draw; set
``TUNEPLANE_FUZZ_SEED`` to draw others."""
QUICK: dict[str, Any] = {
    "deadline": None,
    "database": None,  # every run starts fresh: no example replayed from another
    "phases": [Phase.explicit, Phase.generate, Phase.shrink],
    "suppress_health_check": list(HealthCheck),
}


def sender(
    operation: schemathesis.APIOperation,
    strategy: Any,
    *,
    base_url: str,
    adjust: Adjust,
    sent: itertools.count[int],
    seen: Seen,
    negative: bool = False,
) -> Callable[[], None]:
    """A hypothesis test sending the strategy's cases and checking each answer."""
    checks = [*CONFORMANCE, *([negative_data_refused] if negative else [])]

    @given(strategy)
    def send(case: schemathesis.Case) -> None:
        adjust(case)
        unwaited(case)
        next(sent)
        response = case.call_and_validate(
            base_url=base_url, headers=AUTH, checks=checks, timeout=30
        )
        seen(case, response)

    return send  # type: ignore[no-any-return]
