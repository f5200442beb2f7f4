"""The tests that need a real engine, the registries or a GPU driver: each one here is
marked ``engine`` by the folder it sits in, so that a forgotten marker cannot put one in
``-m 'not engine'`` (CI's runs without an engine, the fast suite). The engines' fixtures
are tests/conftest.py's: the contract suite opens engines too."""

from __future__ import annotations

import pytest


def pytest_itemcollected(item: pytest.Item) -> None:
    """Called for the items below this folder alone (a hook of a folder's conftest)."""
    item.add_marker(pytest.mark.engine)
