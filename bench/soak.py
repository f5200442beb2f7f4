"""soak: launch/stop/remove cycles on a real engine; nothing may accumulate (issue 10).

The daemon runs in this process, served over a real TCP socket by the same runner, site
and connection guard as ``serve``, so that what a subprocess would hide can be counted:
its asyncio tasks, its per-ref locks, its pending records, its card claims and its state
cache. One aiohttp session in the same loop drives it. RSS, descriptors and threads are
therefore those of daemon and client together; the client's share is fixed after the
warm-up. Before every sample the garbage collector runs, so that a sample counts what is
still reachable, not cycles the collector has not reached yet.

One cycle: launch a sleeping busybox with one card, observe until it runs, stop it with
a grace of 0 s (SIGTERM, then SIGKILL), remove it. Every answer must be 200. Every 10th
launch first untags the registry's copy of the image and launches that, so it goes
through a pending record and a pull: without them the pending count could not fail.
Tolerances, final sample against the baseline (both taken after the same idle pause):
RSS +10 MiB, descriptors +5, threads +2, asyncio tasks +0; locks, pending records,
claims, cached states of this run, leftover containers and non-200 answers all 0.
Exit status 1 when one is broken.

Every container is named ``tuneplane-soak-<session>-*`` and carries the label
``tuneplane-soak.session=<session>``; whatever of this session is left on the engine is
removed at the end, also after Ctrl-C or SIGTERM. Besides them, only the registry tag
dropped before each pull is touched.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from array import array
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import aiohttp
import docker
import docker.errors
import requests
from aiohttp import web
from harness import (
    HEADERS,
    IMAGE,
    TOKEN,
    free_port,
    machine,
    median,
    percentile,
    proc_status_kib,
    remove_container,
)

from tuneplane_node.daemon.app import create_node_app
from tuneplane_node.daemon.server import BACKLOG, ConnectionGuard, GuardedSite, connection_limit
from tuneplane_node.daemon.state import NODE
from tuneplane_node.runtime.cache import CachedRuntime
from tuneplane_node.settings import NodeSettings, load_settings

OWN_ENGINE = "unix:///run/tuneplane-dev/docker-own.sock"
PREFIX = "tuneplane-soak-"
LABEL_SESSION = "tuneplane-soak.session"
COMMAND = ["/bin/sleep", "300"]
PULL_IMAGE = "127.0.0.1:5000/tuneplane-test/busybox:1"  # contrib/dev/engines.sh's registry
CARDS = 4
SAMPLE_EVERY = 100
IDLE_S = 2.0
RUNNING_TIMEOUT_S = 30.0
POLL_S = 0.01
MIB = 1024
# Growth allowed from the baseline to the final sample, in each metric's own unit.
GROWTH = {"rss_kib": 10 * MIB, "fds": 5, "threads": 2, "tasks": 0}
# Counts that must be exactly 0 in the final sample.
ZERO = ("locks", "pending", "claims", "pulls", "cached", "containers")


@dataclass(frozen=True)
class Sample:
    """What the process holds after ``cycle`` measured cycles."""

    cycle: int
    seconds: float  # since the baseline
    rss_kib: int
    fds: int
    threads: int
    tasks: int  # asyncio tasks, the soak's own driving task left out
    locks: int  # the job service's per-ref locks
    pending: int  # pending-launch records
    claims: int  # the allocator's card claims
    pulls: int  # image pulls the coordinator holds
    cached: int  # states of this session's containers in the state cache
    touched: int  # the cache's write times per name (pruned at every relist)
    objects: int  # objects the garbage collector tracks
    containers: int  # this session's containers on the engine


@dataclass(frozen=True)
class Failure:
    cycle: str
    verb: str
    status: int
    detail: str


class WarningCounter(logging.Handler):
    """Counts the daemon's warnings and errors, which are printed as they come as well."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


# --- the node --------------------------------------------------------------------------


def node_settings(workdir: Path, docker_host: str) -> NodeSettings:
    """The daemon's settings, with no GPU toolkit: cards from a simulation file, labelled
    but not handed to the container."""
    simulation = workdir / "gpus.json"
    cards = [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(CARDS)]
    simulation.write_text(json.dumps({"driver": "580.159.03", "cuda": "13.0", "cards": cards}))
    (workdir / "storage").mkdir()
    return load_settings(
        _env_file=None,  # a .env in the working directory must not change the run
        node_token=TOKEN,
        local_runtime="docker",
        docker_host=docker_host,
        local_gpu_passthrough=False,
        gpu_simulation_file=simulation,
        node_state_dir=workdir / "state",
        storage_root=workdir / "storage",
    )


