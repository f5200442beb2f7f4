"""prefetch: a large image pulled by the node and its job started, against the engine's
own CLI, on docker and on podman.

The image (``--megabytes`` of incompressible bytes in ``--layers`` layers on the shared
busybox) is built on the bench's docker engine, pushed to the local registry as
``127.0.0.1:5000/tuneplane-bench/prefetch:<session>`` and removed from the engine, and
taken off each engine again before each pull (so each one downloads every byte). Per
engine and round, alternating:
(a) the node: ``POST /node/v1/images/pull``, ``GET /node/v1/images`` every 50 ms until it
    lists the image, then ``POST /node/v1/launch`` and observe until the job runs;
(b) the CLI: ``docker pull`` (``podman --remote pull``), then ``docker run -d``.
Each from the first request to the job running. Goal: (a) within 1.05x of (b). At the end
the image goes from the engines and from the registry (its manifest: the registry's
blobs wait for its offline garbage collection).
"""

from __future__ import annotations

import os
import random
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import requests
from harness import (
    IMAGE,
    PREFIX,
    SLEEP,
    Api,
    Daemon,
    arguments,
    docker_host,
    engine_client,
    machine,
    median,
    remove_container,
    rotated,
)

REGISTRY = "127.0.0.1:5000"
PODMAN_URL = os.environ.get("TUNEPLANE_BENCH_PODMAN_URL", "unix:///run/podman/podman.sock")
POLL_S = 0.05
SEED = 20  # the same bytes every run: the registry keeps one copy of each layer
CHUNK = 2**20


def cli(engine: str) -> list[str]:
    if engine == "docker":
        return ["docker", "-H", docker_host()]
    return ["podman", "--remote", "--url", PODMAN_URL]


def run(argv: list[str], *, timeout: float = 900) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])}...: {done.stderr.strip()[-500:]}")
    return done.stdout


