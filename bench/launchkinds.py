"""launch.py's kinds (issue 56): the node's launch against the SDK doing the same work,
alternating in one run, each timed to the job's process running as the engine's own
events say (its ``start`` event's ``timeNano`` less the moment the request was sent).

Kinds: ``plain`` (image present, 0 cards, on the node's job network); ``mounts`` (two
host mounts, staged, and a 1 GiB scratch); ``podman`` (a podman job on a network of its
own, in a user namespace of its own); ``volume`` (a volume the node's store already
holds); ``burst`` (20 launches at once, timed to the last one's start). The SDK side
makes the same network where the node makes one per job, and creates and starts with
the options the node's runtime builds of the same spec (`EngineRuntime.create_options`),
its mounts bound where they are (the node binds its staged copies), its scratch a bound
directory (the node makes a file system of its own: work the SDK does not do), its
volume the store's file bound read-only. Removal is not timed.

The node's daemon runs under bench/launchtimer.py: each launch's steps, read back from
its file, are the breakdown printed per kind.
"""

from __future__ import annotations

import functools
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import docker
import docker.types
import podman
import podman.api
from harness import (
    LABEL_BENCH,
    PREFIX,
    Api,
    Daemon,
    docker_host,
    engine_client,
    load_average,
    ms,
    percentile,
    remove_container,
)
from launch import launch_body, parse_launch, sdk_options
from launchtimer import ENV as TIMINGS_ENV
from launchtimer import OPTIONS, USERNS
from networks import PODMAN_URL
from volumelaunch import prefetch, volume_files
from volumes import serve

from tuneplane_node.runtime.engines.networks.jobnetwork import ISOLATED, own_network
from tuneplane_node.runtime.engines.networks.podmanjobs import make_network
from tuneplane_node.runtime.engines.podman import create_body

KINDS = ("plain", "mounts", "podman", "volume", "burst")
BURST = 20
GOALS = {"p50": 1.10, "p99": 1.25, "burst": 1.15}
# The SDK's set-up of one launch: of the body, the node's create options and where its
# calls' times go; it answers the send.
Start = Callable[[dict[str, Any], dict[str, Any], dict[str, float]], Callable[[], None]]
TIMER = Path(__file__).resolve().parent / "launchtimer.py"


class Starts:
    """The engine's ``start`` events of this session's containers: name -> the time."""

    def __init__(self, client: docker.DockerClient, session: str) -> None:
        label = f"{LABEL_BENCH}={session}"
        filters = {"type": "container", "event": "start", "label": label}
        self.stream = client.events(decode=True, filters=filters)
        self.seen: dict[str, float] = {}
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for event in self.stream:
                name = (event.get("Actor") or {}).get("Attributes", {}).get("name", "")
                at = event.get("timeNano") or event.get("time", 0) * 1e9
                with self.changed:
                    self.seen[name] = at / 1e9
                    self.changed.notify_all()
        except Exception:  # the stream closed at the end
            pass

    def wait(self, name: str, timeout: float = 120) -> float:
        with self.changed:
            if not self.changed.wait_for(lambda: name in self.seen, timeout):
                raise RuntimeError(f"no start event for {name} in {timeout} s")
            return self.seen.pop(name)

    def close(self) -> None:
        self.stream.close()


@dataclass
class Kind:
    """One kind's two ways: each starts ``name`` (untimed set-up before ``send``) and
    each removes it (untimed)."""

    name: str
    api: Api
    starts: Starts
    body: Callable[[str], dict[str, Any]]
    sdk_start: Start
    sdk_remove: Callable[[str], None]
    timings: Path  # the node's daemon's (bench/launchtimer.py)
    recorded: dict[str, Any] = field(default_factory=dict)
    sdk_steps: list[dict[str, float]] = field(default_factory=list)  # each SDK launch's
    times: dict[str, list[float]] = field(default_factory=lambda: {"node": [], "sdk": []})

    def node(self, name: str) -> float:
        body = self.body(name)
        sent = time.time()
        self.api.launch(body)
        return self.starts.wait(name) - sent

    def node_remove(self, name: str) -> None:
        self.api.remove(name)

    def sdk(self, name: str) -> float:
        steps: dict[str, float] = {}
        self.sdk_steps.append(steps)
        send = self.sdk_start(self.body(name), self.recorded, steps)
        sent = time.time()
        send()
        return self.starts.wait(name) - sent


@dataclass
class Names:
    session: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    count: int = 0
    made: list[tuple[Callable[[str], None], str]] = field(default_factory=list)

    def next(self, tag: str, remove: Callable[[str], None]) -> str:
        self.count += 1
        name = f"{PREFIX}l-{self.session}-{self.count:04d}-{tag}"
        self.made.append((remove, name))  # removed at the end even if the run fails
        return name

    def remove_all(self) -> None:
        for remove, name in self.made:
            try:
                remove(name)
            except Exception as exc:  # one failed removal leaves the others to do
                print(f"could not remove {name}: {exc}")
        self.made = []


