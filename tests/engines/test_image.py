"""The image (Dockerfile) as an operator builds and runs it, on the shared dev engine.

No public registry is reachable from the test machines, so where the slim Python base
cannot be pulled, one is made from Debian packages (debootstrap, then an import) and
kept under its tag: the first run pays ~45 s for it, later runs nothing (the whole
module: ~70 s the first time, ~23 s after). The image built here, its build stage and
every container are removed again; the base stays as the cache.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from docker.models.containers import Container

from tests.support.console import TOKEN
from tests.support.daemons import REPO, free_port
from tests.support.engines import DEV_DOCKER_SOCK, TESTS_DOCKER_SOCK, engine_missing
from tests.support.images import IMAGE
from tests.support.jobs import unique
from tuneplane_node.wire import PROTOCOL, PROTOCOL_HEADER

pytestmark = pytest.mark.engine

PULLED_BASE = "python:3.11-slim-bookworm"  # the Dockerfile's default BASE
MADE_BASE = "tuneplane-test/python-base:bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    """The suite's engine: the image test never touches the developer's."""
    engine = docker.DockerClient(base_url=f"unix://{TESTS_DOCKER_SOCK}", timeout=300)
    try:
        engine.ping()
    except docker.errors.DockerException as exc:
        engine_missing("docker", str(exc))
    yield engine
    engine.close()


def base_image(client: docker.DockerClient, workdir: Path) -> str:
    """The slim Python base: present, pulled, or made from Debian packages."""
    for tag in (PULLED_BASE, MADE_BASE):
        if has_image(client, tag) or copied_from_development_engine(tag):
            return tag
    try:
        client.images.pull(PULLED_BASE)
        return PULLED_BASE
    except docker.errors.DockerException:
        pass  # no registry: make one
    make_debian_base(client, workdir / "rootfs")
    return MADE_BASE


def copied_from_development_engine(tag: str) -> bool:
    """A base the development engine holds (read there, as engines.sh copies the test
    image), loaded into the suite's engine: no second debootstrap."""
    saved = subprocess.run(
        ["docker", "-H", f"unix://{DEV_DOCKER_SOCK}", "save", tag], capture_output=True
    )
    if saved.returncode != 0:
        return False
    load = ["docker", "-H", f"unix://{TESTS_DOCKER_SOCK}", "load", "-q"]
    subprocess.run(load, input=saved.stdout, check=True, capture_output=True)
    return True


def has_image(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def make_debian_base(client: docker.DockerClient, rootfs: Path) -> None:
    """Debian 12 with its Python 3.11 and venv, as a slim base would have them."""
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        pytest.fail("debootstrap is missing: contrib/dev/engines.sh installs it")
    packages = "--include=python3,python3-venv,ca-certificates"
    command = [debootstrap, "--variant=minbase", packages, "bookworm", str(rootfs)]
    subprocess.run([*command, DEBIAN_MIRROR], check=True, capture_output=True, timeout=900)
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):  # 100 MB of .debs
        shutil.rmtree(rootfs / cache, ignore_errors=True)
    archive = rootfs.parent / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(rootfs, arcname=".")
    shutil.rmtree(rootfs)
    repository, tag = MADE_BASE.split(":")
    client.api.import_image(src=str(archive), repository=repository, tag=tag)
    archive.unlink()


def build_context(workdir: Path) -> Path:
    """The repository's Dockerfile, .dockerignore and pins, and the wheels that
    docs/operating.md's command makes (this package's and every pinned dependency's)."""
    context = workdir / "context"
    context.mkdir()
    for name in ("Dockerfile", ".dockerignore", "constraints.txt"):
        shutil.copy(REPO / name, context / name)
    wheel = [sys.executable, "-m", "pip", "wheel", "-q", "-c", str(REPO / "constraints.txt")]
    output = str(context / "dist" / "wheels")
    subprocess.run([*wheel, "-w", output, str(REPO)], check=True, timeout=600)
    return context


