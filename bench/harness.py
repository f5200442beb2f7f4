"""What every benchmark shares: the daemon as a real subprocess, a fleet of labelled
containers on the engine, an API client over a real socket, the machine line, statistics.

Every container a benchmark makes is named ``tuneplane-bench-*`` and removed again, also
when the run fails; leftovers of an earlier, killed run are removed at start. Other
people's containers on the same engine are never touched.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import docker
import docker.errors
import requests

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the scripts run from a checkout, not an install

from tuneplane_node.wire import PROTOCOL, PROTOCOL_HEADER  # noqa: E402
from tuneplane_node.wire.values import LABEL_GPUS, LABEL_RUN_ID  # noqa: E402

PREFIX = "tuneplane-bench-"
IMAGE = "tuneplane-test/busybox:1"
SLEEP = ["/bin/sleep", "3600"]
TOKEN = "bench-token-0123456789"
HEADERS = {"Authorization": f"Bearer {TOKEN}", PROTOCOL_HEADER: str(PROTOCOL)}
# Marks this run's containers, so a list can count exactly them among other people's.
LABEL_BENCH = "tuneplane-bench.session"
DEV_SOCKET = "unix:///run/tuneplane-dev/docker.sock"


def docker_host() -> str:
    explicit = os.environ.get("TUNEPLANE_BENCH_DOCKER_HOST") or os.environ.get("DOCKER_HOST")
    return explicit or DEV_SOCKET


def engine_client(*, pool: int = 16) -> docker.DockerClient:
    """A docker SDK client on the bench engine, pinned like the daemon's (no version probe)."""
    return docker.DockerClient(
        base_url=docker_host(), version="1.41", max_pool_size=pool, timeout=120
    )


# --- the command line and the machine ------------------------------------------------


def arguments(description: str, *, containers: int, rounds: int) -> argparse.ArgumentParser:
    """The options every script takes; a script adds its own before parsing."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--containers", type=int, default=containers, help="tracked containers")
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds (>= 5)")
    parser.add_argument(
        "--profile", metavar="PATH", help="py-spy the daemon meanwhile (.svg, or .txt: stacks)"
    )
    return parser


def peer_arguments(parser: argparse.ArgumentParser) -> None:
    """``--peer`` and ``--pairs``, for a script that compares two checkouts' daemons."""
    parser.add_argument(
        "--peer", metavar="CHECKOUT", help="another checkout's daemon, run alternately with this"
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=4,
        help="with --peer: runs of each (even: each side first as often)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="with --peer: runs of the peer's daemon first, not counted",
    )


def machine() -> str:
    """One line: cpus, cpu model, memory, python, docker engine version."""
    model = "unknown cpu"
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory_kb = meminfo("MemTotal")
    client = engine_client(pool=1)
    engine = client.version().get("Version", "?")
    client.close()
    load = load_average()
    return (
        f"machine: {os.cpu_count()} cpu ({model}), {memory_kb / 2**20:.1f} GiB, "
        f"python {platform.python_version()}, docker engine {engine}, {platform.release()}; "
        f"load average {load}; daemon code {code_version()}"
    )


def code_version(checkout: Path = REPO) -> str:
    """The commit a checkout's daemon code is at, and whether tuneplane_node/ differs."""
    git = ["git", "-C", str(checkout)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True)
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "tuneplane_node"], capture_output=True
        )
    except OSError:
        return "unknown"
    changed = " + uncommitted changes" if dirty.stdout.strip() else ""
    return head.stdout.decode().strip() + changed


