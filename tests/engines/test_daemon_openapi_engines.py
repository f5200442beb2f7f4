"""The OpenAPI document, served and held to: the daemon answers it behind the token, and
schemathesis drives a live daemon from it (no 5xx, every answer as documented), on the
fake engine for the bulk and on the shared dev engine for a smaller, fenced run
(`tests/fuzzing.py`, imported by those tests alone).

This module holds the ones that need an engine; tests/http/test_daemon_openapi.py has the rest."""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import MakeNode
from tests.support.images import IMAGE
from tests.support.jobs import unique

if TYPE_CHECKING:
    import schemathesis

from tests.openapiserved import base_url

# Slow: the served document and the fuzz end to end over a real socket.
pytestmark = pytest.mark.slow


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


EXAMPLES = 60
"""Generated cases per operation: about 1,200 requests, 40 s on the test engine here
(26 s for 40 a quiet machine; two minutes and more under load is still in the bound)."""


@pytest.mark.engine
@pytest.mark.once  # the daemon's answers, the same on every Python and dependency release
async def test_on_the_dev_engine_every_answer_is_documented_and_none_is_a_5xx(
    make_node: MakeNode,
) -> None:
    """schemathesis against a daemon on the suite's docker engine, the document's
    examples and `EXAMPLES` generated cases of every operation (a fixed seed): no 5xx,
    every answer and header as the document says; and launches reach the engine and run
    (issue 52, part 10: none of 4,300 fuzzed launches had started). Negative cases run
    on the fake engine: the fence here would mend what they break."""
    console = await make_node("docker")
    fence = Fence()
    assert console.made is not None
    console.made.extend(fence.names)  # removed by the fixture, launched or not
    # A job of the node's for the other verbs to act on, short enough for a followed log.
    command = ["/bin/sh", "-c", "echo started; sleep 3"]
    await console.launch(command, name=fence.names[0], run_id=fence.names[0])
    from tests.fuzzing import fuzz

    answers: collections.Counter[tuple[str, int]] = collections.Counter()
    phases: collections.Counter[str] = collections.Counter()

    def seen(case: schemathesis.Case, response: Any) -> None:
        answers[(case.operation.path, response.status_code)] += 1
        if case.operation.path == "/node/v1/launch" and response.status_code == 200:
            phases[response.json()["phase"]] += 1

    sent = await asyncio.to_thread(
        fuzz,
        base_url(console),
        examples=EXAMPLES,
        skip=EVERY_JOB,
        adjust=fence,
        seen=seen,
    )
    assert sent > 500, answers
    assert phases["running"] + phases["exited"] >= 2, (phases, answers)
