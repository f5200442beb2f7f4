"""The tests that need a real engine, the registries or a GPU driver: each one here is
marked ``engine`` by the folder it sits in, so that a forgotten marker cannot put one in
``-m 'not engine'`` (CI's runs without an engine, the fast suite). The engines' fixtures
are tests/conftest.py's: the contract suite opens engines too."""

from __future__ import annotations

import pytest

SHARED = {"runtime", "docker_runtime", "own_docker"}
"""tests/conftest.py's fixtures on the engines the suite's tests share."""


def pytest_itemcollected(item: pytest.Item) -> None:
    """Called for the items below this folder alone (a hook of a folder's conftest)."""
    item.add_marker(pytest.mark.engine)
    shared = SHARED.intersection(getattr(item, "fixturenames", ()))
    if shared and item.get_closest_marker("own_engines") is not None:
        raise pytest.UsageError(f"{item.nodeid} is own_engines but uses {sorted(shared)}")
