"""The `ContainerRuntime` contract: one suite, each test run on every runtime it names
(the in-memory fake, the process runtime, docker and podman; the engines' params marked
``engine``). A property of one runtime alone is that runtime's test, not the contract's:
collection fails on a test here that is not parametrised."""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    """Called for the items below this folder alone (a hook of a folder's conftest)."""
    if getattr(item, "callspec", None) is None:
        raise pytest.UsageError(f"{item.nodeid} runs on one runtime: the contract runs on each")
