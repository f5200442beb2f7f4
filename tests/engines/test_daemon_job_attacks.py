"""The job as the attacker: customer code inside the container, launched through the API
like any job, on docker and podman. Each finding of issue 18 is replayed and refused.

The jobs are busybox shell scripts and one static binary: what a malicious image holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import MakeNode, open_runtime
from tests.http.test_daemon_server import served, until_serving
from tests.support.console import HEADERS, TOKEN, Console, console_0315
from tests.support.daemons import free_port
from tests.support.engines import docker_host, engine_settings, podman_url
from tests.support.images import IMAGE
from tests.support.jobs import unique
from tests.support.nodes import storage_root
from tuneplane_node.daemon.server import serve
from tuneplane_node.jobs.rules.confinement import JobRules
from tuneplane_node.settings import NodeSettings

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]
PAGE = os.sysconf("SC_PAGE_SIZE")
# Capability bits (linux/capability.h) a job must not hold, and one it keeps.
DROPPED = {"NET_BIND_SERVICE": 10, "NET_RAW": 13, "MKNOD": 27, "AUDIT_WRITE": 29, "SETFCAP": 31}
CHOWN = 0
CGROUP_FILE = "cat /sys/fs/cgroup/{v1}/{name} 2>/dev/null || cat /sys/fs/cgroup/{name}"
PROBE = "; ".join(
    [
        "grep -E '^(CapEff|NoNewPrivs):' /proc/self/status",
        "arping -c1 -w1 -I lo 127.0.0.1 2>&1",  # a packet socket: NET_RAW
        "unshare -U true 2>&1; echo userns=$?",
        "echo oom=$(cat /proc/self/oom_score_adj)",
        "echo pids_max=$(" + CGROUP_FILE.format(v1="pids", name="pids.max") + ")",
        "echo mem=$(cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null"
        " || cat /sys/fs/cgroup/memory.max)",
        "echo probed",
    ]
)
SUID_SOURCE = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(void) {
    char line[256];
    FILE *status = fopen("/proc/self/status", "r");
    printf("uid=%d euid=%d\n", (int)getuid(), (int)geteuid());
    while (status && fgets(line, sizeof line, status))
        if (!strncmp(line, "CapEff:", 7) || !strncmp(line, "NoNewPrivs:", 11))
            fputs(line, stdout);
    return 0;
}
"""


def field(logs: str, name: str) -> str:
    match = re.search(rf"{name}[=:]\s*(\S+)", logs)
    assert match, f"{name} not in {logs!r}"
    return match.group(1)


async def run_to_the_end(node: Console, command: list[str], **container: Any) -> str:
    ref, _ = await node.launch(command, **container)
    await node.wait_for(ref, "status", "exited", timeout=120)
    return await node.logs(ref, tail=100)


async def launch_0315(node: Console, command: list[str]) -> str:
    """A 0.3.15 console's launch: every field, "" for network (host, its default)."""
    body = console_0315(unique("job"), 0, image=IMAGE, command=command)
    assert node.made is not None
    node.made.append(f"tuneplane-{body['run_id']}")
    answer = await node.ok("POST", "/node/v1/launch", json=body)
    assert answer["phase"] == "running"
    return f"tuneplane-{body['run_id']}"


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_host_network_job_cannot_sniff_nor_escape_its_bounds(
    make_node: MakeNode, engine: str
) -> None:
    node = await make_node(engine, job_host_network="allow")  # 0.3.15's rule: the host's
    ref = await launch_0315(node, ["/bin/sh", "-c", PROBE])
    state = await node.wait_for(ref, "status", "exited", timeout=120)
    logs = await node.logs(ref)

    assert state["exit_code"] == 0 and "probed" in logs
    capabilities = int(field(logs, "CapEff"), 16)
    assert {name for name, bit in DROPPED.items() if capabilities >> bit & 1} == set()
    assert capabilities >> CHOWN & 1  # what a package manager needs stays
    assert field(logs, "NoNewPrivs") == "1"
    assert "socket: Operation not permitted" in logs  # no raw socket: no sniffer
    assert field(logs, "userns") != "0"  # no user namespace, podman included
    assert field(logs, "oom") == "500"
    assert field(logs, "pids_max") == "16384"
    expected = JobRules(engine_settings(engine)).memory_limit
    assert expected is not None
    assert int(field(logs, "mem")) == expected // PAGE * PAGE  # a limit, though none was asked


