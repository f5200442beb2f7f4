"""Runs the daemon with its launch path timed, its code otherwise untouched:
``python3 bench/launchtimer.py -m tuneplane_node serve ...``, with
``BENCH_LAUNCH_TIMINGS=PATH`` (a file it appends one JSON line to per launch).

Each launch's steps are wrapped where they are defined (vetting, the own-state look,
credentials, the image's info, the cards' reservation, placing, staging, the engine's
``run``), and so are the engine's SDK calls: the pool's (its queue included) and each
HTTP request the SDK sends from the pool's thread, by method and path with names left
out. What a step costs is summed per launch (a step taken twice counts twice) and
written when the service's ``launch`` returns: ``{"ref": ..., "steps": {step: s}}``,
with the runtime's create options among them (``create options``: what the SDK's side
of bench/launchkinds.py creates with).
A step belongs to the launch whose task awaited it (a context variable, set by the
service's ``launch`` and carried onto the pool's thread). Only monotonic clock reads
and a dict update are added per step: tens of microseconds per launch.

bench/launch.py starts its daemons this way (``--kinds``)."""

from __future__ import annotations

import contextvars
import functools
import json
import os
import re
import runpy
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ENV = "BENCH_LAUNCH_TIMINGS"
Steps = dict[str, Any]  # a step's seconds; OPTIONS: the create options, as JSON
CURRENT: contextvars.ContextVar[Steps | None] = contextvars.ContextVar("launch", default=None)
WRITE = threading.Lock()
# The launch's steps, by where they are defined: (module, class, method, the step's name).
STEPS = (
    ("tuneplane_node.jobs.launcher", "Launcher", "vetted", "vetting"),
    ("tuneplane_node.jobs.mounts.launch", "LaunchMounts", "vet", "vetting: mounts"),
    ("tuneplane_node.jobs.ours", "OursRule", "__call__", "own state"),
    ("tuneplane_node.jobs.launcher", "Launcher", "start", "start (after vetting)"),
    ("tuneplane_node.jobs.images.keeper", "ImageKeeper", "credentials", "start: credentials"),
    ("tuneplane_node.jobs.launcher", "Launcher", "_resolved", "start: volumes resolved"),
    ("tuneplane_node.jobs.launcher", "Launcher", "start_now", "start: start_now"),
    ("tuneplane_node.jobs.reservation", "Reservation", "__aenter__", "start_now: cards reserved"),
    ("tuneplane_node.jobs.launcher", "Launcher", "_placed", "start_now: placing"),
    ("tuneplane_node.jobs.mounts.launch", "LaunchMounts", "_staged", "start_now: staging"),
    ("tuneplane_node.runtime.engines.docker", "DockerRuntime", "image_info", "engine: image info"),
    ("tuneplane_node.runtime.engines.docker", "DockerRuntime", "run", "engine: run"),
    ("tuneplane_node.runtime.engines.podman", "PodmanRuntime", "image_info", "engine: image info"),
    ("tuneplane_node.runtime.engines.podman", "PodmanRuntime", "run", "engine: run"),
)
JOBNETS = "tuneplane_node.runtime.engines.networks.podmanjobs"
# Synchronous steps inside the engine's run (on the pool's thread).
THREAD_STEPS = (
    ("tuneplane_node.runtime.engines.docker", "DockerRuntime", "_create", "run: create"),
    (
        "tuneplane_node.runtime.engines.docker",
        "DockerRuntime",
        "_ready_network",
        "run: create: network looked up (locked)",
    ),
    (JOBNETS, "JobNetworks", "make", "run: job network made"),
    (JOBNETS, "JobNetworks", "prune", "run: job networks pruned"),
    ("tuneplane_node.runtime.engines.networks.hostguard", "BridgeGuard", "hold", "run: guard"),
    (
        "tuneplane_node.runtime.engines.networks.egress",
        "EgressRule",
        "begin_fresh",
        "run: guard and egress rule begun (one restore)",
    ),
    (
        "tuneplane_node.runtime.engines.networks.hostguard",
        "Begun",
        "done",
        "run: guard and egress rule waited for, after the create",
    ),
    ("tuneplane_node.runtime.engines.podman", "PodmanRuntime", "_create", "run: create"),
    ("tuneplane_node.runtime.engines.networks.egress", "EgressRule", "hold", "run: egress rule"),
)
OPTIONS = "create options"
USERNS = "own user namespace"  # podman: whether the create body gave the job its own
NAMED = re.compile(r"^(containers|images|networks|volumes|exec)/(.+?)(/[a-z]+)?$")
VERBS = {"create", "json", "prune"}


def add(step: str, seconds: float) -> None:
    steps = CURRENT.get()
    if steps is not None:
        steps[step] = steps.get(step, 0.0) + seconds