async def serve(
    settings: NodeSettings, *, sweep: bool
) -> tuple[web.Application, web.AppRunner, str]:
    """The app built and served as ``tuneplane_node.daemon.server.serve`` does, on
    127.0.0.1; the runner, once set up, has started the app (its engine and cache)."""
    guard = ConnectionGuard(connection_limit())
    app = create_node_app(settings, middlewares=(guard.middleware(),), sweep=sweep)
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=settings.header_timeout_s,
        shutdown_timeout=settings.local_stop_timeout,
    )
    await runner.setup()
    port = free_port()
    site = GuardedSite(runner, guard, host="127.0.0.1", port=port, backlog=BACKLOG)
    await site.start()
    return app, runner, f"http://127.0.0.1:{port}"


# --- the cycles --------------------------------------------------------------------------


class Soak:
    """Drives the node through cycles and samples what the process holds."""

    def __init__(
        self,
        app: web.Application,
        *,
        url: str,
        http: aiohttp.ClientSession,
        engine: docker.DockerClient,
        session: str,
        pull_image: str,
    ) -> None:
        self.app = app
        self.url = url
        self.http = http
        self.engine = engine
        self.pull_image = pull_image
        self.pulled = 0  # launches answered "pulling": each made a pending record
        self.session = session
        self.failures: list[Failure] = []
        # Timings as C doubles (8 bytes each, no object): the soak's own records must
        # not be what makes the process grow (a list of floats costs ~32 bytes an entry).
        self.verb_seconds: dict[str, array[float]] = defaultdict(lambda: array("d"))
        self.started = time.monotonic()

    def name(self, cycle: str) -> str:
        return f"{PREFIX}{self.session}-{cycle}"

    def launch_body(self, cycle: str, image: str) -> dict[str, Any]:
        return {
            "run_id": f"soak-{self.session}-{cycle}",
            "requested_gpus": 1,
            "container": {
                "name": self.name(cycle),
                "image": image,
                "command": COMMAND,
                "labels": {LABEL_SESSION: self.session},
            },
        }

    async def call(self, verb: str, body: dict[str, Any], cycle: str) -> dict[str, Any] | None:
        """The answer's JSON, or None after recording a non-200 answer."""
        started = time.perf_counter()
        async with self.http.post(f"{self.url}/node/v1/{verb}", json=body) as answer:
            text = await answer.text()
        self.verb_seconds[verb].append(time.perf_counter() - started)
        if answer.status != 200:
            self.failures.append(Failure(cycle, verb, answer.status, text[:300]))
            print(f"  cycle {cycle}: {verb} answered {answer.status}: {text[:300]}", flush=True)
            return None
        return json.loads(text)  # type: ignore[no-any-return]

    async def wait_running(self, cycle: str) -> None:
        ref = self.name(cycle)
        deadline = time.monotonic() + RUNNING_TIMEOUT_S
        while time.monotonic() < deadline:
            answer = await self.call("observe", {"refs": [ref]}, cycle)
            state = answer["states"][ref] if answer else {}
            if answer is None or state.get("status") == "running":
                return
            if state.get("pending_phase") == "failed":
                self.failures.append(Failure(cycle, "observe", 0, str(state["pending_error"])))
                return
            await asyncio.sleep(POLL_S)
        self.failures.append(Failure(cycle, "observe", 0, "never running"))

    async def cycle(self, cycle: str, *, pull: bool = False) -> float:
        """One launch/observe/stop/remove; its seconds. Stop and remove run whatever the
        launch answered, so a failed cycle leaves nothing behind. With ``pull``, the
        registry's tag is dropped first: the launch then goes through a pending record."""
        ref = self.name(cycle)
        image = IMAGE
        if pull:
            self.untag(self.pull_image)  # before the clock starts: the soak's own work
            image = self.pull_image
        started = time.perf_counter()
        launched = await self.call("launch", self.launch_body(cycle, image), cycle)
        if launched is not None:
            self.pulled += launched.get("phase") == "pulling"
            await self.wait_running(cycle)
        await self.call("stop", {"ref": ref, "timeout": 0}, cycle)
        await self.call("remove", {"ref": ref}, cycle)
        return time.perf_counter() - started

    def untag(self, image: str) -> None:
        """Drop one tag; the layers stay under the image's other tag, so the pull that
        follows is a manifest fetch and a new tag (tens of ms), not a download."""
        try:
            self.engine.api.remove_image(image, noprune=True)
        except docker.errors.NotFound:
            pass  # absent already: the launch pulls it
        except docker.errors.APIError as exc:  # in use by a container: no pull this time
            print(f"  could not untag {image}: {exc}", flush=True)

    def sample(self, cycle: int) -> Sample:
        gc.collect()
        node = self.app[NODE]
        cache = node.runtime.cache if isinstance(node.runtime, CachedRuntime) else None
        mine = self.name("")
        current = asyncio.current_task()
        return Sample(
            cycle=cycle,
            seconds=time.monotonic() - self.started,
            rss_kib=proc_status_kib("VmRSS"),
            fds=len(os.listdir("/proc/self/fd")),
            threads=threading.active_count(),
            tasks=sum(1 for task in asyncio.all_tasks() if task is not current),
            locks=len(node.jobs.locks),
            pending=len(list(node.pending.records())),
            claims=len(node.allocator._claims),  # private: no public count exists
            pulls=len(node.pulls.pulls),
            cached=sum(1 for name in cache.states if name.startswith(mine)) if cache else -1,
            touched=len(cache.touched) if cache else -1,
            objects=len(gc.get_objects()),
            containers=len(session_containers(self.engine, self.session)),
        )


