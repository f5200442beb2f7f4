"""clients: what a console pays per node for a client, against httpx's own per client.

A console holds one client per node it runs jobs on, thousands of them. Each variant runs
in a fresh process that makes ``--clients`` clients (for http:// and https:// URLs,
nothing connected) and prints the time per client and the memory each adds (the
process's resident set, which counts OpenSSL's certificate stores as Python's heap does
not). The peer is `httpx.Client` as a console would make it by hand (``verify=True``:
httpx's CA bundle, loaded per client), which is also what `NodeClient` cost before it
shared one context. No engine, no daemon.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time

import httpx
from harness import TOKEN, proc_status_kib  # it puts the checkout on sys.path

from tuneplane_node.client import NodeClient


def make(variant: str, scheme: str, count: int) -> None:
    """In this process: ``count`` clients of ``variant``, then one line of figures."""

    def one(n: int) -> object:
        url = f"{scheme}://node-{n}.example:8470"
        if variant == "node":
            return NodeClient(url, token=TOKEN)
        return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"})

    one(-1)  # imports and first-use costs out of the figures
    before, started = proc_status_kib("VmRSS"), time.perf_counter()
    clients = [one(n) for n in range(count)]
    elapsed = time.perf_counter() - started
    grown = proc_status_kib("VmRSS") - before
    each_ms, each_kib = elapsed / count * 1000, grown / count
    print(f"{variant:5s} {scheme:5s}: {each_ms:7.2f} ms and {each_kib:6.0f} KiB a client")
    assert len(clients) == count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200, help="clients per variant")
    parser.add_argument("--one", nargs=2, metavar=("VARIANT", "SCHEME"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        variant, scheme = args.one
        make(variant, scheme, args.clients)
        return
    print(
        f"machine: python {platform.python_version()}, {platform.machine()}, {args.clients} clients"
    )
    for scheme in ("http", "https"):
        for variant in ("node", "peer"):
            argv = [
                sys.executable,
                __file__,
                "--clients",
                str(args.clients),
                "--one",
                variant,
                scheme,
            ]
            subprocess.run(argv, check=True)


if __name__ == "__main__":
    main()
