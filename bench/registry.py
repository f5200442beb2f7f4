"""registry: what one size check of an image costs the node, against a TLS context built
per request.

Before it pulls an image with credentials, the node asks the registry whether they are
accepted (`registry.accepts`), and before a pull it asks how many bytes it will download
(`registry.compressed_size`, the image GC's pull gate). Each document takes one to three
requests (the challenge, the token, the document), https first. The node's variant uses
its shared TLS context (`registry.system_tls`). The peer builds one per request, which
is what the node did before against a registry that speaks https, as every real one
does: `urllib.request.urlopen` without a context builds one per https connection. The
stand-in is the size tests' (`tests/unit/test_fetch_registry.py`): plain http on loopback
behind a Bearer token service, an index then this platform's manifest. No engine, no
daemon.
"""

from __future__ import annotations

import argparse
import platform
import ssl
import statistics
import time
from collections.abc import Callable

import harness  # noqa: F401  (it puts the checkout on sys.path)

from tests.unit.test_fetch_registry import Manifests, serving
from tuneplane_node.fetch import registry


def measured(check: Callable[[], object], rounds: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of one check."""
    walls, cpus = [], []
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        check()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls) * 1000, statistics.median(cpus) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="checks per variant")
    args = parser.parse_args()
    print(f"machine: python {platform.python_version()}, {ssl.OPENSSL_VERSION}")
    shared = registry.system_tls
    with serving(Manifests) as host:
        image = f"{host}/team/big:1"

        def check() -> int | None:
            return registry.compressed_size(image, None, timeout=5)

        assert check() == 1000 + 7_000_000 + 2_461_458
        for variant in ("node", "peer", "node"):  # the node twice: noise shows
            use = shared if variant == "node" else ssl.create_default_context
            registry.system_tls = use  # the peer: a context per request
            wall, cpu = measured(check, args.rounds)
            print(f"{variant}: {wall:6.2f} ms a size check, {cpu:6.2f} ms of CPU")
    registry.system_tls = shared


if __name__ == "__main__":
    main()
