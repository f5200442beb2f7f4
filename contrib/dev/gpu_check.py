#!/usr/bin/env python3
"""The node on real NVIDIA cards: what the driver says, and what the API makes of it.

Run from the repository root on a machine with a driver (no engine needed: the job runs
on the process runtime, with ``python3`` from PATH or ``--python``):

    python3 contrib/dev/gpu_check.py [--python PY] [--hold-s 20]

1. The NVML probe: every card's facts, the driver and CUDA versions, the links, whether
   processes could be listed, what one read of the driver costs (50 reads), and each
   card's NUMA node and CPU list as the driver gives them (beside sysfs's).
2. The daemon (``python3 -m tuneplane_node serve``, process runtime, the real probe):
   inventory and health on idle cards; then a job of one card that holds 1 GiB of card
   memory (torch, in the job's Python) and computes; health, stats and the metrics while
   it runs; then a second process on the same card that the node did not start (health
   must call its pid external); the cpuset the job got (its ``Cpus_allowed_list``: its
   card's CPUs, TUNEPLANE_CPU_AFFINITY=numa); then the job stopped and removed (the card
   free again).

3. With ``--isolation IMAGE`` (an image with ``nvidia-smi``; podman and/or runsc needed),
   what issue 37 leaves to the operator: whether a card job runs in a user namespace of
   its own (podman ``--userns=auto:size=65536`` with the card as a CDI device, the same
   as the node's; if it lists the card, ``TUNEPLANE_JOB_USERNS_CARDS=true`` can be
   tried), and whether gVisor's GPU proxy supports this driver (``runsc nvproxy
   list-supported-drivers`` against NVML's driver version: a card job may be sandboxed
   only then, with runsc registered with ``--nvproxy=true``).

4. Issue 53's rules on real cards: each card's recovery action (NVML's field, driver
   565+) and its fault as the node judges it now, the NVSwitch fabric manager's state, the
   Container Toolkit's version (``nvidia-ctk --version``) against the floor; and in step
   2, the card of a removed job ``draining`` while another process holds it, free once it
   is clean (how long that took is printed).

Prints what it saw and one line per expectation, ``ok`` or ``FAILED``; exits 1 if any
failed. The facts a virtual machine does not give (power, temperature) are printed, not
checked.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TOKEN = "gpu-check-token-0123456789"
HEADERS = {"Authorization": f"Bearer {TOKEN}", "X-TunePlane-Node-Protocol": "1"}
HOLDER = """
import sys, time, torch
for line in open("/proc/self/status"):
    if line.startswith(("Cpus_allowed_list", "Mems_allowed_list")):
        print(line.strip(), flush=True)