def one(kind: Kind, names: Names, side: str) -> float:
    remove = kind.node_remove if side == "node" else kind.sdk_remove
    name = names.next(f"{kind.name[:3]}-{side}", remove)
    elapsed = kind.node(name) if side == "node" else kind.sdk(name)
    remove(name)
    names.made.remove((remove, name))
    return elapsed


def burst(kind: Kind, names: Names, side: str, *, apis: list[Api]) -> list[float]:
    """20 launches at once (one client connection each): each one's time to its start,
    the last one's (the burst's) first."""
    remove = kind.node_remove if side == "node" else kind.sdk_remove
    made = [names.next(f"bur-{side}", remove) for _ in range(BURST)]
    sends: list[Callable[[], Any]]
    if side == "node":
        bodies = [kind.body(name) for name in made]
        sends = [
            functools.partial(api.launch, body) for api, body in zip(apis, bodies, strict=True)
        ]
    else:
        kind.sdk_steps += [{} for _ in made]
        sends = [
            kind.sdk_start(kind.body(name), kind.recorded, steps)
            for name, steps in zip(made, kind.sdk_steps[-BURST:], strict=True)
        ]
    gate = threading.Barrier(BURST + 1)

    def go(send: Callable[[], Any]) -> None:
        gate.wait()
        send()

    with ThreadPoolExecutor(BURST) as pool:
        done = [pool.submit(go, send) for send in sends]
        gate.wait()
        sent = time.time()
        for each in done:
            each.result()
    each_time = [kind.starts.wait(name) - sent for name in made]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(remove, made))
    for name in made:
        names.made.remove((remove, name))
    return [max(each_time), *each_time]


# --- the SDK's side of each kind ------------------------------------------------------


def engine_options(body: dict[str, Any], recorded: dict[str, Any]) -> dict[str, Any]:
    """The options the node's runtime built for its last launch of this kind, with this
    container's name and labels (the node's own labels would make it the node's job) and
    the body's mounts where they are (the node's were its staged copies, gone since)."""
    base = sdk_options(body)
    kept = {k: v for k, v in recorded.items() if k not in ("name", "labels", USERNS)}
    return kept | {"name": base["name"], "labels": base["labels"], "mounts": base["mounts"]}


def docker_send(sdk: docker.DockerClient, extra: Callable[[dict[str, Any]], None]) -> Start:
    def start(
        body: dict[str, Any], recorded: dict[str, Any], steps: dict[str, float]
    ) -> Callable[[], None]:
        options = engine_options(body, recorded)
        extra(options)

        def send() -> None:
            with clocked(steps, "sdk: create (+ its inspect)"):
                container = sdk.containers.create(**options)
            with clocked(steps, "sdk: start"):
                container.start()

        return send

    return start


@contextmanager
def clocked(steps: dict[str, float], step: str) -> Iterator[None]:
    started = time.monotonic()
    try:
        yield
    finally:
        steps[step] = steps.get(step, 0.0) + time.monotonic() - started


def no_extra(options: dict[str, Any]) -> None:
    """The plain kind's options as the runtime builds them."""


def podman_send(client: podman.PodmanClient) -> Start:
    """The node's podman path without the node: the job's network (the same body), the
    create body with a user namespace of its own (as the node's runtime posts it), the
    start."""

    def start(
        body: dict[str, Any], recorded: dict[str, Any], steps: dict[str, float]
    ) -> Callable[[], None]:
        own = bool(recorded.get(USERNS))  # as the node's create body had it
        spec = replace(parse_launch(body).spec, gpus=(), network=ISOLATED, own_userns=own)
        options = engine_options(body, recorded)
        options.pop(USERNS, None)
        options["mounts"] = recorded.get("mounts", [])  # none staged: the node's own
        options["networks"] = {own_network(spec.name): {}}
        storage = options.pop("storage_opt", None)
        data = podman.api.prepare_body(create_body(options, storage, spec))

        def send() -> None:
            with clocked(steps, "sdk: the job's network made"):
                make_network(client.api, spec, "bench")
            with clocked(steps, "sdk: create"):
                made = client.api.post(
                    "/containers/create", headers={"content-type": "application/json"}, data=data
                )
                made.raise_for_status()
            with clocked(steps, "sdk: start"):
                client.api.post(f"/containers/{made.json()['Id']}/start").raise_for_status()

        return send

    return start


def podman_remove(client: podman.PodmanClient) -> Callable[[str], None]:
    def remove(name: str) -> None:
        client.api.delete(f"/containers/{name}", params={"force": True, "v": True})
        client.api.delete(f"/networks/{own_network(name)}")

    return remove