@pytest.mark.parametrize("engine", ENGINES)
async def test_restricted_jobs_hold_no_capability_and_a_consoles_limit_is_kept(
    make_node: MakeNode, engine: str
) -> None:
    node = await make_node(engine, job_capabilities="restricted")
    logs = await run_to_the_end(node, ["/bin/sh", "-c", PROBE], memory_limit="256m")

    assert int(field(logs, "CapEff"), 16) == 0
    assert int(field(logs, "mem")) == 256 * 2**20


def static_image(tmp_path: Path, engine: str, source: str, *, mode: int) -> str:
    """An image of one static binary, ``/job``, root-owned with ``mode``, made on the
    engine for this test (the test removes it)."""
    (tmp_path / "job.c").write_text(source)
    binary = tmp_path / "job"
    subprocess.run(["gcc", "-static", "-O1", "-o", binary, tmp_path / "job.c"], check=True)

    def root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid, info.gid, info.mode = 0, 0, mode
        return info

    with tarfile.open(tmp_path / "image.tar", "w") as tar:
        tar.add(binary, arcname="job", filter=root_owned)
    # Fully qualified: the node hands the engine canonical names (docker.io/ added), and
    # podman would store a short name as localhost/.
    image = f"docker.io/tuneplane-test/static:{unique('t')}"
    archive = str(tmp_path / "image.tar")
    subprocess.run([*engine_cli(engine), "import", archive, image], check=True, capture_output=True)
    return image