@pytest.fixture(scope="module")
def image(client: docker.DockerClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    workdir = tmp_path_factory.mktemp("image")
    base = base_image(client, workdir)
    tag = f"tuneplane-test/node:{unique('img')}"
    started = time.monotonic()
    _, log = client.images.build(
        path=str(build_context(workdir)), tag=tag, buildargs={"BASE": base}, rm=True, forcerm=True
    )
    print(f"image built in {time.monotonic() - started:.0f} s on {base}")
    yield tag
    client.images.remove(tag, force=True)
    output = "".join(str(line.get("stream", "")) for line in log if isinstance(line, dict))
    remove_untagged(client, STEP_IMAGE.findall(output))


STEP_IMAGE = re.compile(r"^ ---> ([0-9a-f]{12})$", re.MULTILINE)


def remove_untagged(client: docker.DockerClient, ids: list[str]) -> None:
    """The build stage's image, which the classic builder leaves untagged (and its
    steps); a tagged one (the base) or one in use is left alone."""
    for image_id in reversed(ids):
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            if not client.images.get(image_id).tags:
                client.images.remove(image_id)


@pytest.fixture
def made(client: docker.DockerClient) -> Iterator[list[str]]:
    """Names of the containers a test made, force-removed after it."""
    names: list[str] = []
    yield names
    for name in names:
        with contextlib.suppress(docker.errors.NotFound):
            client.containers.get(name).remove(force=True)


def run_node(client: docker.DockerClient, image: str, made: list[str], port: int) -> Container:
    """The image as docs/operating.md runs it: not root, the socket's group added, read-only."""
    name = unique("tuneplane-test-node")
    made.append(name)
    return client.containers.run(
        image,
        name=name,
        detach=True,
        network_mode="host",
        read_only=True,
        tmpfs={"/var/lib/tuneplane-node": "uid=10001,mode=0700"},
        group_add=[str(TESTS_DOCKER_SOCK.stat().st_gid)],
        volumes={str(TESTS_DOCKER_SOCK): {"bind": "/var/run/docker.sock", "mode": "rw"}},
        environment={
            "TUNEPLANE_NODE_TOKEN": TOKEN,
            "TUNEPLANE_NODE_PORT": str(port),
            "TUNEPLANE_NODE_HOST": "127.0.0.1",
            "TUNEPLANE_LOCAL_RUNTIME": "docker",
            "TUNEPLANE_DOCKER_HOST": "unix:///var/run/docker.sock",
            # One simulated card written in the labels, none handed over: no GPU here.
            "TUNEPLANE_LOCAL_GPU_COUNT": "1",
            "TUNEPLANE_LOCAL_GPU_PASSTHROUGH": "false",
        },
    )


def call(port: int, path: str, body: dict[str, Any] | None = None) -> Any:
    headers = {"Authorization": f"Bearer {TOKEN}", PROTOCOL_HEADER: str(PROTOCOL)}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data, headers)
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def wait_healthz(node: Container, port: int, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        node.reload()
        assert node.status == "running", node.logs().decode()
        try:
            return call(port, "/healthz")
        except (urllib.error.URLError, ConnectionError):
            assert time.monotonic() < deadline, node.logs().decode()
            time.sleep(0.3)


def test_the_image_serves_as_a_non_root_user_and_launches_a_job(
    client: docker.DockerClient, image: str, made: list[str]
) -> None:
    port = free_port()
    node = run_node(client, image, made, port)
    assert wait_healthz(node, port) == {"ok": True}
    assert client.images.get(image).attrs["Config"]["User"] == "10001"
    run_id = unique("img-job")
    made.append(f"tuneplane-{run_id}")
    container = {"image": IMAGE, "command": ["/bin/sh", "-c", "echo hello; sleep 30"]}
    launched = call(port, "/node/v1/launch", {"run_id": run_id, "container": container})
    assert launched["phase"] == "running", launched
    states = call(port, "/node/v1/observe", {"refs": [f"tuneplane-{run_id}"]})["states"]
    assert states[f"tuneplane-{run_id}"]["status"] == "running"
    assert call(port, "/node/v1/remove", {"ref": f"tuneplane-{run_id}"}) == {"ok": True}
    health = call(port, "/node/v1/health")
    assert health["ok"] is True and health["runtime"]["name"] == "docker"


def test_the_image_healthcheck_passes_while_the_node_serves(
    client: docker.DockerClient, image: str, made: list[str]
) -> None:
    """The HEALTHCHECK's own command, run in the container (the engine would first run
    it only after its 30 s interval)."""
    port = free_port()
    node = run_node(client, image, made, port)
    wait_healthz(node, port)
    check = client.images.get(image).attrs["Config"]["Healthcheck"]["Test"]
    assert check[0] == "CMD"
    exit_code, output = node.exec_run(check[1:])
    assert exit_code == 0, output
    node.stop(timeout=30)  # SIGTERM: a clean exit, no traceback
    assert node.wait(timeout=30)["StatusCode"] == 0
    assert b"Traceback" not in node.logs()