# --- the run ----------------------------------------------------------------------------


@dataclass
class Setup:
    """Both daemons, the clients, the served volume and the mounts' directories."""

    stack: ExitStack
    kinds: dict[str, Kind]
    burst_apis: list[Api]


def timed_daemon(env: dict[str, str], timings: Path) -> Daemon:
    daemon = Daemon(python_args=[str(TIMER)], env=env | {TIMINGS_ENV: str(timings)})
    return daemon


@contextmanager
def setup(wanted: list[str], names: Names) -> Iterator[Setup]:
    with ExitStack() as stack:
        sdk = engine_client(pool=BURST + 4)
        stack.callback(sdk.close)
        work = Path(stack.enter_context(_tempdir()))
        docker_timings, podman_timings = work / "docker.jsonl", work / "podman.jsonl"
        storage = work / "storage"
        mounts = []
        for index in range(2):
            (storage / f"m{index}").mkdir(parents=True)
            mounts.append([str(storage / f"m{index}"), f"/m{index}", index == 0])
        (work / "scratch").mkdir()
        files = volume_files(work / "served", 16)[:1]
        base, server = serve(work / "served")
        stack.callback(server.kill)
        host = base.removeprefix("http://")
        env = {
            "TUNEPLANE_STORAGE_ROOT": str(storage),
            "TUNEPLANE_VOLUME_INSECURE_HOSTS": f'["{host}"]',
            "TUNEPLANE_VOLUME_ALLOWED_NETWORKS": '["127.0.0.0/8"]',
        }
        daemon = stack.enter_context(timed_daemon(env, docker_timings))
        api = Api(daemon.url)
        stack.callback(api.close)
        starts = Starts(sdk, names.session)
        stack.callback(starts.close)
        session = names.session
        volume = [{"source": f"{base}/{files[0][0]}", "path": "/v/data", "sha256": files[0][1]}]
        if "volume" in wanted:
            prefetch(api, volume)

        def plain(name: str) -> dict[str, Any]:
            return launch_body(name, session)

        def with_mounts(name: str) -> dict[str, Any]:
            body = launch_body(name, session)
            body["container"]["mounts"] = mounts
            body["container"]["scratch"] = {"path": "/scratch", "size": "1g"}
            return body

        def scratch_bound(options: dict[str, Any]) -> None:
            options["mounts"].append(
                docker.types.Mount("/scratch", str(work / "scratch"), type="bind")
            )

        def with_volume(name: str) -> dict[str, Any]:
            body = launch_body(name, session)
            body["container"]["volumes"] = volume
            return body

        def volume_bound(options: dict[str, Any]) -> None:
            served = str(work / "served" / files[0][0])
            options["mounts"].append(
                docker.types.Mount("/v/data", served, type="bind", read_only=True)
            )

        def sdk_remove(name: str) -> None:
            remove_container(sdk, name)

        sides = {
            "plain": (plain, no_extra),
            "mounts": (with_mounts, scratch_bound),
            "volume": (with_volume, volume_bound),
            "burst": (plain, no_extra),
        }
        kinds = {
            kind: Kind(kind, api, starts, body, docker_send(sdk, extra), sdk_remove, docker_timings)
            for kind, (body, extra) in sides.items()
        }
        if "podman" in wanted:
            penv = {"TUNEPLANE_LOCAL_RUNTIME": "podman", "TUNEPLANE_PODMAN_URL": PODMAN_URL}
            pdaemon = stack.enter_context(timed_daemon(penv, podman_timings))
            papi = Api(pdaemon.url)
            stack.callback(papi.close)
            pclient = podman.PodmanClient(base_url=PODMAN_URL, max_pool_size=8)
            stack.callback(pclient.close)
            pevents = docker.DockerClient(base_url=PODMAN_URL, version="1.41", timeout=120)
            stack.callback(pevents.close)
            pstarts = Starts(pevents, names.session)
            stack.callback(pstarts.close)
            kinds["podman"] = Kind(
                "podman", papi, pstarts, plain, podman_send(pclient), podman_remove(pclient),
                podman_timings,
            )  # fmt: skip
        apis = [Api(daemon.url) for _ in range(BURST)]
        for each in apis:
            stack.callback(each.close)
        stack.callback(names.remove_all)  # first at the end: its daemons and clients still up
        yield Setup(stack, {k: kinds[k] for k in wanted}, apis)