def meminfo(field: str) -> int:
    with open("/proc/meminfo") as source:
        for line in source:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def proc_status_kib(field: str, pid: int | str = "self") -> int:
    """A memory line of /proc/<pid>/status (``VmRSS``, ``VmHWM``), in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} line in /proc/{pid}/status")


# --- statistics -------------------------------------------------------------------------


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def rotated(items: Sequence[Any], round_index: int) -> list[Any]:
    """The compared methods in a different order each round (interleaving)."""
    shift = round_index % len(items)
    return [*items[shift:], *items[:shift]]


def peer_checkout(path: str | None) -> Path | None:
    """``--peer PATH``: another checkout (a worktree at the commit to compare with)."""
    if path is None:
        return None
    checkout = Path(path).resolve()
    if not (checkout / "tuneplane_node" / "__init__.py").is_file():
        raise SystemExit(f"--peer {path}: no tuneplane_node/ there")
    return checkout


def this_or_alternated(
    peer: Path | None, args: argparse.Namespace, measure: Callable[[Path], dict[str, float]]
) -> None:
    """``measure`` this checkout's daemon once, or with ``--peer`` this and the peer's
    alternately over ``--pairs`` (`alternate`)."""
    if peer is None:
        measure(REPO)
    else:
        alternate(peer, args.pairs, measure, warmup=args.warmup)


def alternate(
    peer: Path, pairs: int, measure: Callable[[Path], dict[str, float]], *, warmup: int = 1
) -> None:
    """``measure`` this checkout's daemon and the peer's, one at a time, the first of each
    pair alternating; then each figure of both and its ratio per pair (this / peer), and
    the ratio of their geometric means over every run. A figure named ``... (x)`` is a
    ratio itself, any other a time in seconds (shown in us for a name ending ``(us)``).

    The first daemon of a pair measured higher CPU figures than the second, whichever it
    was (by up to 1.4x on this machine): a ratio per pair leans on the order, and its
    median over an odd number of pairs leans on the side that went first more often. The
    means over an even number of pairs put each side first as often. And the first daemon
    measured after the fleet is made ran 10 to 25 % hot in every series, whichever it
    was: ``warmup`` runs of the peer go first, not counted."""
    checkouts = {"this": REPO, "peer": peer}
    runs: dict[str, list[dict[str, float]]] = {"this": [], "peer": []}
    if pairs % 2:
        print(f"note: {pairs} pairs: `this` goes first once more than the peer")
    quiet_machine()
    for _ in range(warmup):
        print(f"\n=== warm-up, peer ({code_version(peer)}), not counted")
        measure(peer)
    for index in range(pairs):
        for which in ("this", "peer") if index % 2 == 0 else ("peer", "this"):
            version = code_version(checkouts[which])
            print(f"\n=== pair {index + 1}, {which} ({version}), load average {load_average()}")
            runs[which].append(measure(checkouts[which]))
    print(f"\n=== this {code_version()} against the peer {code_version(peer)}, per pair:")
    for figure in runs["this"][0]:
        shown: Callable[[float], str] = ms
        if figure.endswith("(x)"):
            shown = lambda v: f"{v:.1f}x"  # noqa: E731
        elif figure.endswith("(us)"):
            shown = lambda v: f"{v * 1e6:.1f} us"  # noqa: E731
        mine = [run[figure] for run in runs["this"]]
        theirs = [run[figure] for run in runs["peer"]]
        ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
        print(f"{figure}: this {', '.join(map(shown, mine))}; peer {', '.join(map(shown, theirs))}")
        print(
            f"  this / peer: {', '.join(f'{r:.3f}' for r in ratios)} "
            f"(median {median(ratios):.3f}, max {max(ratios):.3f}; "
            f"of the means {geometric_mean(mine) / geometric_mean(theirs):.3f})"
        )
    print(f"load average at the end: {load_average()}")


def pin(pid: int) -> None:
    """Every thread of the process ``pid`` (those it starts after inherit it) onto the
    machine's last CPU, and this process and its children onto the others: neither the
    scheduler's moves nor the clients' work land in the daemon's CPU figures."""
    last = max(os.sched_getaffinity(0))
    for thread in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(thread), {last})
    os.sched_setaffinity(0, os.sched_getaffinity(0) - {last} or {last})


def geometric_mean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if all(values) else 0.0


def quiet_machine(*, busy: float = 0.10, window_s: float = 2.0, timeout_s: float = 120) -> None:
    """Until the machine's CPUs are under ``busy`` over ``window_s`` (the fleet's start
    keeps the engine busy a while after its containers answer): the first pair would
    pay for it."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        before = _cpu_times()
        time.sleep(window_s)
        after = _cpu_times()
        total = after[0] - before[0]
        if total and (after[1] - before[1]) / total < busy:
            break
    print(f"machine quiet after {time.monotonic() - started:.1f} s", flush=True)


def _cpu_times() -> tuple[int, int]:
    """(all, busy) jiffies of every CPU so far (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields[:8]), sum(fields[:8]) - idle


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# --- the fleet of containers -------------------------------------------------------------


