"""Where a test's daemon serves, as the OpenAPI fuzz asks it: what
tests/http/test_daemon_openapi.py and tests/engines/test_daemon_openapi_engines.py share."""

from __future__ import annotations

from tests.support.console import Console


def base_url(console: Console) -> str:
    return str(console.client.make_url("")).rstrip("/")