def session_containers(engine: docker.DockerClient, session: str) -> list[str]:
    """The ids of this session's containers on the engine, running or not."""
    listed = engine.api.containers(all=True, filters={"label": f"{LABEL_SESSION}={session}"})
    return [str(container["Id"]) for container in listed]


def remove_session(engine: docker.DockerClient, session: str) -> None:
    """Force-remove this session's containers, and only these; say what could not be."""
    try:
        ids = session_containers(engine, session)
        for container in ids:
            remove_container(engine, container)  # gone already, or going: fine
    except (docker.errors.DockerException, requests.RequestException) as exc:
        print(
            f"cleanup: the engine did not answer ({exc}); remove what carries "
            f"{LABEL_SESSION}={session} by hand"
        )
        return
    print(f"cleanup: removed {len(ids)} container(s) of session {session}")


# --- the run -----------------------------------------------------------------------------


@dataclass
class Latencies:
    """Seconds per measured cycle, those that went through a pull apart."""

    direct: array[float] = field(default_factory=lambda: array("d"))
    pulled: array[float] = field(default_factory=lambda: array("d"))


async def run_cycles(soak: Soak, args: argparse.Namespace) -> tuple[list[Sample], Latencies]:
    every: int = args.pull_every

    def pulls(index: int) -> bool:  # warm-up included: the pull path warms up too
        return every > 0 and index % every == 0

    for index in range(args.warmup):
        await soak.cycle(f"w{index:04d}", pull=pulls(index))
    samples = [await idle_sample(soak, 0)]
    print_header()
    print_sample(samples[0])
    latencies = Latencies()
    for index in range(1, args.cycles + 1):
        seconds = await soak.cycle(f"{index:05d}", pull=pulls(index))
        (latencies.pulled if pulls(index) else latencies.direct).append(seconds)
        if index % SAMPLE_EVERY == 0 and index != args.cycles:
            samples.append(soak.sample(index))
            print_sample(samples[-1])
    samples.append(await idle_sample(soak, args.cycles))
    print_sample(samples[-1])
    return samples, latencies


async def idle_sample(soak: Soak, cycle: int) -> Sample:
    """A sample after an idle pause: what the last cycle set going has settled."""
    await asyncio.sleep(IDLE_S)
    return soak.sample(cycle)


