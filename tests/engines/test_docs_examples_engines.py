"""Every curl and ctl example of README.md and docs/*.md, run as a reader runs it.

Issue 36, finding 9: the README's checkpoint example was refused as written, api.md
showed its errors twice (once without `code`) and its answers spaced where the node
prints compact JSON. Each file's examples (`tests/docexamples.py` says which blocks are
examples, and how one is excluded, with its reason) run in one bash, in order, against a
real daemon on the suite's Docker engine for the tests that act on every container of
the node (docker-own: an example reaps every exited job, `max_age_s` 0, and on the
engine the other tests share it reaped theirs too, seen in CI), as the README starts
it: the token `change-me-to-a-long-secret`, the jobs' storage in `/tmp/demo` (here a
directory of the test's, and the port one of its own, both written back as the docs
have them, as is the engine's data root), and two simulated cards without passthrough.
What each command prints is compared with what the docs show, ids, digests and times
normalised."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.docexamples import (
    SOURCES,
    Example,
    examples,
    normalised,
    rewritten,
)
from tests.support.daemons import REPO, free_port, spawn_daemon
from tests.support.engines import DEV_ROOT, engine_missing, own_docker_host
from tests.support.nodes import state_dir
from tuneplane_node.wire import PROTOCOL, PROTOCOL_HEADER

DOC_TOKEN = "change-me-to-a-long-secret"
DOC_PORT = "127.0.0.1:8470"
DOC_STORAGE = "/tmp/demo"
DOC_STATE = "/root/.tuneplane-node"  # the default state dir of the README's daemon, as root
DOC_ENGINE_ROOT = "/var/lib/tuneplane-dev/docker"  # the data root of the README's engine
END = "@@example-command-ended@@"


def runnable(path: Path) -> list[Example]:
    return [example for example in examples(path) if example.not_run is None]


# --- the examples against a daemon ----------------------------------------------------------


@pytest.mark.engine
@pytest.mark.own_engines
@pytest.mark.slow
@pytest.mark.parametrize(
    "path", [p for p in SOURCES if runnable(p)], ids=lambda p: str(p.relative_to(REPO))
)
def test_the_examples_print_what_the_docs_show(path: Path, tmp_path: Path) -> None:
    host = own_docker_host()
    if not Path(host.removeprefix("unix://")).exists():
        engine_missing("docker", f"no socket at {host}")
    storage, port = tmp_path / "demo", free_port()
    (storage / "data").mkdir(parents=True)
    daemon = spawn_daemon(
        tmp_path,
        port,
        TUNEPLANE_NODE_TOKEN=DOC_TOKEN,
        TUNEPLANE_STORAGE_ROOT=str(storage),
        TUNEPLANE_LOCAL_RUNTIME="docker",
        TUNEPLANE_DOCKER_HOST=host,
        TUNEPLANE_LOCAL_GPU_COUNT="2",
        TUNEPLANE_LOCAL_GPU_PASSTHROUGH="false",
    )
    chosen = runnable(path)
    try:
        listening(daemon, port)
        printed = run_in_bash(chosen, tmp_path, storage, port)
    finally:
        remove_jobs(chosen, port)
        daemon.terminate()
        daemon.wait(timeout=60)
    readable = [[readable_output(o, port, storage) for o in out] for out in printed]
    if os.environ.get("TUNEPLANE_DOCS_UPDATE") == "1":  # by hand: the docs take the output
        by_line = dict(zip([e.line for e in chosen], readable, strict=True))
        path.write_text(rewritten(path, by_line))
    differ = []
    for example, outputs in zip(chosen, readable, strict=True):
        for command, output in zip(example.commands, outputs, strict=True):
            wanted = normalised("\n".join(command.printed))
            got = normalised(output)
            if got != wanted:
                differ.append(f"{example.name}: $ {command.text}\n  docs: {wanted}\n  node: {got}")
    assert not differ, "\n".join(differ)


def readable_output(output: str, port: int, storage: Path) -> str:
    """The output as the docs show it: their port, storage, state and engine data root, no
    trailing blanks."""
    output = output.replace(f"127.0.0.1:{port}", DOC_PORT).replace(str(storage), DOC_STORAGE)
    output = output.replace(str(state_dir(storage.parent)), DOC_STATE)
    output = output.replace(str(DEV_ROOT / "docker-own"), DOC_ENGINE_ROOT)
    return "\n".join(line.rstrip() for line in output.splitlines())


def listening(daemon: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        assert daemon.poll() is None and time.monotonic() < deadline, "the daemon did not start"
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        time.sleep(0.1)


def run_in_bash(chosen: list[Example], tmp_path: Path, storage: Path, port: int) -> list[list[str]]:
    """Each command's output (stdout and stderr), per example, run in one bash in order."""
    shims = tmp_path / "bin"
    shims.mkdir()
    shim = shims / "tuneplane-node"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m tuneplane_node "$@"\n')
    shim.chmod(0o755)
    script = []
    for example in chosen:
        for command in example.commands:
            text = command.text.replace(DOC_PORT, f"127.0.0.1:{port}")
            text = text.replace(DOC_STORAGE, str(storage)).replace(
                ".venv/bin/tuneplane-node", "tuneplane-node"
            )
            # An answer may end without a newline; `$?` stays the command's.
            script += [text, f"status=$?; echo; echo {END}; (exit $status)"]
    env = {
        "PATH": f"{shims}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(tmp_path),
        "TUNEPLANE_NODE_TOKEN": DOC_TOKEN,
        "TUNEPLANE_CTL_URL": f"http://127.0.0.1:{port}",
    }
    done = subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    pieces = re.split(rf"^{END}\n", done.stdout, flags=re.MULTILINE)
    outputs = [piece.rstrip("\n") for piece in pieces]
    found: list[list[str]] = []
    for example in chosen:
        found.append(outputs[: len(example.commands)])
        outputs = outputs[len(example.commands) :]
    return found


def remove_jobs(chosen: list[Example], port: int) -> None:
    """The jobs the examples launched (named by their run ids), and nothing else: through
    the daemon, which also lets go of their staged mounts."""
    texts = "\n".join(command.text for example in chosen for command in example.commands)
    runs = set(re.findall(r'"run_id": "([\w.-]+)"|--run-id (\S+)', texts))
    for ref in sorted(f"tuneplane-{a or b}" for a, b in runs):
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/node/v1/remove",
            data=json.dumps({"ref": ref}).encode(),
            headers={"Authorization": f"Bearer {DOC_TOKEN}", PROTOCOL_HEADER: str(PROTOCOL)},
        )
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=60):
            pass
