"""load: bursts of 200 concurrent observe + health requests from another process.

With ``--containers`` (300) tracked containers, a generator process (aiohttp client, 200
kept-alive connections) fires bursts of 200 requests at once: ``mixed`` (100 observe of
10 refs + 100 health), ``observe`` (200 observe) and ``health`` (200 health), the three
kinds in a rotating order within each round, with idle gaps between bursts. Latency is
per request, measured by the generator. The daemon has no stall meter, so the event
loop's worst stall is measured from outside: a third process sends GET /healthz back to
back (one every ~2 ms) for the whole run; the stall is the worst extra latency, over its
idle median, of a /healthz that overlapped a burst. That includes queueing behind the
burst's requests, so it is an upper bound of the loop's lag, not the lag itself.
Goal: p99 under 50 ms and worst stall under 20 ms (on the ``mixed`` bursts).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import http.client
import itertools
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import aiohttp
import loopprofile
from harness import (
    HEADERS,
    REPO,
    Api,
    Daemon,
    arguments,
    code_version,
    cpu_seconds,
    fleet,
    machine,
    median,
    ms,
    peer_arguments,
    peer_checkout,
    percentile,
    pin,
    profiled,
    rotated,
    settle,
    this_or_alternated,
)

KINDS = ("mixed", "observe", "health")
CONCURRENCY = 200
REFS_PER_OBSERVE = 10
GAP_S = 0.7
PROBE_PAUSE_S = 0.002
WALKS = "tuneplane_node_disk_walk_seconds_count"

# --- the generator process -----------------------------------------------------------


async def request(session: aiohttp.ClientSession, kind: str, refs: list[str]) -> list[Any]:
    started = time.perf_counter()
    if kind == "observe":
        answer = await session.post("/node/v1/observe", json={"refs": refs})
    else:
        answer = await session.get("/node/v1/health")
    async with answer:
        await answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{kind}: {answer.status}")
    return [kind, time.perf_counter() - started]


def burst_plan(kind: str, refs: Sequence[str]) -> list[tuple[str, list[str]]]:
    plan = []
    for index in range(CONCURRENCY):
        each = "observe" if kind == "observe" or (kind == "mixed" and index % 2) else "health"
        first = (index * REFS_PER_OBSERVE) % max(1, len(refs) - REFS_PER_OBSERVE)
        plan.append((each, list(refs[first : first + REFS_PER_OBSERVE])))
    return plan


@contextlib.contextmanager
def collected_before() -> Iterator[None]:
    """The generator's garbage collected before a burst, none within it. Its own
    collections paused it for 16 to 44 ms (gen2, seen with `gc.callbacks`) inside a
    burst of 30 to 60 ms: time its requests counted as the daemon's latency, and the
    pause that decided a pair's p99."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Target(NamedTuple):
    url: str
    pid: int  # the daemon's, to read the CPU time each burst costs it
    refs: list[str]


async def burst(session: aiohttp.ClientSession, kind: str, target: Target) -> dict[str, Any]:
    plan = burst_plan(kind, target.refs)
    with collected_before():
        cpu, own, started = cpu_seconds(target.pid), time.process_time(), time.monotonic()
        latencies = await asyncio.gather(*(request(session, each, rs) for each, rs in plan))
    return {
        "kind": kind,
        "start": started,
        "end": time.monotonic(),
        "cpu": cpu_seconds(target.pid) - cpu,
        "client_cpu": time.process_time() - own,
        "latencies": latencies,
    }


async def generate(target: Target, rounds: int) -> list[dict[str, Any]]:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(target.url, headers=HEADERS, connector=connector) as session:
        for kind in KINDS:  # warm-up: opens the 200 connections, kept alive after
            await burst(session, kind, target)
        bursts = []
        for index in range(rounds):
            for kind in rotated(KINDS, index):
                await asyncio.sleep(GAP_S)
                bursts.append(await burst(session, kind, target))
        return bursts


# --- the probe process -----------------------------------------------------------------


def probe(port: int) -> None:
    """GET /healthz back to back until SIGINT; print [sent (monotonic), latency] pairs."""
    # Heard even where the bench was started in the background (`cmd &` in a script),
    # which leaves SIGINT ignored in every child: the parent then waited 60 s and failed.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    connection = http.client.HTTPConnection("127.0.0.1", port)
    samples: list[tuple[float, float]] = []
    try:
        while True:
            sent = time.monotonic()
            connection.request("GET", "/healthz")
            connection.getresponse().read()
            samples.append((sent, time.monotonic() - sent))
            time.sleep(PROBE_PAUSE_S)
    except KeyboardInterrupt:
        print(json.dumps(samples))


