"""`tuneplane-node ctl` against real daemons (`serve` in a process of its own): what an
operator sees, its exit codes, its token and TLS options.

This module holds the ones that need an engine; tests/http/test_ctl.py has the rest."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import http.server
import json
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ctlcommand import Ctl, Node, StartNode, api, wait_for_port
from tests.engines.test_daemon_prefetch import REPOSITORY, prefetch_image
from tests.support.console import HEADERS, TOKEN
from tests.support.daemons import free_port, interruptible, python_path, spawn_daemon
from tests.support.engines import docker_host, engine_missing, engine_settings, podman_url
from tests.support.images import IMAGE, forget_image
from tests.support.jobs import unique
from tests.support.nodes import storage_root
from tests.support.proxies import PROXY_PORTS, ThrottlingProxy
from tests.support.runtimes import TrackingRuntime
from tests.support.waiting import wait_until
from tuneplane_node.ctl.commands import NOT_OK
from tuneplane_node.runtime.engines.docker import DockerRuntime

# Slow: the ctl command end to end against a node over a real socket.
pytestmark = pytest.mark.slow


def docker_node_settings() -> dict[str, str]:
    """The shared Docker engine, two cards written in labels and handed to no container."""
    settings = {
        "TUNEPLANE_LOCAL_RUNTIME": "docker",
        "TUNEPLANE_LOCAL_GPU_COUNT": "2",
        "TUNEPLANE_LOCAL_GPU_PASSTHROUGH": "false",
    }
    host = docker_host()
    if host:
        settings["TUNEPLANE_DOCKER_HOST"] = host
    return settings


async def _remove(names: list[str]) -> None:
    runtime = DockerRuntime(engine_settings("docker"))
    try:
        for name in names:
            await runtime.remove(name)
    finally:
        await runtime.close()


async def _docker_error() -> str | None:
    runtime = DockerRuntime(engine_settings("docker"))
    try:
        health = await runtime.health()
    finally:
        await runtime.close()
    return None if health.ok else health.error or "no answer"


@pytest.fixture
def docker_node(start_node: StartNode) -> Iterator[Node]:
    """A node on the shared Docker engine; what a test records in ``made`` is removed."""
    error = asyncio.run(_docker_error())
    if error is not None:
        engine_missing("docker", error)
    node = start_node(**docker_node_settings())
    yield node
    asyncio.run(_remove(node.made))


# --- on the Docker engine -----------------------------------------------------------------

VOLATILE = {"state_cache", "disk"}  # ages and free space move between two calls


@pytest.mark.engine
def test_json_health_is_the_apis_own_answer(ctl: Ctl, docker_node: Node) -> None:
    # Once the disk monitor has said what holds a job's disk: a fresh node's first pass
    # moves `job_disk.held_by` (null, then "monitor"), once, between two answers.
    def held() -> object:
        return api(docker_node, "/node/v1/health")["job_disk"]["held_by"]

    asyncio.run(wait_until(lambda: held() is not None))
    for args in (("--json", "health"), ("health", "--json")):
        code, out, _ = ctl(*args, url=docker_node.url)
        assert code == 0
        mine, theirs = json.loads(out), api(docker_node, "/node/v1/health")
        assert mine.keys() == theirs.keys()
        assert {k: v for k, v in mine.items() if k not in VOLATILE} == {
            k: v for k, v in theirs.items() if k not in VOLATILE
        }
        assert mine["state_cache"].keys() == theirs["state_cache"].keys()


@pytest.mark.engine
def test_health_says_card_jobs_cannot_run_and_exits_5(ctl: Ctl, start_node: StartNode) -> None:
    """Issue 36, finding 3: "health ok, 2 free" while every card launch was a 409."""
    error = asyncio.run(_docker_error())
    if error is not None:
        engine_missing("docker", error)
    node = start_node(**{**docker_node_settings(), "TUNEPLANE_LOCAL_GPU_PASSTHROUGH": "true"})
    code, out, _ = ctl("health", url=node.url)
    assert code == 5, out
    assert re.search(r"health +ok", out)
    assert re.search(r"card jobs +CANNOT RUN: docker has no nvidia runtime", out), out
    assert "nvidia-ctk runtime configure" in " ".join(out.split())  # the fix, maybe wrapped
    assert ctl("health", "--json", url=node.url)[0] == 5


@pytest.mark.engine
def test_health_under_a_pressure_that_refuses_launches_is_not_ok(
    ctl: Ctl, start_node: StartNode
) -> None:
    """Issue 50: every launch was a 507 while health said ``ok: true``. This machine's
    store has some percent of its inodes used: a 1% threshold is passed (the GC off: the
    shared engine's images are the other tests')."""
    error = asyncio.run(_docker_error())
    if error is not None:
        engine_missing("docker", error)
    pressed = {"TUNEPLANE_INODE_HIGH_PERCENT": "1", "TUNEPLANE_INODE_LOW_PERCENT": "0"}
    node = start_node(**docker_node_settings(), **pressed, TUNEPLANE_IMAGE_GC="off")
    code, out, _ = ctl("health", url=node.url)
    assert code == 4, out
    assert "NOT OK" in out and "inode_pressure" in out
    answer = api(node, "/node/v1/health")
    assert answer["ok"] is False and answer["launch_refused_reason"] == "inode_pressure"
    assert answer["conditions"]["inode_pressure"] is True
    scrape = urllib.request.Request(f"{node.url}/metrics", headers=HEADERS)
    with urllib.request.urlopen(scrape, timeout=30) as reply:
        assert b"tuneplane_node_health_ok 0.0" in reply.read()


@pytest.mark.engine
def test_health_and_inventory_render_as_tables(ctl: Ctl, docker_node: Node, tmp_path: Path) -> None:
    code, out, _ = ctl("health", url=docker_node.url)
    assert code == 0
    assert re.search(r"health +ok", out) and re.search(r"engine +docker \d", out)
    assert re.search(r"card jobs +can run", out)
    assert "2 total, 2 free, 0 reserved" in out
    assert re.search(r"│ 0 +│ unknown .*│ free +│", out)  # card 0 in the cards table
    code, out, _ = ctl("inventory", url=docker_node.url)
    assert code == 0
    assert api(docker_node, "/node/v1/inventory")["node_id"] in out
    root = re.escape(str(storage_root(tmp_path)))
    assert re.search(rf"│ {root} +│ \w+", out)  # the storage root and its filesystem


@pytest.mark.engine
def test_a_job_launched_observed_logged_stopped_and_removed(ctl: Ctl, docker_node: Node) -> None:
    run_id = unique("ctl")
    ref = f"tuneplane-{run_id}"
    docker_node.made.append(ref)
    url = docker_node.url
    code, out, _ = ctl("launch", "--run-id", run_id, "--image", IMAGE, "--gpus", "1",
                       "--env", "GREETING=hello", "--label", "tuneplane.user=ops",
                       "--", "/bin/sh", "-c", "echo $GREETING; sleep 300", url=url)  # fmt: skip
    assert code == 0
    assert re.fullmatch(rf"{ref}: running on cards \[0\], container [0-9a-f]{{12}}\n", out)
    code, out, _ = ctl("observe", ref, "tuneplane-nobody", url=url)
    assert re.search(rf"│ {ref} +│ running +│ \d+s +│ {run_id} +│ 0 ", out)
    assert re.search(r"│ tuneplane-nobody +│ absent ", out)
    deadline = time.monotonic() + 10
    while "hello" not in ctl("logs", ref, url=url)[1]:
        assert time.monotonic() < deadline, "the job's output never came"
        time.sleep(0.1)
    assert ctl("stop", ref, "--timeout", "1", url=url)[1:] == (f"stopped {ref}\n", "")
    states = json.loads(ctl("observe", ref, "--json", url=url)[1])["states"]
    assert states[ref]["status"] == "exited" and states[ref]["labels"]["tuneplane.user"] == "ops"
    # 143: the shell heard SIGTERM through the job's init (as PID 1 it ignored it: 137)
    assert re.search(rf"│ {ref} +│ exited \(143\) ", ctl("observe", ref, url=url)[1])
    assert ctl("remove", ref, url=url)[1] == f"removed {ref}\n"
    assert "absent" in ctl("observe", ref, url=url)[1]


@pytest.mark.engine
def test_logs_follow_streams_until_the_job_exits(ctl: Ctl, docker_node: Node) -> None:
    run_id = unique("ctl")
    ref = f"tuneplane-{run_id}"
    docker_node.made.append(ref)
    command = ("--", "/bin/sh", "-c", "echo first; sleep 2; echo second")
    assert (
        ctl("launch", "--run-id", run_id, "--image", IMAGE, *command, url=docker_node.url)[0] == 0
    )
    code, out, _ = ctl("logs", ref, "-f", url=docker_node.url)
    assert code == 0
    assert "first" in out and "second" in out  # the second line came after ctl asked


# --- launch --wait in a terminal ----------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]|\x1b\][^\x07]*\x07")


async def spawn_in_terminal(
    argv: list[str], env: dict[str, str], *, columns: int
) -> tuple[asyncio.subprocess.Process, int]:
    """``python -m tuneplane_node ARGV`` on a new pseudo-terminal of 40 rows and COLUMNS:
    the process and the terminal's master side, which the caller reads and closes."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tuneplane_node", *argv,
        stdin=slave, stdout=slave, stderr=slave, env=env, preexec_fn=interruptible,
    )  # fmt: skip
    os.close(slave)  # the child holds it: the master reads EIO once the child is gone
    return process, master