@pytest.fixture
def suid_image(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """An image holding one static setuid-root binary that prints who it runs as."""
    engine = request.node.callspec.params["engine"]
    image = static_image(tmp_path, engine, SUID_SOURCE, mode=0o4755)
    yield image
    subprocess.run([*engine_cli(engine), "rmi", "-f", image], check=False, capture_output=True)


def engine_cli(engine: str) -> list[str]:
    if engine == "podman":
        return ["podman", "--remote", "--url", podman_url()]
    host = docker_host()
    return ["docker", *(["-H", host] if host else [])]


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_setuid_binary_does_not_give_a_user_root_back(
    suid_image: str, make_node: MakeNode, engine: str
) -> None:
    node = await make_node(engine)
    logs = await run_to_the_end(node, ["/job"], image=suid_image, user="1000:1000")

    assert (field(logs, "uid"), field(logs, "euid")) == ("1000", "1000")
    assert int(field(logs, "CapEff"), 16) == 0
    assert field(logs, "NoNewPrivs") == "1"


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_fork_bomb_is_held_to_the_pids_limit(make_node: MakeNode, engine: str) -> None:
    node = await make_node(engine, job_pids_limit=200)
    # `read` is the shell's own: at the limit, no process can be made to count them.
    current = CGROUP_FILE.format(v1="pids", name="pids.current").replace("cat ", "read n < ")
    # The bomb in a child shell, which dies at its first failed fork; its sleeps stay.
    bomb = "i=0; while [ $i -lt 400 ]; do sleep 300 & i=$((i+1)); done"
    script = f"sh -c '{bomb}' 2>/dev/null; {current}; echo current=$n; echo done"
    ref, _ = await node.launch(["/bin/sh", "-c", script])
    logs = ""
    for _ in range(300):
        logs = await node.logs(ref)
        if "done" in logs:
            break
        await asyncio.sleep(0.1)
    assert "done" in logs, logs
    assert 150 <= int(field(logs, "current")) <= 200  # it reached the limit, and no further


async def log_files(engine: str, ref: str) -> list[Path]:
    """The job's log files on the engine's disk, rotated ones included."""
    runtime = await open_runtime(engine)
    try:
        doc = await runtime.pool.call(runtime._document, ref)
    finally:
        await runtime.close()
    path = Path(doc.get("LogPath") or doc["HostConfig"]["LogConfig"]["Path"])
    return sorted(path.parent.glob(path.name + "*"))


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_job_flooding_its_log_keeps_to_its_log_budget(
    make_node: MakeNode, engine: str
) -> None:
    node = await make_node(engine, job_log_max_bytes=2**20, job_log_max_files=2)
    line = "x" * 99
    script = f"yes {line} | head -c 30000000; echo the-newest-line"
    ref, _ = await node.launch(["/bin/sh", "-c", script])
    await node.wait_for(ref, "status", "exited", timeout=180)

    files = await log_files(engine, ref)
    on_disk = sum(path.stat().st_size for path in files)
    assert files and on_disk <= 2 * 2**20 + 64 * 2**10, (files, on_disk)  # 30 MB written
    assert "the-newest-line" in await node.logs(ref, tail=3)


async def test_a_link_planted_into_another_tenants_files_is_refused(
    make_node: MakeNode, tmp_path: Path
) -> None:
    """Tenant A's job left tenantA/ckpt -> tenantB/ckpt in the shared storage root."""
    storage = storage_root(tmp_path)
    (storage / "tenantB" / "ckpt").mkdir(parents=True)
    (storage / "tenantA").mkdir()
    (storage / "tenantA" / "ckpt").symlink_to(storage / "tenantB" / "ckpt")
    node = await make_node("docker")

    mount = [str(storage / "tenantA" / "ckpt"), "/ckpt", False]
    ref, body = await node.launch(["/bin/touch", "/ckpt/x"], mounts=[mount], expect=422)

    assert body["detail"].startswith("container.mounts[0]: ")
    assert "symlink" in body["detail"]
    assert (await node.state(ref))["exists"] is False
    assert list((storage / "tenantB" / "ckpt").iterdir()) == []


BINDER_SOURCE = r"""
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
/* What a job hoping to impersonate the node does: bind its port, each family, hard. */
static void take(int family, int port) {
    int one = 1, s = socket(family, SOCK_STREAM, 0), r;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    setsockopt(s, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    if (family == AF_INET6) {
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons(port)};
        setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        r = bind(s, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
        r = bind(s, (struct sockaddr *)&a, sizeof a);
    }
    if (r == 0) r = listen(s, 1);
    printf("%s=%s\n", family == AF_INET6 ? "v6" : "v4", r == 0 ? "taken" : strerror(errno));
}
int main(int argc, char **argv) {
    take(AF_INET6, atoi(argv[1]));
    take(AF_INET, atoi(argv[1]));
    return 0;
}
"""


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_host_network_job_cannot_take_the_nodes_port(tmp_path: Path, engine: str) -> None:
    """`serve` itself on 0.0.0.0; a 0.3.15 console's job on the host network binds
    [::]:<port> and 0.0.0.0:<port>, as a job hoping to answer the consoles would."""
    image = static_image(tmp_path, engine, BINDER_SOURCE, mode=0o755)
    # On the host's network as under 0.3.15 (`allow`).
    settings = served_settings(tmp_path, engine, job_host_network="allow")
    try:
        async with served(settings, host="0.0.0.0") as port:
            logs = await job_on(port, console_0315(unique("binder"), 0, image=image,
                                                   command=["/job", str(port)]))  # fmt: skip
    finally:
        subprocess.run([*engine_cli(engine), "rmi", "-f", image], check=False, capture_output=True)

    assert "v6=Address already in use" in logs, logs  # [::] taken would answer IPv6 consoles
    assert "v4=Address already in use" in logs, logs


async def job_on(port: int, launch: dict[str, Any]) -> str:
    """Launch through a served node, wait for the exit, read the logs, remove the job."""
    ref = f"tuneplane-{launch['run_id']}"
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}", headers=HEADERS) as http:
        async with http.post("/node/v1/launch", json=launch) as answer:
            assert answer.status == 200, await answer.text()
        try:
            return await exited_logs(http, ref)
        finally:
            async with http.post("/node/v1/remove", json={"ref": ref}) as answer:
                assert answer.status == 200