class Fleet:
    """Sleeping containers made straight on the engine, in parallel, and removed again."""

    def __init__(self, client: docker.DockerClient, *, tag: str = "c") -> None:
        self.client = client
        self.session = uuid.uuid4().hex[:8]
        self.tag = tag
        self.names: list[str] = []

    def name(self, index: int) -> str:
        return f"{PREFIX}{self.tag}-{self.session}-{index:04d}"

    def create(self, count: int, *, tracked: bool = True, workers: int = 8) -> list[str]:
        """``count`` running containers; tracked ones carry the daemon's run-id label."""
        names = [self.name(len(self.names) + i) for i in range(count)]
        self.names += names  # before creating: a failure half-way still cleans up
        started = time.monotonic()
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda name: self._start(name, tracked), names))
        print(f"created {count} containers in {time.monotonic() - started:.1f} s", flush=True)
        return names

    def _start(self, name: str, tracked: bool) -> None:
        labels = {LABEL_BENCH: self.session}
        if tracked:
            labels |= {LABEL_RUN_ID: name.removeprefix(PREFIX), LABEL_GPUS: ""}
        api = self.client.api
        config = api.create_host_config(network_mode="host")
        api.create_container(
            IMAGE,
            name=name,
            entrypoint=SLEEP[:1],
            command=SLEEP[1:],
            labels=labels,
            host_config=config,
            detach=True,
        )
        api.start(name)

    def remove(self, *, workers: int = 8) -> None:
        started = time.monotonic()
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda name: remove_container(self.client, name), self.names))
        print(f"removed {len(self.names)} containers in {time.monotonic() - started:.1f} s")
        self.names = []