def terminal_env(home: Path, port: int) -> dict[str, str]:
    """What ``ctl`` on a terminal needs to reach the daemon on ``port``: nothing else."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "PYTHONPATH": python_path(),
        "TERM": "xterm-256color",
        "TUNEPLANE_NODE_TOKEN": TOKEN,
        "TUNEPLANE_CTL_URL": f"http://127.0.0.1:{port}",
    }


async def run_in_terminal(
    argv: list[str], env: dict[str, str], timeout: float = 120
) -> tuple[int, str]:
    """``python -m tuneplane_node ARGV`` on a pseudo-terminal of 120 columns: its exit
    code and everything it drew, escape sequences removed."""
    process, master = await spawn_in_terminal(argv, env, columns=120)
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[None] = loop.create_future()
    drawn = bytearray()

    def readable() -> None:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the terminal's other side is closed
            data = b""
        drawn.extend(data)
        if not data and not closed.done():
            closed.set_result(None)

    loop.add_reader(master, readable)
    try:
        await asyncio.wait_for(closed, timeout)
    finally:
        loop.remove_reader(master)
        os.close(master)
    code = await asyncio.wait_for(process.wait(), 10)
    return code, ANSI.sub("", drawn.decode("utf-8", "replace"))


@pytest.mark.engine
async def test_launch_wait_draws_the_pull_and_ends_running(
    tmp_path: Path, proxy: ThrottlingProxy, docker_runtime: TrackingRuntime
) -> None:
    image = await proxy.big_image(docker_runtime, rate=1_500_000)  # ~9 MB: some seconds
    port = free_port()
    daemon = spawn_daemon(tmp_path, port, settings_of=docker_node_settings())
    run_id = unique("ctl")
    docker_runtime.track(f"tuneplane-{run_id}")
    env = terminal_env(tmp_path, port)
    try:
        await asyncio.to_thread(wait_for_port, Node("", daemon), port, tmp_path / "serve.log")
        argv = ["ctl", "launch", "--run-id", run_id, "--image", image, "--gpus", "1", "--wait",
                "--", "/bin/sleep", "300"]  # fmt: skip
        code, drawn = await run_in_terminal(argv, env)
    finally:
        daemon.kill()
        await asyncio.to_thread(daemon.wait, 10)
    assert code == 0, drawn
    assert f"tuneplane-{run_id}: pulling {image}" in drawn
    bar = re.search(
        r"pulling \S+ .*?(\d+(\.\d+)?/\d+(\.\d+)? [KM]iB) +(\d+(\.\d+)? [KM]iB/s)", drawn
    )
    assert bar is not None, drawn  # bytes done of total, and the rate
    assert re.search(r"[01]/1 layers", drawn), drawn
    assert drawn.rstrip().endswith(f"tuneplane-{run_id}: running"), drawn


@pytest.mark.engine
def test_a_failed_launch_wait_is_one_line_on_stderr_in_a_pipe(
    docker_node: Node, tmp_path: Path
) -> None:
    """Issue 25, finding 6: the failure went to stdout, wrapped at 80 columns in a pipe."""
    run_id = unique("ctl")
    docker_node.made.append(f"tuneplane-{run_id}")
    image = f"127.0.0.1:5000/tuneplane-test/{unique('missing')}:1"
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": python_path(),
        "TUNEPLANE_NODE_TOKEN": TOKEN,
        "TUNEPLANE_CTL_URL": docker_node.url,
    }  # no COLUMNS, no terminal: rich would wrap at 80
    argv = ["ctl", "launch", "--run-id", run_id, "--image", image, "--wait", "--", "/bin/true"]
    done = subprocess.run(
        [sys.executable, "-m", "tuneplane_node", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "failed" not in done.stdout, done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"tuneplane-node ctl: tuneplane-{run_id}: failed: ")
    assert image in lines[0] and len(lines[0]) > 80


# --- stats ---------------------------------------------------------------------------------


@pytest.fixture
def sampled_node(start_node: StartNode) -> Iterator[Node]:
    """A node on the shared Docker engine sampling its jobs every second."""
    error = asyncio.run(_docker_error())
    if error is not None:
        engine_missing("docker", error)
    node = start_node(**docker_node_settings(), TUNEPLANE_STATS_INTERVAL_S="1")
    yield node
    asyncio.run(_remove(node.made))


def launch_burning(ctl: Ctl, node: Node) -> str:
    run_id = unique("ctl")
    node.made.append(f"tuneplane-{run_id}")
    burn = ("--", "/bin/sh", "-c", "while :; do :; done")
    assert (
        ctl("launch", "--run-id", run_id, "--image", IMAGE, "--gpus", "1", *burn, url=node.url)[0]
        == 0
    )
    return f"tuneplane-{run_id}"


@pytest.mark.engine
def test_json_stats_is_the_apis_own_answer(ctl: Ctl, sampled_node: Node) -> None:
    ref = launch_burning(ctl, sampled_node)
    url, refs = sampled_node.url, [ref, "tuneplane-nobody"]
    for _ in range(20):  # a sample may land between the two calls: ask again
        code, out, _ = ctl("stats", *refs, "--json", url=url)
        request = urllib.request.Request(
            url + "/node/v1/stats", data=json.dumps({"refs": refs}).encode(), headers=HEADERS
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            theirs = json.loads(reply.read())
        if json.loads(out) == theirs:
            break
    assert code == 0 and json.loads(out) == theirs
    assert theirs["stats"]["tuneplane-nobody"] == {"exists": False, "status": None}
    assert [card["index"] for card in theirs["stats"][ref]["gpus"]] == [0]


@pytest.mark.engine
async def test_stats_draws_a_live_table_in_a_terminal(tmp_path: Path) -> None:
    if (error := await _docker_error()) is not None:
        engine_missing("docker", error)
    port = free_port()
    settings = {**docker_node_settings(), "TUNEPLANE_STATS_INTERVAL_S": "1"}
    daemon = spawn_daemon(tmp_path, port, settings_of=settings)
    env = terminal_env(tmp_path, port)
    run_id = unique("ctl")
    ref = f"tuneplane-{run_id}"
    try:
        await asyncio.to_thread(wait_for_port, Node("", daemon), port, tmp_path / "serve.log")
        burn = ["--", "/bin/sh", "-c", "while :; do :; done"]
        launched = await run_in_terminal(
            ["ctl", "launch", "--run-id", run_id, "--image", IMAGE, *burn], env
        )
        assert launched[0] == 0, launched[1]
        # The limit is the node's default: the machine's memory less its reserve.
        # Two pids: the job's shell and its init.
        live = re.compile(rf"│ {ref} +│ running +│ \d\.\d\d cores +│ .*B / [\d.]+ [KMGT]iB +│ 2 ")
        code, drawn = await interrupt_in_terminal(
            ["ctl", "stats", ref, "--interval", "0.5"], env, until=live, times=2
        )
    finally:
        await _remove([ref])
        daemon.kill()
        await asyncio.to_thread(daemon.wait, 10)
    assert code == 0, drawn
    assert drawn.count(f"│ {ref} ") >= 2, drawn  # drawn again, in place
    assert "Traceback" not in drawn


async def interrupt_in_terminal(
    argv: list[str],
    env: dict[str, str],
    *,
    until: re.Pattern[str],
    times: int = 1,
    timeout: float = 60,
) -> tuple[int, str]:
    """``python -m tuneplane_node ARGV`` on a pseudo-terminal until what it drew matches
    ``until`` ``times`` times, then Ctrl-C: its exit code and what it drew, escapes removed."""
    process, master = await spawn_in_terminal(argv, env, columns=160)
    drawn = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while len(until.findall(ANSI.sub("", drawn.decode("utf-8", "replace")))) < times:
            assert time.monotonic() < deadline, ANSI.sub("", drawn.decode("utf-8", "replace"))
            drawn.extend(await asyncio.to_thread(_read_some, master))
        process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(process.wait(), 10)
        while chunk := await asyncio.to_thread(_read_some, master):
            drawn.extend(chunk)
    finally:
        if process.returncode is None:
            process.kill()
        os.close(master)
    return code, ANSI.sub("", drawn.decode("utf-8", "replace"))


def _read_some(fd: int) -> bytes:
    """What the terminal has within 0.5 s: b"" when nothing came, or its other side is
    closed (EIO)."""
    ready, _, _ = select.select([fd], [], [], 0.5)
    try:
        return os.read(fd, 65536) if ready else b""
    except OSError:
        return b""


# --- a registry's words on the operator's terminal ---------------------------------------

# A window title, a clear screen, a clipboard write (OSC 52), a CSI in C1, rich markup.
HOSTILE = (
    "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;cm0gLXJmIH4=\x07\x9b1m[link=https://evil.example]x[/link]"
)


@pytest.fixture
def hostile_registry() -> Iterator[str]:
    """A registry on loopback whose every manifest is unknown, in words it chose (a port
    engines.sh marks insecure for podman)."""

    class Registry(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/v2/":
                self._answer(200, {})
            else:
                self._answer(404, {"errors": [{"code": "MANIFEST_UNKNOWN", "message": HOSTILE}]})

        do_HEAD = do_GET  # noqa: N815 (http.server's name)

        def _answer(self, status: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = None
    for port in PROXY_PORTS:  # podman pulls over plain HTTP from these ports only
        with contextlib.suppress(OSError):
            server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Registry)
            break
    assert server is not None, f"no free port in {PROXY_PORTS}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def engine_node_settings(engine: str) -> dict[str, str]:
    if engine == "docker":
        return docker_node_settings()
    return {
        "TUNEPLANE_LOCAL_RUNTIME": "podman",
        "TUNEPLANE_PODMAN_URL": podman_url(),
        "TUNEPLANE_LOCAL_GPU_COUNT": "2",
        "TUNEPLANE_LOCAL_GPU_PASSTHROUGH": "false",
    }


@pytest.mark.engine
@pytest.mark.parametrize("engine", ["docker", "podman"])
def test_a_registrys_words_reach_the_terminal_as_text(
    ctl: Ctl,
    start_node: StartNode,
    hostile_registry: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    engine: str,
) -> None:
    """Finding 11 of issue 25: a registry controls the text of a failed pull, and
    ``ctl observe`` and ``ctl health`` printed it raw (a window title, a clear screen, a
    clipboard write), with rich's markup live. It is text, its controls escaped; so is the
    daemon's log line about the pull."""
    node = start_node(**engine_node_settings(engine))
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich writes as to a terminal: styles and links
    run_id = unique("ctl")
    ref = f"tuneplane-{run_id}"
    image = f"{hostile_registry}/evil/image:1"
    assert ctl("launch", "--run-id", run_id, "--image", image, url=node.url)[0] == 0
    deadline = time.monotonic() + 60
    while True:
        state = json.loads(ctl("observe", ref, "--json", url=node.url)[1])["states"][ref]
        if state.get("pending_phase") == "failed":
            break
        assert time.monotonic() < deadline, state
        time.sleep(0.2)
    assert "\x1b]0;pwned" in state["pending_error"]  # the API answers the engine's words

    for verb in ("observe", "health"):
        code, out, _ = ctl(verb, *([ref] if verb == "observe" else []), url=node.url)
        # health: 4 where the node is not ok, which an engine slower than health's 1.5 s
        # wait makes it on a loaded machine (seen in CI); its words are what is tested.
        assert code in ((0, NOT_OK) if verb == "health" else (0,)), (verb, code, out)
        assert "pwned" in out, out  # the error is shown...
        for control in ("\x1b]", "\x1b[2J", "\x07", "\x9b"):  # ...none of its controls
            assert control not in out, (verb, control, out)
        assert "[link=https://evil.example]" in out, out  # its markup as text
        assert "\\x1b]0;pwned\\x07" in out.replace("\n", "").replace("│", "")
    served_log = (tmp_path / "serve.log").read_text()
    assert "pwned" in served_log and "\x1b" not in served_log and "\x9b" not in served_log


