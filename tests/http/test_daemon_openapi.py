"""The OpenAPI document, served and held to: the daemon answers it behind the token, and
schemathesis drives a live daemon from it (no 5xx, every answer as documented), on the
fake engine for the bulk and on the shared dev engine for a smaller, fenced run
(`tests/fuzzing.py`, imported by those tests alone)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from tests.conftest import MakeFakeNode
from tests.support.console import TOKEN
from tuneplane_node.daemon.routes import document
from tuneplane_node.wire import PROTOCOL_HEADER, schema

if TYPE_CHECKING:
    pass

from tests.openapiserved import base_url

# Slow: the served document and the fuzz end to end over a real socket.
pytestmark = pytest.mark.slow

AUTH = {"Authorization": f"Bearer {TOKEN}"}  # the protocol header is the case's own


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


@pytest.mark.once  # the daemon's answers, the same on every Python and dependency release
async def test_on_the_fake_engine_every_answer_is_documented_and_none_is_a_5xx(
    fake_node: MakeFakeNode,
) -> None:
    console = await fake_node()
    from tests.fuzzing import fuzz

    sent = await asyncio.to_thread(fuzz, base_url(console), examples=25, negative=True)
    assert sent > 300