# --- the parent ------------------------------------------------------------------------


def child(*argv: str) -> subprocess.Popen[str]:
    command = [sys.executable, __file__, *argv]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)


def run_load(daemon: Daemon, names: list[str], rounds: int) -> tuple[list[Any], list[Any]]:
    refs_file = daemon.dir / "refs.json"
    refs_file.write_text(json.dumps(names))
    prober = child("--probe", str(daemon.port))
    try:
        time.sleep(1.0)  # an idle baseline before the first burst
        generator = child("--generate", daemon.url, str(daemon.pid), str(refs_file), str(rounds))
        out, _ = generator.communicate(timeout=600)
        if generator.returncode:
            raise RuntimeError("the generator failed")
        time.sleep(0.5)
    finally:
        prober.send_signal(signal.SIGINT)
        probed, _ = prober.communicate(timeout=60)
    return json.loads(out), json.loads(probed)


def overlaps(sample: Sequence[float], bursts: list[dict[str, Any]]) -> dict[str, Any] | None:
    sent, latency = sample
    for each in bursts:
        if sent <= each["end"] and sent + latency >= each["start"]:
            return each
    return None


def stalls(bursts: list[dict[str, Any]], samples: list[Any]) -> tuple[float, dict[str, float]]:
    """The probe's idle median, and per burst kind its worst latency beyond that median."""
    idle = [latency for sent, latency in samples if overlaps((sent, latency), bursts) is None]
    baseline = median(idle)
    worst: dict[str, float] = {}
    for sample in samples:
        hit = overlaps(sample, bursts)
        if hit is not None:
            worst[hit["kind"]] = max(worst.get(hit["kind"], 0.0), sample[1] - baseline)
    return baseline, worst


def report(bursts: list[dict[str, Any]], samples: list[Any]) -> None:
    baseline, worst = stalls(bursts, samples)
    print(f"\n/healthz probe: {len(samples)} requests, idle median {ms(baseline)}")
    print(
        "burst   | requests | p50 | p99 | max | p99 per round (median) | worst stall (outside)"
        " | CPU per request: daemon, client"
    )
    for kind in KINDS:
        mine = [b for b in bursts if b["kind"] == kind]
        pooled = [lat for b in mine for _, lat in b["latencies"]]
        per_round = median([percentile([lat for _, lat in b["latencies"]], 99) for b in mine])
        cpu = sum(b["cpu"] for b in mine) / len(pooled)
        client = sum(b["client_cpu"] for b in mine) / len(pooled)
        print(
            f"{kind:7s} | {len(pooled)} | {ms(median(pooled))} | {ms(percentile(pooled, 99))} | "
            f"{ms(max(pooled))} | {ms(per_round)} | {ms(worst.get(kind, 0.0))} | "
            f"{ms(cpu)}, {ms(client)}"
        )
    split_mixed(bursts)
    goals(bursts, worst)


def split_mixed(bursts: list[dict[str, Any]]) -> None:
    for each in ("observe", "health"):
        pooled = [lat for b in bursts if b["kind"] == "mixed" for k, lat in b["latencies"]]
        pooled = [
            lat for b in bursts if b["kind"] == "mixed" for k, lat in b["latencies"] if k == each
        ]
        print(
            f"  in mixed bursts, {each}: p50 {ms(median(pooled))}, p99 {ms(percentile(pooled, 99))}"
        )
    spans = [b["end"] - b["start"] for b in bursts if b["kind"] == "mixed"]
    print(f"  a mixed burst of {CONCURRENCY} takes {ms(median(spans))} (median) end to end")


def goals(bursts: list[dict[str, Any]], worst: dict[str, float]) -> None:
    pooled = [lat for b in bursts if b["kind"] == "mixed" for _, lat in b["latencies"]]
    p99 = percentile(pooled, 99)
    print(f"goal: p99 < 50 ms (mixed): {'MET' if p99 < 0.050 else 'MISSED'} ({ms(p99)})")
    stall = worst.get("mixed", 0.0)
    print(
        f"goal: worst stall < 20 ms (mixed): {'MET' if stall < 0.020 else 'MISSED'} ({ms(stall)})"
    )


def lags_during(lags: list[Any], bursts: list[dict[str, Any]]) -> list[float]:
    """Lags whose late stretch [woke - lag, woke] overlaps one of the bursts."""
    return [
        lag
        for woke, lag in lags
        if any(woke >= b["start"] and woke - lag <= b["end"] for b in bursts)
    ]