@pytest.mark.engine
async def test_pull_wait_draws_the_bar_with_rate_and_eta_and_ends_present(
    tmp_path: Path, proxy: ThrottlingProxy, docker_runtime: TrackingRuntime
) -> None:
    prefetch_image(tmp_path)
    image = f"{proxy.address()}/{REPOSITORY}:1"
    await forget_image(docker_runtime, image)
    proxy.rate = 4_000_000  # ~24 MB: some seconds
    port = free_port()
    daemon = spawn_daemon(tmp_path, port, settings_of=docker_node_settings())
    env = terminal_env(tmp_path, port)
    try:
        await asyncio.to_thread(wait_for_port, Node("", daemon), port, tmp_path / "serve.log")
        code, drawn = await run_in_terminal(["ctl", "pull", image, "--wait"], env)
    finally:
        daemon.kill()
        await asyncio.to_thread(daemon.wait, 10)
        await forget_image(docker_runtime, image)
    assert code == 0, drawn
    assert f"{image}: pulling" in drawn
    bar = re.search(
        r"pulling \S+ .*?\d+(\.\d+)?/\d+(\.\d+)? MiB +\d+(\.\d+)? [KM]iB/s +ETA \d", drawn
    )
    assert bar is not None, drawn  # bytes done of total, the node's rate and time left
    assert re.search(r"\d/\d layers", drawn), drawn
    assert drawn.rstrip().endswith(f"{image}: present"), drawn
