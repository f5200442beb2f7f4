"""The tests that need a real engine, the registries or a GPU driver: each one here is
marked ``engine`` by the folder it sits in, so that a forgotten marker cannot put one in
``-m 'not engine'`` (CI's runs without an engine, the fast suite). The engines' fixtures
are tests/conftest.py's: the contract suite opens engines too. CI runs them in three
lanes at once, by the engines they use (``own_engines``, tests/support/engines.py's `LANE`)."""

from __future__ import annotations

import pytest

SHARED = {"runtime", "docker_runtime"}
"""tests/conftest.py's fixtures on the engines most tests share (docker-tests, podman-tests)."""
OWN = {"own_docker"}
"""Its fixtures on the suite's single-purpose engines, which the own_engines lane has."""


def pytest_itemcollected(item: pytest.Item) -> None:
    """Called for the items below this folder alone (a hook of a folder's conftest)."""
    item.add_marker(pytest.mark.engine)
    fixtures = set(getattr(item, "fixturenames", ()))
    own = item.get_closest_marker("own_engines") is not None
    if own and SHARED & fixtures:
        raise pytest.UsageError(
            f"{item.nodeid} is own_engines but uses {sorted(SHARED & fixtures)}"
        )
    if not own and OWN & fixtures:
        raise pytest.UsageError(f"{item.nodeid} uses {sorted(OWN & fixtures)}: mark it own_engines")