x = torch.empty(1 << 28, dtype=torch.float32, device="cuda")  # 1 GiB
a = torch.randn(4096, 4096, device="cuda")
print("holding 1 GiB on", torch.cuda.get_device_name(0), flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""
failures: list[str] = []


def expect(what: str, ok: bool, detail: object = "") -> None:
    print(f"{'ok' if ok else 'FAILED'}: {what}{f' ({detail})' if detail != '' else ''}")
    if not ok:
        failures.append(what)


# --- 1. the probe ---------------------------------------------------------------------


def probe_check() -> tuple[int, dict[int, str]]:
    """The card count, and the cpuset a one-card job of each card should get."""
    sys.path.insert(0, str(REPO))
    from tuneplane_node.gpu.factory import make_probe
    from tuneplane_node.settings import load_settings

    probe = make_probe(load_settings(node_token=TOKEN))
    try:
        snap = probe.snapshot()
        print(f"probe: {snap.source} ok={snap.ok} error={snap.error} driver={snap.driver}")
        print(f"  cuda={snap.cuda} processes_ok={snap.processes_ok} links={snap.links}")
        for card in snap.cards:
            print(f"  card {card}")
        expect("the driver answers through NVML", snap.ok and snap.source == "nvml", snap.error)
        expect(
            "every card has a uuid, a name and its memory",
            bool(snap.cards) and all(c.uuid and c.name and c.memory_total_mib for c in snap.cards),
        )
        expect("the card's processes can be listed", snap.processes_ok)
        cpusets = numa_check(snap)
        reads = []
        for _ in range(50):
            started = time.perf_counter()
            probe.snapshot()
            reads.append(time.perf_counter() - started)
        print(
            f"one driver read: median {statistics.median(reads) * 1e3:.2f} ms, "
            f"max {max(reads) * 1e3:.2f} ms (50 reads, {len(snap.cards)} cards)"
        )
        return len(snap.cards), cpusets
    finally:
        probe.close()


def numa_check(snap: Any) -> dict[int, str]:
    """Each card's NUMA node and CPUs as the driver gives them, beside sysfs's; the
    cpuset a one-card job of each known card should get (its CPUs that are online)."""
    from tuneplane_node.gpu import numa
    from tuneplane_node.runtime.spec import format_cpulist

    machine = numa.node_cpus()
    print(f"machine NUMA nodes: { {n: format_cpulist(c) for n, c in machine.items()} }")
    for card in snap.cards:
        sysfs = numa.pci_numa_node(card.pci_bus_id)
        print(
            f"  gpu {card.index}: numa_node {card.numa_node} cpus "
            f"{format_cpulist(card.cpus) or 'unknown'} (sysfs: node {sysfs})"
        )
    known = [card for card in snap.cards if card.numa_node is not None and card.cpus]
    expect("the driver gives every card a NUMA node and its CPUs", len(known) == len(snap.cards))
    expect(
        "each card's CPUs are its node's (sysfs)",
        all(set(card.cpus) <= set(machine.get(card.numa_node, ())) for card in known),
    )
    online = set(numa.online_cpus() or ())
    return {card.index: format_cpulist(set(card.cpus) & online) for card in known}


def job_cpuset(node: Node, ref: str) -> dict[str, str]:
    """What the job printed of its /proc/self/status: its CPU and memory lists."""

    def printed() -> Any:
        log = node.call("GET", f"/node/v1/logs?ref={ref}")[1]
        text = log.get("logs", "") if isinstance(log, dict) else ""
        lines = [line.split(" ", 1)[-1] for line in text.splitlines() if "_allowed_list" in line]
        return dict(line.replace("\t", "").split(":", 1) for line in lines) if lines else None

    return wait_for("the job's cpuset", printed, timeout=30) or {}


# --- 2. the daemon ----------------------------------------------------------------------


class Node:
    def __init__(self, folder: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEPLANE_")}
        env |= {
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
            "TUNEPLANE_NODE_TOKEN": TOKEN,
            "TUNEPLANE_LOCAL_RUNTIME": "process",
            "TUNEPLANE_NODE_STATE_DIR": str(folder / "state"),
            "TUNEPLANE_STORAGE_ROOT": str(folder),
        }
        self.log = folder / "daemon.log"
        command = [sys.executable, "-m", "tuneplane_node", "serve", "--host", "127.0.0.1"]
        command += ["--port", str(self.port)]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while not self._up():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def _up(self) -> bool:
        try:
            return self.call("GET", "/healthz")[0] == 200
        except OSError:
            return False

    def call(self, method: str, path: str, body: object = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data=data, method=method,
            headers=HEADERS | ({"Content-Type": "application/json"} if data else {}),
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                raw = answer.read()
                status = answer.status
        except urllib.error.HTTPError as exc:
            raw, status = exc.read(), exc.code
        text = raw.decode()
        return status, (json.loads(text) if text.startswith(("{", "[")) else text)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


def launch_body(ref: str, command: list[str]) -> dict[str, Any]:
    container = {
        "name": ref, "image": "none", "command": command, "env": {}, "gpus": [],
        "mounts": [], "labels": {}, "workdir": "", "shm_size": "", "cpu_limit": "",
        "memory_limit": "", "network": "", "user": "",
    }  # fmt: skip
    return {"run_id": f"run-{ref}", "requested_gpus": 1, "container": container}


def wait_for(what: str, ask: Any, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = ask()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def daemon_check(cards: int, cpusets: dict[int, str], python: str, hold_s: float) -> None:
    folder = Path(tempfile.mkdtemp(prefix="tuneplane-gpu-check-"))
    node = Node(folder)
    outsider: subprocess.Popen[bytes] | None = None
    try:
        _, inventory = node.call("GET", "/node/v1/inventory")
        print(
            "inventory:", json.dumps({k: inventory.get(k) for k in ("accelerator_count", "gpus")})
        )
        expect("inventory counts the cards", inventory.get("accelerator_count") == cards)
        _, health = node.call("GET", "/node/v1/health")
        print(
            "health, idle:",
            json.dumps(
                {
                    k: health.get(k)
                    for k in (
                        "ok",
                        "gpus_total",
                        "free_gpus",
                        "external",
                        "gpu_probe",
                        "gpu_detail",
                    )
                }
            ),
        )
        expect(
            "idle health is ok with every card free",
            health.get("ok") is True and health.get("free_gpus") == list(range(cards)),
            health.get("error"),
        )

        ref = "tuneplane-gpu-check"
        status, started = node.call(
            "POST", "/node/v1/launch", launch_body(ref, [python, "-c", HOLDER, str(hold_s)])
        )
        print("launch:", status, started)
        expect("a one-card job starts", status == 200 and started.get("gpus") == [0], started)
        cpuset = job_cpuset(node, ref)
        card0 = (inventory.get("gpus") or [{}])[0]
        print(f"the job's cpuset: {cpuset} (card 0 on NUMA node {card0.get('numa_node')})")
        wanted = cpusets.get(0, "")
        expect(
            "the one-card job runs on its card's CPUs",
            bool(wanted) and cpuset.get("Cpus_allowed_list", "").strip() == wanted,
            f"wanted {wanted or 'unknown'}",
        )

        def card_busy() -> Any:
            detail = node.call("GET", "/node/v1/health")[1].get("gpu_detail") or [{}]
            return detail[0] if (detail[0].get("memory_used_mib") or 0) >= 1024 else None

        busy = wait_for("the job's memory on card 0", card_busy)
        _, health = node.call("GET", "/node/v1/health")
        print(
            "health, job running:",
            json.dumps(
                {
                    k: health.get(k)
                    for k in ("gpus_free", "by_job", "external", "external_pids", "gpu_detail")
                }
            ),
        )
        expect("the driver shows the job's gigabyte on its card", busy is not None, busy)
        expect("health says the job holds card 0", health.get("by_job") == {"0": f"run-{ref}"})
        expect(
            "the job's own processes are not external",
            not health.get("external"),
            health.get("external_pids"),
        )

        def own_process() -> Any:  # the sampler reads every TUNEPLANE_STATS_INTERVAL_S
            stats = node.call("POST", "/node/v1/stats", {"refs": [ref]})[1]
            cards = (stats.get("stats", {}).get(ref) or {}).get("gpus") or [{}]
            return stats if cards[0].get("processes") else None

        stats = wait_for("a sample with the job's process", own_process, timeout=30)
        print("stats:", json.dumps(stats))
        gpus = ((stats or {}).get("stats", {}).get(ref) or {}).get("gpus") or [{}]
        expect(
            "stats give the job's card, its memory and the job's own process",
            (gpus[0].get("memory_used_bytes") or 0) >= 1 << 30 and bool(gpus[0].get("processes")),
            gpus,
        )

        _, metrics = node.call("GET", "/metrics")
        lines = [
            line for line in metrics.splitlines() if "gpu" in line and not line.startswith("#")
        ]
        print("metrics, gpu lines:", *lines[:40], sep="\n  ")
        expect("the metrics carry the cards", bool(lines))

        outsider = subprocess.Popen([python, "-c", HOLDER, str(hold_s)])

        def externals() -> Any:
            return node.call("GET", "/node/v1/health")[1].get("external_pids") or {}

        seen = wait_for("the outsider", lambda: externals().get("0"))
        expect(
            "a process the node did not start is external on its card, and only it",
            seen == [outsider.pid],
            externals(),
        )

        status, stopped = node.call("POST", "/node/v1/stop", {"ref": ref, "timeout": 5})
        status2, removed = node.call("POST", "/node/v1/remove", {"ref": ref})
        print("stop:", status, stopped, "remove:", status2, removed)
        # Issue 53: the outsider still holds card 0's memory: the card drains, not free.
        draining = node.call("GET", "/node/v1/health")[1].get("draining") or {}
        print("draining, the outsider still on card 0:", draining)
        expect("the job gone, its card drains while a process holds it", "0" in draining)
        outsider.terminate()
        outsider.wait(30)
        outsider = None
        gone = time.monotonic()
        freed = wait_for(
            "card 0 free",
            lambda: node.call("GET", "/node/v1/health")[1].get("free_gpus") == list(range(cards)),
            timeout=30,
        )
        print(f"card 0 clean and free {time.monotonic() - gone:.1f} s after the process ended")
        expect("stopped and removed, the card is free again once clean", bool(freed))
    finally:
        if outsider is not None:
            outsider.kill()
        node.stop()
        print("daemon log (last lines):", *node.log.read_text().splitlines()[-15:], sep="\n  ")
        shutil.rmtree(folder, ignore_errors=True)


# --- 3. isolation (issue 37) -------------------------------------------------------------


def driver_version() -> str:
    """The driver's version as NVML gives it (``550.54.15``)."""
    from tuneplane_node.gpu.factory import make_probe
    from tuneplane_node.settings import load_settings

    probe = make_probe(load_settings(node_token=TOKEN))
    try:
        return str(probe.snapshot().driver or "")
    finally:
        probe.close()


def isolation_check(image: str, driver: str) -> None:
    """A card job in its own user namespace on podman, and gVisor's GPU proxy's drivers."""
    if shutil.which("podman"):
        argv = ["podman", "run", "--rm", "--userns=auto:size=65536"]
        argv += [
            "--device",
            "nvidia.com/gpu=0",
            image,
            "sh",
            "-c",
            "cat /proc/self/uid_map; nvidia-smi -L",
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        print(
            "podman, a card job of its own user namespace:",
            done.stdout.strip(),
            done.stderr.strip()[-500:],
        )
        mapped = (
            done.returncode == 0 and "GPU 0" in done.stdout and " 0          0 " not in done.stdout
        )
        expect(
            "a card job in its own user namespace sees its card (JOB_USERNS_CARDS may be true)",
            mapped,
        )
    else:
        print("podman: not installed, the user namespace check skipped")
    if shutil.which("runsc"):
        argv = ["runsc", "nvproxy", "list-supported-drivers"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        drivers = done.stdout.split()
        print(f"runsc's nvproxy drivers: {drivers or done.stderr.strip()[-300:]}")
        expect(
            f"gVisor's nvproxy supports driver {driver} (card jobs may be sandboxed)",
            driver in drivers,
        )
    else:
        print("runsc: not installed, the nvproxy check skipped")


# --- 4. faults and readiness (issue 53) ---------------------------------------------------


def fault_check() -> None:
    """What the node reads for its fault and readiness rules on this machine: each card's
    recovery action (driver 565+), its fault as judged now, the NVSwitch fabric's state,
    the Container Toolkit's version against the floor."""
    from tuneplane_node.gpu import nvml, toolkit
    from tuneplane_node.gpu.factory import make_probe
    from tuneplane_node.settings import load_settings

    settings = load_settings(node_token=TOKEN)
    probe = make_probe(settings)
    try:
        snap = probe.snapshot()
        import pynvml

        actions = {}
        for card in snap.cards:
            handle = pynvml.nvmlDeviceGetHandleByIndex(card.index)
            actions[card.index] = nvml.read_recovery_action(handle)
        print("recovery actions (None: the driver cannot say):", actions)
        print("faults now:", {c.index: c.fault for c in snap.cards})
        print("fabric manager:", snap.fabric or "not an NVSwitch machine (or unknown)")
        expect(
            "the recovery action reads NONE or unknown on an idle machine",
            all(action in (None, "NONE") for action in actions.values()),
            actions,
        )
        expect(
            "no card is out for a fault on an idle machine",
            all(c.fault is None or c.fault.scope == "job" for c in snap.cards),
        )
        expect(
            "the NVSwitch fabric is up where there is one",
            snap.fabric in (None, "Completed"),
            snap.fabric,
        )
    finally:
        probe.close()
    version = toolkit.installed_version()
    floor = settings.gpu_toolkit_min_version
    print(f"nvidia-ctk: {version or 'not found'} (floor {floor})")
    if version is not None:
        expect(
            f"the Container Toolkit is at the floor ({toolkit.CVE})",
            not toolkit.older(version, floor),
            version,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--python",
        default=shutil.which("python3") or sys.executable,
        help="the Python (with torch) the job and the outsider run on",
    )
    parser.add_argument("--hold-s", type=float, default=20, help="how long each holds its card")
    parser.add_argument("--isolation", metavar="IMAGE", help="an image with nvidia-smi: step 3")
    args = parser.parse_args()
    cards, cpusets = probe_check()
    if cards:
        fault_check()
        daemon_check(cards, cpusets, args.python, args.hold_s)
    if cards and args.isolation:
        isolation_check(args.isolation, driver_version())
    print(f"{len(failures)} failed: {failures}" if failures else "every expectation met")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