def build(image: str, *, megabytes: int, layers: int) -> None:
    """The image, built on the bench engine, pushed, and removed from it again: its
    layers (random bytes of this run's seed, in no other image) leave with it."""
    own = cli("docker")
    rng = random.Random(SEED)
    with tempfile.TemporaryDirectory(prefix="tuneplane-bench-prefetch-") as context:
        lines = [f"FROM {IMAGE}"]
        for layer in range(layers):
            with open(Path(context) / f"layer{layer}", "wb") as blob:
                for _ in range(megabytes // layers):
                    blob.write(rng.randbytes(CHUNK))
            lines.append(f"COPY layer{layer} /data/layer{layer}")
        (Path(context) / "Dockerfile").write_text("\n".join(lines) + "\n")
        started = time.monotonic()
        try:
            pushed(own, image, context)
        finally:
            run([*own, "rmi", "-f", image])
    print(f"built and pushed {image} ({megabytes} MB, {layers} layers) in "
          f"{time.monotonic() - started:.0f} s", flush=True)  # fmt: skip


def pushed(own: list[str], image: str, context: str) -> None:
    run([*own, "build", "-q", "-t", image, context])
    for attempt in range(3):  # a registry under the load of other tests drops a push
        try:
            run([*own, "push", image])
            return
        except RuntimeError as exc:
            print(f"push failed ({exc}), again", flush=True)
            if attempt == 2:
                raise


def forget(engine: str, image: str) -> None:
    """The image off the engine, so the next pull downloads it (its name only: the
    busybox base stays, as it is on any node)."""
    subprocess.run(
        [*cli(engine), "rmi", "-f", image], capture_output=True, timeout=300, check=False
    )


def unregister(image: str) -> None:
    """Delete the image's manifest from the registry (deletes are enabled there)."""
    name, tag = image.removeprefix(f"{REGISTRY}/").rsplit(":", 1)
    accept = "application/vnd.docker.distribution.manifest.v2+json"
    head = requests.head(f"http://{REGISTRY}/v2/{name}/manifests/{tag}", headers={"Accept": accept})
    digest = head.headers.get("Docker-Content-Digest")
    if digest:
        requests.delete(f"http://{REGISTRY}/v2/{name}/manifests/{digest}").raise_for_status()


def by_node(api: Api, image: str, name: str) -> float:
    """Prefetch, wait until the node lists the image, launch, wait until it runs."""
    started = time.monotonic()
    answer = api.session.post(api.url + "/node/v1/images/pull", json={"image": image})
    if answer.status_code != 202:
        raise RuntimeError(f"prefetch: {answer.status_code} {answer.text}")
    while True:
        listed = api.session.get(api.url + "/node/v1/images").json()
        failed = [p for p in listed["pulls"] if p["image"] == image and p["phase"] == "failed"]
        if failed:
            raise RuntimeError(f"prefetch failed: {failed[0]['error']}")
        if any(i["image"] == image for i in listed["images"]):
            break
        time.sleep(POLL_S)
    container = {"name": name, "image": image, "command": SLEEP}
    body = {"run_id": name.removeprefix(PREFIX), "requested_gpus": 0, "container": container}
    if api.launch(body).get("phase") != "running":
        raise RuntimeError("the image was listed, yet the launch pulled")
    seconds = time.monotonic() - started
    api.remove(name)
    return seconds


def by_cli(engine: str, image: str, name: str) -> float:
    started = time.monotonic()
    run([*cli(engine), "pull", "-q", image])
    run(
        [
            *cli(engine),
            "run",
            "-d",
            "--name",
            name,
            "--network",
            "host",
            image,
            "/bin/sleep",
            "3600",
        ]
    )
    seconds = time.monotonic() - started
    run([*cli(engine), "rm", "-f", name])
    return seconds


def measure(engine: str, image: str, rounds: int, session: str) -> dict[str, list[float]]:
    env = {"TUNEPLANE_LOCAL_RUNTIME": engine}
    if engine == "podman":
        env["TUNEPLANE_PODMAN_URL"] = PODMAN_URL
    figures: dict[str, list[float]] = {"node": [], "cli": []}
    with Daemon(env=env) as daemon:
        api = Api(daemon.url)
        methods: dict[str, Callable[[str], float]] = {
            "node": lambda name: by_node(api, image, name),
            "cli": lambda name: by_cli(engine, image, name),
        }
        try:
            for round_index in range(rounds):
                for method in rotated(list(methods), round_index):
                    forget(engine, image)
                    name = f"{PREFIX}prefetch-{session}-{engine}-{method}-{round_index}"
                    figures[method].append(methods[method](name))
                    print(f"{engine} {method:4} round {round_index}: "
                          f"{figures[method][-1]:.2f} s", flush=True)  # fmt: skip
        finally:
            api.close()
            forget(engine, image)
    return figures


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], containers=0, rounds=3)
    parser.add_argument("--megabytes", type=int, default=600, help="the image's own bytes")
    parser.add_argument("--layers", type=int, default=5)
    parser.add_argument("--engines", default="docker,podman")
    args = parser.parse_args()
    print(machine())
    session = uuid.uuid4().hex[:8]
    image = f"{REGISTRY}/tuneplane-bench/prefetch:{session}"
    build(image, megabytes=args.megabytes, layers=args.layers)
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for engine in args.engines.split(","):
            results[engine] = measure(engine, image, args.rounds, session)
    finally:
        unregister(image)
        client = engine_client()
        for name in [c["Names"][0].lstrip("/") for c in client.api.containers(
                all=True, filters={"name": f"{PREFIX}prefetch-{session}"})]:  # fmt: skip
            remove_container(client, name)
        client.close()
    print(f"\n{args.megabytes} MB in {args.layers} layers, {args.rounds} rounds per engine")
    for engine, figures in results.items():
        node, theirs = median(figures["node"]), median(figures["cli"])
        spread = " ".join(f"{name} {min(v):.2f}-{max(v):.2f}" for name, v in figures.items())
        verdict = "MET" if node <= 1.05 * theirs else "MISSED"
        print(f"{engine:6} node median {node:.2f} s, cli median {theirs:.2f} s: "
              f"{node / theirs:.3f}x ({spread}); goal <= 1.05x: {verdict}")  # fmt: skip


if __name__ == "__main__":
    main()