@contextmanager
def _tempdir() -> Iterator[str]:
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="tuneplane-bench-launch-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_kinds(wanted: list[str], *, pairs: int, launches: int) -> None:
    """``pairs`` pairs; in each, per kind, ``launches`` rounds of one node launch and
    one SDK launch (a burst: one of each), the first of each round alternating."""
    names = Names()
    bursts: dict[str, list[list[float]]] = {"node": [], "sdk": []}
    loads = [load_average()]
    with setup(wanted, names) as made:
        for kind in made.kinds.values():  # warm-up, not counted: connections, networks
            one(kind, names, "node")
            steps = launched(kind)[-1]
            kind.recorded = steps[OPTIONS] | {USERNS: steps.get(USERNS, False)}
            one(kind, names, "sdk")
        for pair in range(pairs):
            for kind in made.kinds.values():
                sides = ["node", "sdk"] if pair % 2 == 0 else ["sdk", "node"]
                if kind.name == "burst":
                    for side in sides:
                        bursts[side].append(burst(kind, names, side, apis=made.burst_apis))
                    continue
                for index in range(launches):
                    for side in sides if index % 2 == 0 else sides[::-1]:
                        kind.times[side].append(one(kind, names, side))
            loads.append(load_average())
            print(f"pair {pair + 1} done, load average {loads[-1]}", flush=True)
        report(made, bursts, loads)


def ratio_line(label: str, node: list[float], sdk: list[float], goal: str) -> str:
    parts = []
    for q, limit in (("p50", 50), ("p99", 99)):
        a, b = percentile(node, limit), percentile(sdk, limit)
        bound = GOALS[goal if goal == "burst" else q]
        met = "met" if a / b <= bound else "MISSED"
        parts.append(f"{q} node {ms(a)} / sdk {ms(b)} = {a / b:.3f}x (goal {bound}x: {met})")
    return f"{label} ({len(node)} and {len(sdk)}): " + "; ".join(parts)


def report(made: Setup, bursts: dict[str, list[list[float]]], loads: list[str]) -> None:
    print(f"\nload average during the run: {', '.join(loads)}")
    for name, kind in made.kinds.items():
        if name == "burst":
            last = {side: [b[0] for b in bursts[side]] for side in bursts}
            each = {side: [t for b in bursts[side] for t in b[1:]] for side in bursts}
            print(ratio_line("burst of 20, the last start", last["node"], last["sdk"], "burst"))
            print(ratio_line("burst of 20, each launch", each["node"], each["sdk"], "burst"))
        else:
            print(ratio_line(name, kind.times["node"], kind.times["sdk"], "single"))
    print("\nwhere the time goes (median per launch: the node's steps, by its daemon's clock;")
    print("then the SDK's calls, `sdk:`)")
    for kind in made.kinds.values():
        breakdown(kind)


def launched(kind: Kind) -> list[dict[str, Any]]:
    """The steps of each of the node's launches of this kind, in order (bench/launchtimer)."""
    tag = f"-{kind.name[:3]}-node"
    lines = kind.timings.read_text().splitlines() if kind.timings.exists() else []
    return [each["steps"] for each in map(json.loads, lines) if each["ref"].endswith(tag)]


def breakdown(kind: Kind) -> None:
    launches = launched(kind)[1:]  # the warm-up's left out
    if not launches:
        print(f"  {kind.name}: no timings")
        return
    steps = {step for each in launches for step, v in each.items() if type(v) is float}
    medians = {step: percentile([each.get(step, 0.0) for each in launches], 50) for step in steps}
    userns = {each[USERNS] for each in launches if USERNS in each}
    said = f", own user namespace: {sorted(userns)}" if userns else ""
    print(f"  {kind.name} ({len(launches)} launches{said}):")
    shown(launches, sorted(steps, key=lambda s: (not s.startswith("service"), -medians[s])))
    sdk = kind.sdk_steps[1:]  # the warm-up's left out
    shown(sdk, sorted({step for each in sdk for step in each}))


def shown(launches: list[dict[str, Any]], steps: list[str]) -> None:
    for step in steps:
        median = percentile([each.get(step, 0.0) for each in launches], 50)
        if median >= 0.0001:
            p90 = percentile([each.get(step, 0.0) for each in launches], 90)
            print(f"    {step:44} {ms(median):>10} (p90 {ms(p90)})")


def kinds_arguments(parser: Any) -> None:
    parser.add_argument(
        "--kinds", help=f"comma-separated, of {','.join(KINDS)}: the node against the SDK"
    )
    parser.add_argument("--pairs", type=int, default=4, help="with --kinds: alternating pairs")
    parser.add_argument(
        "--launches", type=int, default=5, help="with --kinds: rounds per kind per pair"
    )


def wanted_kinds(value: str) -> list[str]:
    wanted = [each.strip() for each in value.split(",") if each.strip()]
    unknown = set(wanted) - set(KINDS)
    if unknown:
        raise SystemExit(f"--kinds: unknown {sorted(unknown)} (of {', '.join(KINDS)})")
    return wanted


__all__ = ["KINDS", "docker_host", "kinds_arguments", "run_kinds", "wanted_kinds"]
