"""egress (issue 51): what the egress rule costs a launch, and a job's download.

Root: engines of the bench's own, each in network namespaces of its own whose default
route leads to "the outside world" (as the tests' `ThrowawayDocker` ``netns=True`` and
`ThrowawayPodman`); the machine's own firewall is never touched.

1. The rule's work per launch: `EgressRule.hold` of a new job network's bridge, as a
   podman launch does it (a network per job; docker holds once per network), in a podman
   service's namespace, ``--holds`` bridges: the first hold (the chain written) apart,
   then each later one (the jump checked and added); then their sweep at once.
2. A launch through the API (``--launches`` rounds): two daemons, each on a podman
   service of its own, one with the rule (the default) and one with
   ``TUNEPLANE_JOB_EGRESS_RULE=false``, alternating within each round (the order turned);
   a launch asking ``network: bridge`` (an ``isolated`` network of the job's own) and its
   removal, each timed as the console sees it.
3. The forwarding cost: one job on a docker engine's job network downloads ``--mib`` MiB
   from the outside namespace (busybox's wget; the server times from its accept to the
   client's close), with the rule's jump on the job's bridge and without it, alternating
   within each of ``--rounds`` rounds (the order turned), one round first not counted;
   the ratio of the medians, and the median of each round's ratio (its two downloads
   back to back: what the machine's other load does between rounds cancels out).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import uuid
from typing import Any

from harness import LABEL_BENCH, SLEEP, Api, Daemon, machine, median, ms, percentile, rotated
from networks import body

from tests.support.images import IMAGE
from tests.support.namespaces import Namespaces
from tests.support.throwaway import ThrowawayDocker, ThrowawayPodman
from tuneplane_node.runtime.engines.networks.egress import (
    PODMAN_PARENTS,
    EgressPolicy,
    EgressRule,
    jumps,
)
from tuneplane_node.settings import load_settings, unix_socket

PORT = 9100
SERVER = """
import socket, sys, time
size = int(sys.argv[1])
chunk = b"x" * (1 << 20)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[2], int(sys.argv[3])))
s.listen()
print("listening", flush=True)
while True:
    c, _ = s.accept()
    start = time.perf_counter()
    request = b""
    while b"\\r\\n\\r\\n" not in request:
        request += c.recv(4096)
    c.sendall(b"HTTP/1.0 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n" % size)
    for _ in range(size >> 20):
        c.sendall(chunk)
    c.shutdown(socket.SHUT_WR)
    while c.recv(65536):
        pass
    print(time.perf_counter() - start, flush=True)
    c.close()
"""


def policy() -> EgressPolicy:
    found = EgressPolicy.of(load_settings(job_egress_deny=["10.0.0.0/8", "192.168.0.0/16"]))
    assert found is not None
    return found


# --- 1. the rule's own work per launch ----------------------------------------------------


def holds(count: int) -> None:
    """`count` holds of new bridges and their sweep, in a podman service's namespace."""
    engine = ThrowawayPodman("throwpod-beg")
    engine.start()
    try:
        rule = EgressRule(
            policy(), address=engine.host, parent=lambda: PODMAN_PARENTS["cni"],
            socket_path=unix_socket(engine.host), tool=lambda pid: "iptables",
        )  # fmt: skip
        times = []
        for index in range(count):
            start = time.perf_counter()
            why = rule.hold(f"tpbench{index:05d}", fresh=True)  # as podman's launch
            times.append(time.perf_counter() - start)
            assert why is None, why
        start = time.perf_counter()
        swept = rule.sweep(set)
        sweep = time.perf_counter() - start
    finally:
        engine.close()
    later = times[1:]
    print(f"1. hold, the first (the chain written, then the jump): {ms(times[0])}")
    print(
        f"   hold, each later launch ({len(later)}): median {ms(median(later))}, "
        f"p90 {ms(percentile(later, 90))}, max {ms(max(later))}; the first 20 "
        f"{ms(median(later[:20]))}, the last 20 {ms(median(later[-20:]))}"
    )
    print(f"   sweep of {swept} jumps at once: {ms(sweep)}")


# --- 2. a launch through the API -----------------------------------------------------------


