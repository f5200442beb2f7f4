"""Engine-free tests through the node's front doors: its HTTP API (the daemon over a real
socket in front of the in-memory engine), its command lines (`serve`, `check`, `ctl`) and
the consoles' client, with daemons on the fake or the process runtime. A test here that
needs an engine belongs in tests/engines/: collection fails on one marked ``engine``."""

from __future__ import annotations

import pytest

from tests.conftest import refuse_engine_tests


def pytest_itemcollected(item: pytest.Item) -> None:
    """Called for the items below this folder alone (a hook of a folder's conftest)."""
    refuse_engine_tests(item)
