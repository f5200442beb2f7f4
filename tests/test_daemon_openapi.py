"""The OpenAPI document, served and held to: the daemon answers it behind the token, and
schemathesis drives a live daemon from it (no 5xx, every answer as documented), on the
fake engine for the bulk and on the shared dev engine for a smaller, fenced run."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.conftest import MakeFakeNode, MakeNode
from tests.helpers import IMAGE, TOKEN, Console, unique
from tuneplane_node.daemon.routes import document
from tuneplane_node.wire import PROTOCOL_HEADER, schema


def code_declared(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """An error's ``code`` is one its operation's document lists for its status."""
    if response.status_code < 400:
        return None
    operation = document()["paths"][case.operation.path][case.operation.method.lower()]
    declared = operation["responses"].get(str(response.status_code), {}).get("x-codes")
    code = response.json().get("code")
    assert declared is not None and code in declared, (response.status_code, code, declared)
    return None


CONFORMANCE = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    code_declared,
]


def negative_data_refused(ctx: Any, response: Any, case: schemathesis.Case) -> bool | None:
    """schemathesis' negative_data_rejection, but for a blank body: the API reads an
    empty body, whitespace or not, as {} (docs/api.md, "API reference")."""
    if isinstance(case.body, (str, bytes)) and not case.body.strip():
        return None
    return negative_data_rejection(ctx, response, case)  # type: ignore[no-any-return]


AUTH = {"Authorization": f"Bearer {TOKEN}"}  # the protocol header is the case's own
Adjust = Callable[[schemathesis.Case], None]


async def test_the_document_is_served_behind_the_token_and_the_protocol(
    fake_node: MakeFakeNode,
) -> None:
    console = await fake_node()
    assert await console.ok("GET", schema.DOCUMENT_PATH) == document()
    status, _ = await console.call("GET", schema.DOCUMENT_PATH, headers={})
    assert status == 401
    status, answer = await console.call("GET", schema.DOCUMENT_PATH, headers=AUTH)
    assert (status, answer["detail"]) == (400, f"missing {PROTOCOL_HEADER} header; this node "
                                                "speaks protocol 1")  # fmt: skip


def fuzz(
    base_url: str,
    *,
    examples: int,
    negative: bool = False,
    skip: frozenset[str] = frozenset(),
    adjust: Adjust = lambda case: None,
) -> int:
    """Drive every operation (but ``skip``) from the document; the requests sent."""
    api = schemathesis.openapi.from_dict(document())
    modes = [schemathesis.GenerationMode.POSITIVE]
    modes += [schemathesis.GenerationMode.NEGATIVE] if negative else []
    sent = itertools.count()
    for result in api.get_all_operations():
        operation = result.ok()
        for mode in modes if operation.path not in skip else []:
            send = sender(operation, mode, base_url=base_url, adjust=adjust, sent=sent)
            try:
                settings(max_examples=examples, **QUICK)(send)()
            except Unsatisfiable:  # nothing to get wrong (/healthz): no negative case
                assert mode == schemathesis.GenerationMode.NEGATIVE, operation.label
    return next(sent)


QUICK: dict[str, Any] = {
    "deadline": None,
    "database": None,  # every run starts fresh: no example replayed from another
    "phases": [Phase.explicit, Phase.generate, Phase.shrink],
    "suppress_health_check": list(HealthCheck),
}


def sender(
    operation: schemathesis.APIOperation,
    mode: schemathesis.GenerationMode,
    *,
    base_url: str,
    adjust: Adjust,
    sent: itertools.count[int],
) -> Callable[[], None]:
    """A hypothesis test sending the operation's cases and checking each answer."""
    negative = mode == schemathesis.GenerationMode.NEGATIVE
    checks = [*CONFORMANCE, *([negative_data_refused] if negative else [])]

    @given(operation.as_strategy(generation_mode=mode))
    def send(case: schemathesis.Case) -> None:
        adjust(case)
        next(sent)
        case.call_and_validate(base_url=base_url, headers=AUTH, checks=checks, timeout=30)

    return send  # type: ignore[no-any-return]


def base_url(console: Console) -> str:
    return str(console.client.make_url("")).rstrip("/")


@pytest.mark.slow
async def test_on_the_fake_engine_every_answer_is_documented_and_none_is_a_5xx(
    fake_node: MakeFakeNode,
) -> None:
    console = await fake_node()
    sent = await asyncio.to_thread(fuzz, base_url(console), examples=25, negative=True)
    assert sent > 300


# --- on the shared dev engine: only what this test launches is touched ---------------------

# Reap and drain act on every container of the node, and the dev engine holds other
# people's jobs: those two run on the fake engine only.
EVERY_JOB = frozenset({"/node/v1/reap", "/node/v1/drain"})


class Fence:
    """Points every launch at a name of this test's and every other verb at one of them,
    whatever schemathesis drew; the image is the test image, so a launch really runs."""

    def __init__(self) -> None:
        self.prefix = unique("oas")
        self.names = [f"{self.prefix}-{i}" for i in range(3)]
        self.launched: set[str] = set()

    def __call__(self, case: schemathesis.Case) -> None:
        body, path = case.body, case.operation.path
        if path == "/node/v1/launch" and isinstance(body, dict):
            self._launch(body, len(self.launched) % len(self.names))
        elif isinstance(body, dict) and "ref" in body:
            body["ref"] = self.names[0]
        elif isinstance(body, dict) and "refs" in body:
            body["refs"] = self.names
        elif case.query and "ref" in case.query:
            case.query["ref"] = self.names[0]

    def _launch(self, body: dict[str, Any], index: int) -> None:
        name = self.names[index]
        body["run_id"] = name
        if isinstance(body.get("container"), dict):
            body["container"].update(name=name, image=IMAGE)
        else:
            body["container"] = {"name": name, "image": IMAGE}
        self.launched.add(name)


@pytest.mark.engine
async def test_on_the_dev_engine_every_answer_is_documented_and_none_is_a_5xx(
    make_node: MakeNode,
) -> None:
    console = await make_node("docker")
    fence = Fence()
    assert console.made is not None
    console.made.extend(fence.names)  # removed by the fixture, launched or not
    # A job of the node's for the other verbs to act on, short enough for a followed log.
    command = ["/bin/sh", "-c", "echo started; sleep 3"]
    await console.launch(command, name=fence.names[0], run_id=fence.names[0])
    sent = await asyncio.to_thread(
        fuzz, base_url(console), examples=8, skip=EVERY_JOB, adjust=fence
    )
    assert sent > 50