def launches(rounds: int) -> None:
    """Alternating launches and removals through two daemons, the rule on and off."""
    engines = {rule: ThrowawayPodman(f"throwpod-beg-{rule}") for rule in ("on", "off")}
    daemons: dict[str, Daemon] = {}
    made: list[tuple[Api, str]] = []
    try:
        for rule, engine in engines.items():
            engine.start()
            engine.load_test_image()
            env = {
                "TUNEPLANE_LOCAL_RUNTIME": "podman", "TUNEPLANE_PODMAN_URL": engine.host,
                "TUNEPLANE_JOB_NETWORK": "isolated",
                "TUNEPLANE_JOB_EGRESS_RULE": "true" if rule == "on" else "false",
            }  # fmt: skip
            daemons[rule] = Daemon(env=env).start()
        apis = {rule: Api(daemon.url) for rule, daemon in daemons.items()}
        session = uuid.uuid4().hex[:8]
        times: dict[str, list[float]] = {f"{verb} {rule}": [] for verb in ("launch", "remove")
                                         for rule in apis}  # fmt: skip
        for index in range(rounds + 1):  # the first round not counted
            for rule in rotated(list(apis), index):
                name = f"tuneplane-bench-egress-{session}-{rule}-{index:03d}"
                made.append((apis[rule], name))
                start = time.perf_counter()
                apis[rule].launch(body(name, session))
                launched = time.perf_counter() - start
                start = time.perf_counter()
                apis[rule].remove(name)
                removed = time.perf_counter() - start
                made.pop()
                if index:
                    times[f"launch {rule}"].append(launched)
                    times[f"remove {rule}"].append(removed)
    finally:
        for api, name in made:
            api.remove(name)
        for daemon in daemons.values():
            daemon.stop()
        for engine in engines.values():
            engine.close()
    print(f"2. through the API, podman, {rounds} rounds (median, p90):")
    for what, figures in times.items():
        print(f"   {what:>10}: {ms(median(figures))}, {ms(percentile(figures, 90))}")
    added = median(times["launch on"]) - median(times["launch off"])
    print(f"   the rule adds {ms(added)} to a launch's median")


# --- 3. the forwarding cost ----------------------------------------------------------------


def forwarding(rounds: int, mib: int) -> None:
    """A job's download through the rule's jump and without it, alternating."""
    engine = ThrowawayDocker("throwaway-beg", netns=True)
    server: subprocess.Popen[str] | None = None
    try:
        engine.start()
        engine.load_test_image()
        network = "tuneplane-bench-jobs"
        engine.docker("network", "create", "-o", "com.docker.network.bridge.enable_icc=false",
                      "-o", "com.docker.network.bridge.name=tpbenchjobs", network)  # fmt: skip
        engine.docker(
            "run", "-d", "--name", "tuneplane-bench-egress-job", "--network", network,
            "--label", f"{LABEL_BENCH}=egress", "--entrypoint", SLEEP[0], IMAGE, *SLEEP[1:],
        )  # fmt: skip
        server = serve(engine.net, mib)
        rule = EgressRule(
            policy(), address=engine.host, parent=lambda: "DOCKER-USER",
            socket_path=unix_socket(engine.host), tool=lambda pid: "iptables",
        )  # fmt: skip
        off = EgressRule(
            None, address=engine.host, parent=lambda: "DOCKER-USER",
            socket_path=unix_socket(engine.host), tool=lambda pid: "iptables",
        )  # fmt: skip
        seconds: dict[str, list[float]] = {"with the rule": [], "without": []}
        for index in range(rounds + 1):
            for side in rotated(list(seconds), index):
                if side == "with the rule":
                    assert rule.hold("tpbenchjobs") is None
                else:
                    off.sweep(set)  # the rule off: every jump and the chain gone
                held = [name for name, _, _ in jumps(engine.net.rules())]
                assert held == (["tpbenchjobs"] if side == "with the rule" else []), held
                took = download(engine, server)
                if index:
                    seconds[side].append(took)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        engine.close()
    print(f"3. a job's download of {mib} MiB from outside, docker, {rounds} rounds:")
    rates = {side: [mib / took for took in took_s] for side, took_s in seconds.items()}
    for side, figures in rates.items():
        print(
            f"   {side:>13}: median {median(figures):.0f} MiB/s "
            f"(min {min(figures):.0f}, max {max(figures):.0f})"
        )
    ratio = median(rates["with the rule"]) / median(rates["without"])
    pairs = [w / o for w, o in zip(rates["with the rule"], rates["without"], strict=True)]
    print(
        f"   with / without: {ratio:.3f} (medians), {median(pairs):.3f} (the median of the "
        f"rounds' ratios, each pair back to back)"
    )


def serve(net: Namespaces, mib: int) -> subprocess.Popen[str]:
    """The server in the outside namespace, on `Namespaces.OUTSIDE`."""
    argv = [sys.executable, "-c", SERVER, str(mib << 20), net.OUTSIDE, str(PORT)]
    server = subprocess.Popen(
        ["nsenter", f"--net=/run/netns/{net.outside}", *argv],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdout.readline() == "listening\n"
    return server


def download(engine: ThrowawayDocker, server: subprocess.Popen[str]) -> float:
    """One download by the job; the server's time for it."""
    url = f"http://{Namespaces.OUTSIDE}:{PORT}/"
    engine.docker("exec", "tuneplane-bench-egress-job", "wget", "-q", "-O", "/dev/null", url)
    assert server.stdout is not None
    return float(server.stdout.readline())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holds", type=int, default=200)
    parser.add_argument("--launches", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--only", choices=("holds", "launches", "forwarding"))
    args: Any = parser.parse_args()
    print(machine())
    if args.only in (None, "holds"):
        holds(args.holds)
    if args.only in (None, "launches"):
        launches(args.launches)
    if args.only in (None, "forwarding"):
        forwarding(args.rounds, args.mib)


if __name__ == "__main__":
    main()
