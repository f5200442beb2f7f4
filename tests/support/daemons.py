"""The daemon as a process of its own: `python -m tuneplane_node serve` from this checkout."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from tests.support.console import TOKEN
from tests.support.nodes import state_dir, storage_root

REPO = Path(__file__).resolve().parents[2]  # the checkout


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def python_path() -> str:
    """This checkout first, then whatever PYTHONPATH brought (a machine whose packages
    come that way, not from a venv's site-packages)."""
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def spawn_daemon(
    tmp_path: Path,
    port: int,
    *,
    preexec: Callable[[], None] | None = None,
    settings_of: Mapping[str, str] | None = None,
    **settings: str,
) -> subprocess.Popen[bytes]:
    """`python -m tuneplane_node serve` on loopback, its output in ``serve.log``; only
    the given settings (``settings_of`` and keywords; a state dir and storage root under
    ``tmp_path``) apply. ``TUNEPLANE_DEV_SHARED_ENGINE`` is on unless given: the
    suite's engines hold the daemons of every test at once."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": python_path(),
        "TUNEPLANE_NODE_TOKEN": TOKEN,
        "TUNEPLANE_NODE_STATE_DIR": str(state_dir(tmp_path)),
        "TUNEPLANE_STORAGE_ROOT": str(storage_root(tmp_path)),
        "TUNEPLANE_DEV_SHARED_ENGINE": "true",
        **(settings_of or {}),
        **settings,
    }
    if env.get("TUNEPLANE_LOCAL_RUNTIME") == "podman":
        # The suite's podman runs in the machine's own network namespace, whose firewall
        # the job networks' guard would write to (docker's run --iptables=false): its
        # jobs are bridged, as engine_settings has it. The network tests' throwaway
        # engines, in namespaces of their own, keep the node's default.
        env.setdefault("TUNEPLANE_JOB_NETWORK", "bridge")
    argv = [sys.executable, "-m", "tuneplane_node", "serve", "--host", "127.0.0.1"]
    with (tmp_path / "serve.log").open("a") as output:
        return subprocess.Popen(
            [*argv, "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec,
        )


def interruptible() -> None:
    """A child's ``preexec_fn``: Ctrl-C (SIGINT) ends it, as on a terminal. A suite started
    in the background (``cmd &`` in a script, as a CI runner may) ignores SIGINT, and
    an ignored signal stays ignored across exec: a child sent SIGINT would never hear it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