def timed_async(fn: Callable[..., Any], step: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return await fn(*args, **kwargs)
        finally:
            add(step, time.monotonic() - started)

    return wrapper


def timed_sync(fn: Callable[..., Any], step: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            add(step, time.monotonic() - started)

    return wrapper


def kept(fn: Callable[..., Any], key: str, said: Callable[[Any], Any]) -> Callable[..., Any]:
    """``fn``'s answer, as ``said`` reads it, kept in the launch's line under ``key``:
    ``create_options``' (what the SDK's side creates with), and whether podman's
    ``create_body`` gave the job a user namespace of its own."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        answer = fn(*args, **kwargs)
        steps = CURRENT.get()
        if steps is not None:
            steps[key] = said(answer)
        return answer

    return wrapper


def as_json(options: Any) -> Any:
    return json.loads(json.dumps(options, default=str))


def launch_wrapped(fn: Callable[..., Any], path: str) -> Callable[..., Any]:
    """The service's ``launch``: its steps gathered, its total, one line written."""

    @functools.wraps(fn)
    async def wrapper(service: Any, request: Any) -> Any:
        steps: Steps = {}
        token = CURRENT.set(steps)
        started = time.monotonic()
        try:
            return await fn(service, request)
        finally:
            steps["service launch (total)"] = time.monotonic() - started
            CURRENT.reset(token)
            line = json.dumps({"ref": request.ref, "steps": steps})
            with WRITE, open(path, "a") as out:
                out.write(line + "\n")

    return wrapper


def pool_wrapped(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``BlockingPool.call_as``: its time (queue included) under the call's name, and
    the launch's steps carried onto the thread, for the HTTP requests sent there."""

    @functools.wraps(fn)
    async def wrapper(pool: Any, name: str, call: Callable[..., Any], /, *a: Any, **k: Any) -> Any:
        steps = CURRENT.get()
        if steps is None:
            return await fn(pool, name, call, *a, **k)

        def on_thread(*args: Any, **kwargs: Any) -> Any:
            CURRENT.set(steps)  # the pool's thread: set for this call, cleared below
            add("pool: queue wait", time.monotonic() - started)
            try:
                return call(*args, **kwargs)
            finally:
                CURRENT.set(None)

        started = time.monotonic()
        try:
            return await fn(pool, name, on_thread, *a, **k)
        finally:
            add(f"pool: {name.lstrip('_')} (queue and call)", time.monotonic() - started)

    return wrapper


def request_name(method: str, url: str) -> str:
    """``POST /containers/{}/start``: the path without its version, host, query or names."""
    path = re.sub(r"^[a-z+]+://[^/]*", "", url).split("?", 1)[0]
    path = re.sub(r"^/v[0-9.]+/", "/", path).removeprefix("/libpod").lstrip("/")
    named = NAMED.match(path)
    if named:
        resource, name, verb = named.groups()
        if name in VERBS and not verb:
            path = f"{resource}/{name}"
        else:
            path = f"{resource}/{{}}{verb or ''}"
    return f"http {method} /{path}"


def install() -> None:
    import importlib

    import requests

    from tuneplane_node.jobs.service import JobService
    from tuneplane_node.runtime.engines import podman as podman_module
    from tuneplane_node.runtime.engines.docker import DockerRuntime
    from tuneplane_node.runtime.engines.podman import PodmanRuntime
    from tuneplane_node.runtime.pool import BlockingPool

    path = os.environ[ENV]
    JobService.launch = launch_wrapped(JobService.launch, path)  # type: ignore[method-assign]
    BlockingPool.call_as = pool_wrapped(BlockingPool.call_as)  # type: ignore[method-assign]
    for module, owner, method, step in STEPS + THREAD_STEPS:
        cls = getattr(importlib.import_module(module), owner)
        wrap = timed_async if (module, owner, method, step) in STEPS else timed_sync
        setattr(cls, method, wrap(getattr(cls, method), step))
    podman_module.create_body = kept(podman_module.create_body, USERNS, lambda b: "userns" in b)
    for runtime in (DockerRuntime, PodmanRuntime):
        runtime.create_options = kept(runtime.create_options, OPTIONS, as_json)  # type: ignore[method-assign]
    send = requests.Session.send

    def sent(session: Any, request: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return send(session, request, **kwargs)
        finally:
            add(request_name(request.method, request.url), time.monotonic() - started)

    requests.Session.send = sent  # type: ignore[method-assign,assignment]
    run = subprocess.run

    def ran(argv: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return run(argv, *args, **kwargs)
        finally:
            words = list(argv) if isinstance(argv, list | tuple) else [argv]
            tool = Path(str(words[0])).name
            if tool == "nsenter" and len(words) > 2:  # which iptables, and what it was asked
                tool = " ".join([Path(str(words[2])).name, *map(str, words[5:7])])
            add(f"subprocess {tool}", time.monotonic() - started)

    subprocess.run = ran  # type: ignore[assignment]


if __name__ == "__main__":
    install()
    if sys.argv[1:2] != ["-m"] or len(sys.argv) < 3:
        sys.exit("usage: launchtimer.py -m MODULE [ARGS...]")
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