def in_process_lags(path: Path, bursts: list[dict[str, Any]]) -> None:
    """The lag meter's figures (bench/lagmeter.py): the loop's own worst late wake-ups."""
    if not path.exists():
        print("lag meter: no figures (the daemon did not shut down cleanly)")
        return
    measured = json.loads(path.read_text())
    print(f"event-loop lag meter inside the daemon (1 ms timer, {measured['ticks']} ticks):")
    for kind in KINDS:
        lags = lags_during(measured["lags"], [b for b in bursts if b["kind"] == kind])
        worst = max(lags, default=0.0)
        print(f"  {kind:7s} bursts: worst lag {ms(worst)}, {len(lags)} lags over 1 ms")
    first, last = bursts[0]["start"], bursts[-1]["end"]
    between = [(w, lag) for w, lag in measured["lags"] if first <= w <= last]
    during = set(lags_during(between, bursts))
    calm = [lag for _, lag in between if lag not in during]
    print(f"  between the bursts (idle gaps): worst lag {ms(max(calm, default=0.0))}")


def measured_daemon(
    args: argparse.Namespace, names: list[str], lag_file: Path, *, checkout: Path = REPO
) -> dict[str, Any]:
    """One daemon of ``checkout`` over the fleet: its bursts, reported; their summary."""
    python_args = (
        [] if args.no_lag_meter else [str(Path(__file__).with_name("lagmeter.py")), str(lag_file)]
    )
    if args.cprofile:  # instead of the lag meter: one wrapper at a time
        python_args = [str(Path(__file__).with_name("loopprofile.py")), args.cprofile]
    with Daemon(python_args=python_args, checkout=checkout) as daemon:
        api = Api(daemon.url)
        api.wait_tracked(names)
        settle(daemon.pid)
        if args.pin:
            pin(daemon.pid)
        print(f"daemon {code_version(checkout)}; cache: {api.health()['state_cache']}")
        cpu, walks = daemon.cpu_seconds(), api.metric(WALKS)
        with profiled(daemon, args.profile):
            bursts, samples = run_load(daemon, names, args.rounds)
        cpu = daemon.cpu_seconds() - cpu
        report(bursts, samples)
        # The disk monitor's walks of writable layers during the run (none for a daemon
        # without the monitor): work between the requests that their CPU includes.
        print(f"disk monitor walks during the run: {api.metric(WALKS) - walks:.0f}")
        served = sum(len(b["latencies"]) for b in bursts) + len(samples)
        print(
            f"daemon CPU over the run: {cpu:.2f} s for {served} requests (bursts + probe), "
            f"{ms(cpu / served)} per request on average"
        )
        api.close()
    if args.cprofile:
        print(loopprofile.top(Path(args.cprofile)))
    elif not args.no_lag_meter:
        in_process_lags(lag_file, bursts)
    return summary(bursts)


def summary(bursts: list[dict[str, Any]]) -> dict[str, float]:
    """What a pair compares: the mixed bursts' pooled p99, each kind's CPU per request."""
    figures = {}
    for kind in KINDS:
        mine = [b for b in bursts if b["kind"] == kind]
        requests = sum(len(b["latencies"]) for b in mine)
        figures[f"cpu {kind}"] = sum(b["cpu"] for b in mine) / requests
    mixed = [lat for b in bursts if b["kind"] == "mixed" for _, lat in b["latencies"]]
    figures["p99 mixed"] = percentile(mixed, 99)
    return figures


def main() -> None:
    if sys.argv[1:2] == ["--probe"]:
        return probe(int(sys.argv[2]))
    if sys.argv[1:2] == ["--generate"]:
        url, pid, refs_file, rounds = sys.argv[2:6]
        target = Target(url, int(pid), json.loads(Path(refs_file).read_text()))
        print(json.dumps(asyncio.run(generate(target, int(rounds)))))
        return None
    parser = arguments(__doc__.splitlines()[0], containers=300, rounds=5)
    parser.add_argument("--no-lag-meter", action="store_true", help="run the bare daemon")
    parser.add_argument(
        "--cprofile", metavar="OUT.prof", help="cProfile the loop's thread (loopprofile.py)"
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the daemon on the last CPU, the load and the probe on the others",
    )
    peer_arguments(parser)
    args = parser.parse_args()
    peer = peer_checkout(args.peer)
    print(machine())
    with (
        tempfile.TemporaryDirectory(prefix="tuneplane-bench-lag-") as folder,
        fleet("load") as made,
    ):
        names = made.create(args.containers)
        runs = itertools.count()

        def one_run(checkout: Path) -> dict[str, float]:
            lag_file = Path(folder) / f"lags-{next(runs)}.json"
            return measured_daemon(args, names, lag_file, checkout=checkout)

        this_or_alternated(peer, args, one_run)
    return None


if __name__ == "__main__":
    main()