def remove_container(client: docker.DockerClient, name: str) -> None:
    try:
        client.api.remove_container(name, force=True, v=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if "in progress" not in str(exc):
            raise


def remove_leftovers(client: docker.DockerClient) -> None:
    """Containers named tuneplane-bench-* from an earlier run that did not finish."""
    listed = client.api.containers(all=True, filters={"name": PREFIX})
    names = [c["Names"][0].lstrip("/") for c in listed]
    names = [name for name in names if name.startswith(PREFIX)]
    for name in names:
        remove_container(client, name)
    if names:
        print(f"removed {len(names)} leftover containers of an earlier run")


@contextmanager
def fleet(tag: str) -> Iterator[Fleet]:
    """A Fleet whose containers are removed whatever happens, leftovers cleared first."""
    client = engine_client()
    remove_leftovers(client)
    made = Fleet(client, tag=tag)
    try:
        yield made
    finally:
        made.remove()
        remove_leftovers(client)
        client.close()


# --- the daemon ---------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (all its threads, those gone
    too), to the nanosecond: the process's CPU clock (Linux's clock id of another process,
    CPUCLOCK_SCHED). /proc's figures count in ticks of 10 ms, a whole burst's cost or
    30 health requests': the per-request ratios scattered by a third from that alone."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:  # another kernel: the ticks
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(pid: int, *, busy: float = 0.15, window_s: float = 1.0, timeout_s: float = 45) -> None:
    """Wait until a daemon is done starting: its CPU over ``window_s`` under ``busy`` of
    one core. A fresh daemon's first passes (the disk monitor asks the engine where each
    running container writes, once per container) would fall into the first bursts,
    and they are a start-up's cost, not a request's."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        before = cpu_seconds(pid)
        time.sleep(window_s)
        if (cpu_seconds(pid) - before) / window_s < busy:
            break
    print(f"daemon settled after {time.monotonic() - started:.1f} s", flush=True)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Daemon:
    """``python3 -m tuneplane_node serve`` as a real subprocess, in a throwaway directory."""

    def __init__(
        self,
        *,
        python_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        checkout: Path = REPO,
    ):
        self.python_args = list(python_args)
        self.checkout = checkout  # whose tuneplane_node runs: this one, or a peer's
        self.extra_env = env or {}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.dir = Path(tempfile.mkdtemp(prefix="tuneplane-bench-daemon-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEPLANE_")}
        env |= {
            "PYTHONPATH": str(self.checkout),
            "TUNEPLANE_NODE_TOKEN": TOKEN,
            "TUNEPLANE_LOCAL_RUNTIME": "docker",
            "TUNEPLANE_DOCKER_HOST": docker_host(),
            "TUNEPLANE_LOCAL_GPU_COUNT": "0",
            "TUNEPLANE_NODE_STATE_DIR": str(self.dir / "state"),
            "TUNEPLANE_DEV_SHARED_ENGINE": "true",  # the development engine is everyone's
        }
        return env | self.extra_env

    def argv(self) -> list[str]:
        """The daemon's command line: ``serve`` on loopback (a bench may serve another)."""
        argv = [sys.executable, *self.python_args, "-m", "tuneplane_node", "serve"]
        return [*argv, "--host", "127.0.0.1", "--port", str(self.port)]

    def start(self, *, timeout: float = 120) -> Daemon:
        argv = self.argv()
        log = open(self.dir / "daemon.log", "wb")  # noqa: SIM115 (the child keeps it open)
        self.process = subprocess.Popen(
            argv, cwd=self.dir, env=self.environment(), stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        """/healthz answers only once the cache's first sync is over (it precedes serving)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"daemon exited at start:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/healthz", timeout=1).ok:
                    return
            except requests.RequestException:
                time.sleep(0.05)
        raise RuntimeError(f"daemon not ready after {timeout} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        text = (self.dir / "daemon.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def rss_kb(self) -> int:
        """VmRSS of the daemon process, from /proc/<pid>/status."""
        with open(f"/proc/{self.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS line")

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Daemon:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def profiled(daemon: Daemon, path: str | None) -> Iterator[None]:
    """py-spy records the daemon (all threads, idle ones left out) while the block runs.

    A path ending in .txt gets collapsed stacks (one line per stack and its sample count).
    """
    if not path:
        yield
        return
    form = "raw" if path.endswith(".txt") else "flamegraph"
    argv = ["py-spy", "record", "--pid", str(daemon.pid), "-o", path, "--rate", "250", "-f", form]
    recorder = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # py-spy attaches
    try:
        yield
    finally:
        recorder.send_signal(signal.SIGINT)
        recorder.wait(60)
        print(f"profile written to {path}")


# --- the API client ----------------------------------------------------------------------


class Api:
    """The console's calls, over a kept-alive TCP connection (requests)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()
        self.session.headers.update(HEADERS)

    def observe(self, refs: Sequence[str]) -> dict[str, Any]:
        answer = self.session.post(self.url + "/node/v1/observe", json={"refs": list(refs)})
        answer.raise_for_status()
        return answer.json()["states"]  # type: ignore[no-any-return]

    def healthz(self) -> None:
        self.session.get(self.url + "/healthz").raise_for_status()

    def health(self) -> dict[str, Any]:
        answer = self.session.get(self.url + "/node/v1/health")
        answer.raise_for_status()
        return answer.json()  # type: ignore[no-any-return]

    def launch(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.session.post(self.url + "/node/v1/launch", json=body)
        if answer.status_code != 200:
            raise RuntimeError(f"launch: {answer.status_code} {answer.text}")
        return answer.json()  # type: ignore[no-any-return]

    def remove(self, ref: str) -> None:
        self.session.post(self.url + "/node/v1/remove", json={"ref": ref}).raise_for_status()

    def wait_tracked(self, names: Sequence[str], *, timeout: float = 60) -> None:
        """Until observe shows every name running (the event stream has caught up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = self.observe(names)
            if all(state.get("status") == "running" for state in states.values()):
                return
            time.sleep(0.2)
        raise RuntimeError("the daemon never showed every container running")

    def metric(self, name: str) -> float:
        """One sample of the daemon's /metrics (0 when absent): ``name`` with its labels."""
        answer = self.session.get(self.url + "/metrics")
        answer.raise_for_status()
        for line in answer.text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    def close(self) -> None:
        self.session.close()