SQUATTER_SOURCE = r"""
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>
/* A job waiting in a bind loop for the node's port, to answer the next console request. */
int main(int argc, char **argv) {
    int one = 1, s = -1, tries;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
    for (tries = 0; tries < 3000; tries++) { /* 30 s */
        s = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        setsockopt(s, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
        if (bind(s, (struct sockaddr *)&a, sizeof a) == 0 && listen(s, 8) == 0) break;
        close(s), s = -1;
        usleep(10000);
    }
    printf(s < 0 ? "never bound\n" : "bound\n");
    fflush(stdout);
    if (s < 0) return 0;
    fd_set ready;
    FD_ZERO(&ready);
    FD_SET(s, &ready);
    struct timeval wait = {.tv_sec = 20};
    if (select(s + 1, &ready, NULL, NULL, &wait) == 1) {
        char got[256] = {0};
        int c = accept(s, NULL, NULL);
        read(c, got, sizeof got - 1);
        printf("got a request: %s\n", got);
    } else printf("no request\n");
    return 0;
}
"""


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_job_in_a_bind_loop_across_a_restart_gets_nothing(
    tmp_path: Path, engine: str
) -> None:
    """Issue 38: `serve` on a plain port (no socket unit, no TLS), a 0.3.15 console's job
    asking for the host network and looping on bind() for the node's port. The daemon
    restarts; the job must not get the port, nor the console's next request and token:
    under the default rule (whole-node) it runs on a network of its own."""
    image = static_image(tmp_path, engine, SQUATTER_SOURCE, mode=0o755)
    settings = served_settings(tmp_path, engine)  # the default rule, whole-node
    port = free_port()
    launch = console_0315(unique("squat"), 0, image=image, command=["/job", str(port)])
    ref = f"tuneplane-{launch['run_id']}"
    url = f"http://127.0.0.1:{port}"
    try:
        async with (
            serving(settings, port),
            aiohttp.ClientSession(url, headers=HEADERS) as http,
            http.post("/node/v1/launch", json=launch) as answer,
        ):
            assert answer.status == 200, await answer.text()
            assert (await answer.json())["phase"] == "running"
        await asyncio.sleep(1.0)  # the daemon is down: the job loops on bind() meanwhile
        async with (  # CannotListen if the job had the port
            serving(settings, port),
            aiohttp.ClientSession(url, headers=HEADERS) as http,
        ):
            async with http.get("/node/v1/health") as answer:
                assert answer.status == 200  # the node's answer, to the token's holder
            logs = await exited_logs(http, ref)
            async with http.post("/node/v1/remove", json={"ref": ref}) as answer:
                assert answer.status == 200
    finally:
        subprocess.run([*engine_cli(engine), "rm", "-f", ref], check=False, capture_output=True)
        subprocess.run([*engine_cli(engine), "rmi", "-f", image], check=False, capture_output=True)

    assert "got a request" not in logs, logs
    assert "bound" in logs, logs  # it bound, in a network of its own: the node's port is not


def served_settings(tmp_path: Path, engine: str, **more: Any) -> NodeSettings:
    """A node on ``engine`` without cards, to be served (`serve`) by the test itself."""
    return engine_settings(
        engine,
        node_token=TOKEN,
        storage_root=storage_root(tmp_path),
        node_state_dir=tmp_path / "state",
        local_gpu_count=0,
        local_gpu_passthrough=False,
        local_stop_timeout=0,
        **more,
    )


@contextlib.asynccontextmanager
async def serving(settings: NodeSettings, port: int) -> AsyncIterator[None]:
    """`serve` on 0.0.0.0 at ``port``, stopped (a restart's first half) at the end."""
    task = asyncio.create_task(serve(settings, host="0.0.0.0", port=port), name="serving")
    try:
        await until_serving(port, task, tls=False)
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def exited_logs(http: aiohttp.ClientSession, ref: str) -> str:
    """The logs of ``ref`` once it has exited (or after a minute)."""
    for _ in range(600):
        async with http.post("/node/v1/observe", json={"refs": [ref]}) as answer:
            if (await answer.json())["states"][ref]["status"] == "exited":
                break
        await asyncio.sleep(0.1)
    async with http.get("/node/v1/logs", params={"ref": ref}) as answer:
        return str((await answer.json())["logs"])