def cancel_on_signals() -> None:
    """SIGINT and SIGTERM (``timeout``, ``kill``) cancel the run: the node shuts down and
    main() removes this session's containers. Also when the shell started the run in the
    background with SIGINT ignored."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    for number in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(number, task.cancel)


async def soak_node(args: argparse.Namespace, engine: docker.DockerClient, session: str) -> int:
    cancel_on_signals()
    with tempfile.TemporaryDirectory(prefix="tuneplane-soak-") as workdir:
        settings = node_settings(Path(workdir), args.docker_host)
        app, runner, url = await serve(settings, sweep=args.sweep)
        try:
            timeout = aiohttp.ClientTimeout(total=120)
            async with aiohttp.ClientSession(headers=HEADERS, timeout=timeout) as http:
                soak = Soak(
                    app,
                    url=url,
                    http=http,
                    engine=engine,
                    session=session,
                    pull_image=args.pull_image,
                )
                print(
                    f"session {soak.session}: {args.warmup} warm-up cycles, then {args.cycles}; "
                    f"every {args.pull_every}th launch pulls {args.pull_image}"
                )
                samples, latencies = await run_cycles(soak, args)
                return report(soak, samples, latencies)
        finally:
            await runner.cleanup()


# --- the report --------------------------------------------------------------------------

COLUMNS = [f.name for f in fields(Sample)]


def print_header() -> None:
    print(" | ".join(COLUMNS), flush=True)


def print_sample(sample: Sample) -> None:
    values = []
    for name in COLUMNS:
        value = getattr(sample, name)
        values.append(f"{value:.1f}" if isinstance(value, float) else str(value))
    print(" | ".join(values), flush=True)


def report(soak: Soak, samples: Sequence[Sample], latencies: Latencies) -> int:
    base, final = samples[0], samples[-1]
    cycles = len(latencies.direct) + len(latencies.pulled)
    print(f"\n{cycles} cycles in {final.seconds - base.seconds:.1f} s (the idle pause included)")
    print(f"cycle latency, image present: {spread(latencies.direct)}")
    print(f"cycle latency, through a pull: {spread(latencies.pulled)}")
    print(f"launches answered 'pulling' (a pending record each), warm-up included: {soak.pulled}")
    verbs = ", ".join(
        f"{verb} {median(seconds) * 1000:.1f} ms" for verb, seconds in soak.verb_seconds.items()
    )
    print(f"per request (median, warm-up included): {verbs}")
    print(f"peak RSS (VmHWM): {proc_status_kib('VmHWM') / MIB:.1f} MiB")
    growth = (final.objects - base.objects) / max(cycles, 1)
    print(f"gc-tracked objects: {base.objects} -> {final.objects} ({growth:+.2f} per cycle)")
    return verdict(base, final, soak.failures)


def spread(seconds: Sequence[float]) -> str:
    if not seconds:
        return "none"
    return (
        f"{len(seconds)} cycles, median {median(seconds) * 1000:.1f} ms, "
        f"p95 {percentile(seconds, 95) * 1000:.1f} ms, max {max(seconds) * 1000:.1f} ms"
    )


def verdict(base: Sample, final: Sample, failures: Sequence[Failure]) -> int:
    broken = 0
    print("\nmetric | baseline | final | change | tolerance | verdict")
    for name, allowed in GROWTH.items():
        before, after = getattr(base, name), getattr(final, name)
        ok = after - before <= allowed
        broken += not ok
        change, limit = f"{after - before:+d}", f"+{allowed}"
        if name == "rss_kib":
            change, limit = f"{(after - before) / MIB:+.2f} MiB", f"+{allowed / MIB:.0f} MiB"
        print(f"{name} | {before} | {after} | {change} | {limit} | {say(ok)}")
    for name in ZERO:
        before, after = getattr(base, name), getattr(final, name)
        broken += after != 0
        print(f"{name} | {before} | {after} | {after - before:+d} | = 0 | {say(after == 0)}")
    warmup = sum(1 for failure in failures if failure.cycle.startswith("w"))
    print(f"failed answers | {warmup} in warm-up | {len(failures)} | - | = 0 | {say(not failures)}")
    broken += bool(failures)
    print("\nall tolerances met" if not broken else f"\n{broken} tolerance(s) BROKEN")
    return 1 if broken else 0


def say(ok: bool) -> str:
    return "met" if ok else "BROKEN"


# --- the command line --------------------------------------------------------------------


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--cycles", type=int, default=1000, help="measured cycles")
    parser.add_argument("--warmup", type=int, default=20, help="cycles before the baseline")
    parser.add_argument("--docker-host", default=OWN_ENGINE, help="the engine's address")
    parser.add_argument(
        "--pull-every",
        type=int,
        default=10,
        metavar="N",
        help="every Nth launch pulls --pull-image after untagging it (0: never)",
    )
    parser.add_argument("--pull-image", default=PULL_IMAGE, help="the same image, in a registry")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="run the daemon's wreckage sweep too (off: it would remove other people's "
        "never-started containers on a shared engine)",
    )
    return parser.parse_args()


def main() -> int:
    args = arguments()
    for name in [name for name in os.environ if name.startswith("TUNEPLANE_")]:
        del os.environ[name]  # a developer's settings must not change what is measured
    os.environ["TUNEPLANE_BENCH_DOCKER_HOST"] = args.docker_host  # for machine()'s engine
    logging.basicConfig(level=logging.WARNING, format="  %(levelname)s %(name)s: %(message)s")
    warnings = WarningCounter()
    logging.getLogger("tuneplane_node").addHandler(warnings)
    engine = docker.DockerClient(base_url=args.docker_host, version="1.41", timeout=120)
    print(machine(), flush=True)
    session = uuid.uuid4().hex[:8]  # made here: the cleanup below needs it whatever happens
    try:
        status = asyncio.run(soak_node(args, engine, session))
    except (asyncio.CancelledError, KeyboardInterrupt):
        print("interrupted", flush=True)
        status = 130
    finally:
        remove_session(engine, session)
        engine.close()
    print(f"daemon warnings and errors logged: {warnings.count}")
    return status


if __name__ == "__main__":
    sys.exit(main())
