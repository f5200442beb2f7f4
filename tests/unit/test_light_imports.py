"""The clients load no daemon code: `import tuneplane_node.ctl` (the operators' client)
and `tuneplane_node.client` (the consoles', its own distribution) bring in no module of
`jobs/`, `runtime/`, `gpu/` or `daemon/`. Checked in a fresh interpreter, where
`sys.modules` holds exactly what the import loaded (issue 35: ctl once loaded 65 modules
of the package, the job service included)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

DAEMON_ROOMS = {"jobs", "runtime", "gpu", "daemon"}


def loaded(module: str) -> list[str]:
    """The package's modules a fresh interpreter holds after importing ``module``."""
    code = (
        f"import json, sys, {module}\n"
        "print(json.dumps(sorted(n for n in sys.modules if n.startswith('tuneplane_node.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


def test_ctl_loads_no_daemon_code() -> None:
    names = loaded("tuneplane_node.ctl")
    assert "tuneplane_node.ctl.commands" in names  # its verbs are loaded, and their wire
    assert [name for name in names if name.split(".")[1] in DAEMON_ROOMS] == []


def test_the_consoles_client_loads_only_itself() -> None:
    """Its distribution ships `tuneplane_node.client` alone: any other module of the
    package it loaded would be missing where a console installs it."""
    names = loaded("tuneplane_node.client")
    assert "tuneplane_node.client.sync" in names
    assert [name for name in names if not name.startswith("tuneplane_node.client")] == []


@pytest.mark.slow  # the daemon's import is a few seconds on a loaded machine
def test_the_check_sees_daemon_code_where_there_is_some() -> None:
    """The check can fail: the daemon's own front door loads the job service."""
    assert "tuneplane_node.jobs.service" in loaded("tuneplane_node.daemon.routes")
