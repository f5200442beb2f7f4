"""Engine-free tests of one piece of the node in this process, against the in-memory
engine, a clock moved by hand, or pure functions; and the repository's own checks (the
layers, the docs, the packaging). A test here that needs an engine belongs in
tests/engines/: collection fails on one marked ``engine``. The fast suite's 60 s bound is
tests/conftest.py's, as fast tests sit in every kind but the engines'."""

from __future__ import annotations

import pytest

from tests.conftest import refuse_engine_tests


def pytest_itemcollected(item: pytest.Item) -> None:
    """Called for the items below this folder alone (a hook of a folder's conftest)."""
    refuse_engine_tests(item)
