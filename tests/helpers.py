"""What the tests share: where the engines are, a console over a socket, a throttling
registry proxy, runtimes that clean up after themselves, and waiting without guessing.

Test modules import from here (and `tests.fakes`), never from each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.daemon.state import NODE
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.gpu.probe import GpuProbe
from tuneplane_node.jobs import Node, PendingView
from tuneplane_node.jobs.node import build_node
from tuneplane_node.runtime.base import ContainerRuntime, ContainerState, LogQuery
from tuneplane_node.runtime.cache import CachedRuntime
from tuneplane_node.runtime.engines.docker import DockerRuntime
from tuneplane_node.runtime.engines.networks.jobnetwork import own_network
from tuneplane_node.runtime.engines.podman import PodmanRuntime
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings
from tuneplane_node.wire import PROTOCOL, PROTOCOL_HEADER
from tuneplane_node.wire.values import FAILED, LABEL_RUN_ID, container_name

# --- where the test engines are (contrib/dev/engines.sh starts them) ---------------------

RUN_DIR = Path("/run/tuneplane-dev")
# The developer's engines (a daemon from the README runs there): no test touches them.
DEV_DOCKER_SOCK = RUN_DIR / "docker.sock"
DEV_PODMAN_SOCK = Path("/run/podman/podman.sock")
# The suite's own Docker engine and podman service, where the engine tests and their
# daemons run (issue 36: a README daemon's card jobs and engine lock failed tests).
TESTS_DOCKER_SOCK = RUN_DIR / "docker-tests.sock"
TESTS_PODMAN_SOCK = RUN_DIR / "podman-tests.sock"
# A Docker engine of the tests' own, for what acts on every container of the node (reap):
# the shared engine holds other people's jobs. A restart goes to a `ThrowawayDocker`.
OWN_DOCKER_SOCK = Path("/run/tuneplane-dev/docker-own.sock")
DEV_ROOT = Path(os.environ.get("TUNEPLANE_DEV_ROOT", "/var/lib/tuneplane-dev"))  # engines.sh's
# A Docker engine whose data root is a small tmpfs of its own, which a test fills up.
FULL_DOCKER_SOCK = Path("/run/tuneplane-dev/docker-full.sock")
FULL_DOCKER_ROOT = Path("/var/lib/tuneplane-dev/docker-full")
REGISTRY = os.environ.get("TUNEPLANE_TEST_REGISTRY", "127.0.0.1:5000")
IMAGE = "tuneplane-test/busybox:1"
REGISTRY_IMAGE = f"{REGISTRY}/{IMAGE}"
BIG_IMAGE = f"{REGISTRY}/tuneplane-test/big:1"  # in the registry only: a pull downloads ~9 MB


def state_dir(tmp_path: Path) -> Path:
    """A test node's state directory."""
    return tmp_path / "state"


def storage_root(tmp_path: Path) -> Path:
    """A test node's storage root (made): a directory of its own, beside the node's state
    and the test's token, TLS and auth files, which a mount root may not hold."""
    root = tmp_path / "storage"
    root.mkdir(exist_ok=True)
    return root


LANE = "TUNEPLANE_TEST_LANE"
"""CI runs the engine tests in two processes at once (.ci/run): ``shared``, the tests on
the two engines most tests share (docker-tests, podman-tests), and ``own``, those marked
``own_engines``, whose engines no test of the other lane uses (throwaway ones, and the
suite's single-purpose engines: docker-own, docker-full). Unset: every test, one at a
time (the README's test command). An engine of the other lane asked for fails the test:
it would meet that lane's jobs there, their cards and containers."""


def lane_engine(address: str, lane: str) -> str:
    """``address``, an engine of ``lane``'s tests; the test fails in the other lane."""
    running = os.environ.get(LANE)
    if running and running != lane:
        pytest.fail(
            f"{address} is an engine of the {lane!r} lane's tests, and this run is the "
            f"{running!r} lane's ({LANE}): mark the test own_engines, or not, to match"
        )
    return address


def docker_host() -> str:
    """The engine tests' Docker engine: the suite's own, never the developer's."""
    return lane_engine(suite_docker(), "shared")


def suite_docker() -> str:
    return os.environ.get("TUNEPLANE_TEST_DOCKER_HOST") or f"unix://{TESTS_DOCKER_SOCK}"


def own_docker_host() -> str:
    return lane_engine(suite_own_docker(), "own")


def suite_own_docker() -> str:
    return os.environ.get("TUNEPLANE_TEST_OWN_DOCKER_HOST") or f"unix://{OWN_DOCKER_SOCK}"


def full_docker_host() -> str:
    return lane_engine(f"unix://{FULL_DOCKER_SOCK}", "own")


class Namespaces:
    """A network namespace of an engine's own (loopback up) and a second one, "the outside
    world", joined by a veth pair: an engine run there gets its bridges and firewall rules
    without touching the machine's own interfaces and rules. The engine's default route
    goes to the outside one, as a cloud machine's to its gateway, and the outside one
    holds a cloud's addresses too: its metadata service (`METADATA`), a machine of the
    LAN (`LAN`) and another there the operator lets jobs reach (`MIRROR`). `listen`
    serves `OUTSIDE` on `OUTSIDE_PORT`, every address of the engine's namespace on
    `HOST_PORT`, and every address of the outside one on `CLOUD_PORTS` (each answer is
    the address reached); ``pids`` records the listeners, for a `close` by a later
    process."""

    OUTSIDE = "198.51.100.2"  # TEST-NET-2: the outside namespace's end of the veth pair
    ENGINE_SIDE = "198.51.100.1"
    OUTSIDE_PORT = 8000
    HOST_PORT = 8001
    METADATA = "169.254.169.254"
    LAN, MIRROR = "203.0.113.10", "203.0.113.20"  # TEST-NET-3: this machine's LAN, say
    CLOUD_PORTS = (80, 53)  # the metadata service's HTTP, a name server's TCP

    def __init__(self, name: str, pids: Path) -> None:
        self.namespace = f"tp-{name}"  # `ip netns` names, made and deleted here
        self.outside = f"{self.namespace}-out"
        self.pids = pids
        self.listeners: list[subprocess.Popen[bytes]] = []

    def enter(self) -> list[str]:
        """The prefix of a command run in the engine's namespace."""
        return ["nsenter", f"--net=/run/netns/{self.namespace}"]

    def make(self) -> None:
        """Both namespaces and their veth pair; kept across a restart of the engine."""
        if Path(f"/run/netns/{self.namespace}").exists():
            return
        veth = f"vt{uuid.uuid4().hex[:8]}"
        for command in (
            ["ip", "netns", "add", self.namespace],
            ["ip", "netns", "add", self.outside],
            ["ip", "-n", self.namespace, "link", "set", "lo", "up"],
            ["ip", "-n", self.outside, "link", "set", "lo", "up"],
            ["ip", "-n", self.namespace, "link", "add", veth, "type", "veth", "peer", "name",
             f"{veth}o", "netns", self.outside],
            ["ip", "-n", self.namespace, "addr", "add", f"{self.ENGINE_SIDE}/30", "dev", veth],
            ["ip", "-n", self.outside, "addr", "add", f"{self.OUTSIDE}/30", "dev", f"{veth}o"],
            ["ip", "-n", self.namespace, "link", "set", veth, "up"],
            ["ip", "-n", self.outside, "link", "set", f"{veth}o", "up"],
            ["ip", "-n", self.namespace, "route", "add", "default", "via", self.OUTSIDE],
            *(["ip", "-n", self.outside, "addr", "add", f"{cloud}/32", "dev", "lo"]
              for cloud in (self.METADATA, self.LAN, self.MIRROR)),
        ):  # fmt: skip
            subprocess.run(command, check=True, capture_output=True)

    def listen(self) -> None:
        """TCP servers that say where they are: one in the outside namespace (``outside``,
        on `OUTSIDE`), one on every address of the engine's own namespace, the machine its
        jobs run on (``host``, on `HOST_PORT`: a port the node's API on 0.0.0.0 stands for)."""
        self.listeners = [
            self._listen(self.outside, self.OUTSIDE, self.OUTSIDE_PORT, "outside"),
            self._listen(self.namespace, "0.0.0.0", self.HOST_PORT, "host"),
            *(self._listen(self.outside, "0.0.0.0", port, None) for port in self.CLOUD_PORTS),
        ]
        self.pids.write_text("\n".join(str(listener.pid) for listener in self.listeners))

    @staticmethod
    def _listen(
        namespace: str, address: str, port: int, word: str | None
    ) -> subprocess.Popen[bytes]:
        """A server answering ``word`` (None: the address it was reached at) and closing."""
        answer = "c.getsockname()[0].encode()" if word is None else repr(word.encode())
        server = (
            "import socket\n"
            "s = socket.socket()\n"
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(({address!r}, {port}))\n"
            "s.listen()\n"
            "print('listening', flush=True)\n"
            "while True:\n"
            "    c, _ = s.accept()\n"
            f"    c.sendall({answer} + b'\\n')\n"
            "    c.close()\n"
        )
        listener = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{namespace}", sys.executable, "-c", server],
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert listener.stdout is not None
        assert listener.stdout.readline() == b"listening\n"
        return listener

    def rules(self) -> str:
        """``iptables -S`` (the filter table) in the engine's namespace."""
        listed = subprocess.run(
            [*self.enter(), "iptables", "-w", "5", "-S"],
            check=True,
            capture_output=True,
            text=True,
        )
        return listed.stdout

    def close(self) -> None:
        """The listeners (ours, or a killed suite's from ``pids``) and both namespaces
        (their veth pair goes with them)."""
        with contextlib.suppress(OSError, ValueError):
            for pid in self.pids.read_text().split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
        for listener in self.listeners:
            listener.wait()  # killed above: reaped
        for namespace in (self.namespace, self.outside):
            if Path(f"/run/netns/{namespace}").exists():
                subprocess.run(["ip", "netns", "del", namespace], check=False)


class ThrowawayDocker:
    """A Docker engine of one test's own, for the tests that restart or freeze their
    engine: started with the flags of `engines.sh`'s engines on a socket, data root and
    exec root of its own (the test image loaded from the suite's engine), and
    removed with everything on it when the test ends. A restart or a SIGSTOP cannot
    leave an engine another test uses in a state it did not expect (the suite's own
    engine once wedged after them, and every later container start hung).

    ``netns=True``: an engine with what the development engines lack, its default bridge
    and its firewall rules, run in a network namespace of its own (the machine's own
    interfaces and rules are never touched), wired by a veth pair to a second namespace,
    "the outside world", where `OUTSIDE` answers on `OUTSIDE_PORT` (`listen_outside`)."""

    OUTSIDE, OUTSIDE_PORT, HOST_PORT = (
        Namespaces.OUTSIDE,
        Namespaces.OUTSIDE_PORT,
        Namespaces.HOST_PORT,
    )

    def __init__(self, name: str | None = None, *, netns: bool = False) -> None:
        self.name = name or f"throwaway-{uuid.uuid4().hex[:8]}"
        self.netns = netns
        self.data_root = DEV_ROOT / self.name
        self.exec_root = RUN_DIR / f"{self.name}-exec"
        self.net = Namespaces(self.name, self.exec_root / "listener")
        self.namespace = self.net.namespace
        self.socket = RUN_DIR / f"{self.name}.sock"
        self.log = DEV_ROOT / "log" / f"{self.name}.log"
        self.pid_file = self.exec_root / "dockerd.pid"
        self.owner = self.exec_root / "owner"  # the pid of the test process it serves
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def pid(self) -> int:
        return self.process.pid if self.process is not None else int(self.pid_file.read_text())

    @classmethod
    def clear_stale(cls) -> None:
        """Remove the throwaway engines whose test process is gone (a suite killed before
        its clean-up): never one another running suite holds."""
        for owner in RUN_DIR.glob("throwaway-*-exec/owner"):
            if not _alive(int(owner.read_text() or 0)):
                cls(owner.parent.name.removesuffix("-exec")).close()

    def start(self, *, live_restore: bool = True) -> None:
        """Start the engine and return once it answers (a minute at most)."""
        for path in (self.data_root, self.exec_root, self.log.parent):
            path.mkdir(parents=True, exist_ok=True)
        self.owner.write_text(str(os.getpid()))
        flags = ["--iptables=false", "--ip6tables=false", "--bridge=none"]
        prefix: list[str] = []
        if self.netns:  # the bridge and the firewall rules, in a namespace of its own
            self.net.make()
            flags, prefix = [], self.net.enter()
        flags += ["--live-restore"] if live_restore else []
        flags += ["--data-root", str(self.data_root), "--exec-root", str(self.exec_root)]
        flags += ["--pidfile", str(self.pid_file), "-H", self.host]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [*prefix, "dockerd", *flags],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C of the suite is not the engine's
            )
        deadline = time.monotonic() + 60
        while not self._answers():
            assert self.process.poll() is None, f"dockerd exited: see {self.log}"
            assert time.monotonic() < deadline, f"dockerd never answered: see {self.log}"
            time.sleep(0.1)

    def listen_outside(self) -> None:
        self.net.listen()

    def _answers(self) -> bool:
        return self.docker("version", check=False).returncode == 0

    def _running(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        with contextlib.suppress(OSError, ValueError):
            return _alive(self.pid)
        return False

    def docker(
        self, *args: str, check: bool = True, **options: Any
    ) -> subprocess.CompletedProcess[bytes]:
        """The docker command line on this engine; a failure raised with what docker said
        (a bare exit status 1 says nothing)."""
        done = subprocess.run(["docker", "-H", self.host, *args], capture_output=True, **options)
        if check and done.returncode:
            said = done.stderr.decode(errors="replace").strip()
            raise AssertionError(f"docker {' '.join(args)}: exit {done.returncode}: {said}")
        return done

    def load_test_image(self) -> None:
        """The test image, from the suite's engine (as `engines.sh` fills its own): a
        read, the one thing a test with engines of its own takes from a shared one."""
        saved = subprocess.run(
            ["docker", "-H", suite_docker(), "save", IMAGE],
            check=True,
            capture_output=True,
        ).stdout
        self.docker("load", "-q", input=saved)

    def stop(self) -> None:
        """SIGTERM, and wait until dockerd is gone (SIGKILL after a minute); thawed first."""
        if not self._running():
            return
        pid = self.pid
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while self._running():
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
            if self.process is not None:
                self.process.poll()  # reaped: a child of ours
        self.process = None

    def restart(self, *, live_restore: bool = True) -> None:
        self.stop()
        self.start(live_restore=live_restore)

    def close(self) -> None:
        """Every container removed, the engine stopped, its roots deleted."""
        if self._running():
            os.kill(self.pid, signal.SIGCONT)
            listed = self.docker("ps", "-aq", check=False).stdout.split()
            if listed:
                self.docker("rm", "-f", *(entry.decode() for entry in listed), check=False)
            # Its networks' bridges are the host's devices where it runs in the host's
            # namespace: a stopped dockerd leaves them, and each took one of the address
            # pools every engine of the machine draws from, until none was left.
            self.docker("network", "prune", "-f", check=False)
        self.stop()
        containerd = self.exec_root / "containerd" / "containerd.pid"
        with contextlib.suppress(OSError, ValueError):  # a killed dockerd leaves its own
            os.kill(int(containerd.read_text()), signal.SIGKILL)
        self.net.close()  # before the exec root, which records the listeners
        _remove_roots(self.exec_root, self.data_root)


class ThrowawayPodman:
    """A podman service of its own in a network namespace of its own (`Namespaces`), for
    the tests of podman's job networks and the rules the node keeps for them: the
    development services run in the machine's namespace, whose firewall no test touches.
    Its own store, run root, network configuration and containers.conf (file locks, as
    `engines.sh`'s own services), the test image loaded from the suite's service; removed
    with everything on it."""

    def __init__(self, name: str | None = None, *, beside: ThrowawayDocker | None = None) -> None:
        """``beside``: in that engine's namespaces (which it keeps and removes), as two
        engines of one machine share its network namespace."""
        self.name = name or f"throwpod-{uuid.uuid4().hex[:8]}"
        self.root = DEV_ROOT / self.name
        self.run_root = RUN_DIR / f"{self.name}-run"
        self.socket = self.run_root / "podman.sock"
        self.owns_net = beside is None
        self.net = (
            Namespaces(self.name, self.run_root / "listener") if beside is None else beside.net
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @classmethod
    def clear_stale(cls) -> None:
        """Remove the services whose test process is gone (a suite killed before its
        clean-up): never one another running suite holds."""
        for owner in RUN_DIR.glob("throwpod-*-run/owner"):
            if not _alive(int(owner.read_text() or 0)):
                cls(owner.parent.name.removesuffix("-run")).close()

    def start(self) -> None:
        """Start the service and return once it answers (a minute at most)."""
        for path in (self.root / "networks", self.run_root):
            path.mkdir(parents=True, exist_ok=True)
        (self.run_root / "owner").write_text(str(os.getpid()))
        self.net.make()
        command = [
            *self.net.enter(), "podman", "--root", str(self.root / "storage"),
            "--runroot", str(self.run_root / "storage"),
            "system", "service", "--time=0", self.host,
        ]  # fmt: skip
        with (self.root / "podman.log").open("ab") as log:
            self.process = subprocess.Popen(
                command,
                env={**os.environ, "CONTAINERS_CONF": str(self._write_conf())},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # a Ctrl-C of the suite is not the service's
            )
        (self.run_root / "podman.pid").write_text(str(self.process.pid))  # for `close`
        deadline = time.monotonic() + 60
        while self.podman("version", check=False).returncode != 0:
            assert self.process.poll() is None, f"podman exited: see {self.root}/podman.log"
            assert time.monotonic() < deadline, "podman never answered"
            time.sleep(0.1)

    def _write_conf(self) -> Path:
        """The machine's containers.conf, with locks, run files and networks of its own."""
        base = Path(os.environ.get("CONTAINERS_CONF", "/etc/containers/containers.conf"))
        text = base.read_text() if base.exists() else "[engine]\n"
        own = (
            f'[engine]\nlock_type = "file"\nstatic_dir = "{self.root}/libpod"\n'
            f'tmp_dir = "{self.run_root}/libpod"'
        )
        network = f'\n[network]\nnetwork_config_dir = "{self.root}/networks"\n'
        conf = self.root / "containers.conf"
        conf.write_text(text.replace("[engine]", own, 1) + network)
        return conf

    def podman(
        self, *args: str, check: bool = True, **options: Any
    ) -> subprocess.CompletedProcess[bytes]:
        """The podman command line, as a client of this service; a failure raised with
        what podman said (a bare exit status 125 says nothing)."""
        done = subprocess.run(
            ["podman", "--remote", "--url", self.host, *args], capture_output=True, **options
        )
        if check and done.returncode:
            said = done.stderr.decode(errors="replace").strip()
            raise AssertionError(f"podman {' '.join(args)}: exit {done.returncode}: {said}")
        return done

    def load_test_image(self) -> None:
        """The test image, from the suite's podman service (a read, as docker's)."""
        saved = self.root / "image.tar"
        suite = ["podman", "--remote", "--url", suite_podman()]
        subprocess.run([*suite, "save", "-o", str(saved), f"docker.io/{IMAGE}"], check=True)
        self.podman("load", "-q", "-i", str(saved))
        saved.unlink()

    def rules(self) -> str:
        """``iptables -S`` (the filter table) in the service's namespace."""
        return self.net.rules()

    def remove_by_hand(self, name: str) -> None:
        """``podman rm -f`` of a running container, again until it is gone: podman 4.3's
        first try fails now and then ("removing container ... root filesystem", exit 125,
        seen in CI) while the container's processes are still being torn down."""
        deadline = time.monotonic() + 30
        while self.podman("container", "exists", name, check=False).returncode == 0:
            tried = self.podman("rm", "-f", "-t", "0", name, check=False)
            assert time.monotonic() < deadline, tried.stderr.decode(errors="replace")
            if tried.returncode:
                time.sleep(0.2)

    def _stop(self) -> None:
        """SIGTERM, SIGKILL after half a minute: ours, or a killed suite's by its pid."""
        try:
            pid = int((self.run_root / "podman.pid").read_text())
        except (OSError, ValueError):
            return
        if self._running(pid):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while self._running(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._running(pid):
            os.kill(pid, signal.SIGKILL)
        if self.process is not None:
            self.process.wait()

    def _running(self, pid: int) -> bool:
        if self.process is not None:
            return self.process.poll() is None  # reaped once it ends: a child of ours
        return _alive(pid)

    def close(self) -> None:
        """Every container and network removed, the service stopped, its namespaces, its
        roots and the address leases of its networks (``/var/lib/cni/networks``, the
        machine's: CNI's host-local keeps them there) deleted."""
        made = self._leased_networks()
        if self.socket.exists():
            self.podman("rm", "-af", "-t", "0", check=False)
            self.podman("network", "prune", "-f", check=False)
        self._stop()
        for name in made:
            shutil.rmtree(Path("/var/lib/cni/networks") / name, ignore_errors=True)
        if self.owns_net:
            self.net.close()
        _remove_roots(self.run_root, self.root)

    def _leased_networks(self) -> set[str]:
        """The networks of its own that leased an address: each job's (its events name the
        jobs) and those still configured. Never the default network's, whose leases the
        machine's podman shares."""
        made = {conflist.stem for conflist in (self.root / "networks").glob("*.conflist")}
        with contextlib.suppress(OSError):
            for line in (
                (self.run_root / "libpod" / "events" / "events.log").read_text().splitlines()
            ):
                with contextlib.suppress(ValueError):
                    made.add(own_network(str(json.loads(line).get("Name"))))
        return made


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _remove_roots(*roots: Path) -> None:
    """An engine's directories, what is mounted under them first."""
    for root in roots:
        for mount in reversed(_mounts_under(root)):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def _mounts_under(root: Path) -> list[str]:
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    return [point for point in points if point.startswith(f"{root}/") or point == str(root)]


def swept(host: str | None) -> bool:
    """Whether a node on this engine may sweep its wreckage: the suite's own engines
    only (its own, and throwaway ones), never one that holds other people's nodes."""
    throwaway = f"unix://{RUN_DIR}/throwaway-"
    return host is not None and (host.startswith(throwaway) or host == suite_own_docker())


def podman_url() -> str:
    """The engine tests' podman service: its own store and socket, never the developer's."""
    return lane_engine(suite_podman(), "shared")


def suite_podman() -> str:
    return os.environ.get("TUNEPLANE_TEST_PODMAN_URL") or f"unix://{TESTS_PODMAN_SOCK}"


def interruptible() -> None:
    """A child's ``preexec_fn``: Ctrl-C (SIGINT) ends it, as on a terminal. A suite started
    in the background (``cmd &`` in a script, as a CI runner may) ignores SIGINT, and
    an ignored signal stays ignored across exec: a child sent SIGINT would never hear it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def engine_missing(what: str, why: str) -> None:
    """Fail under CI (a missing engine is a broken build), skip visibly elsewhere."""
    message = f"{what} not reachable ({why}); run `sudo contrib/dev/engines.sh` first"
    if under_ci():
        pytest.fail(message)
    pytest.skip(message)


def node_cache(node: Console) -> CachedRuntime:
    """The state cache a daemon on an engine sits on (`make_node`'s, as in production)."""
    runtime = node.app[NODE].runtime
    assert isinstance(runtime, CachedRuntime), runtime
    return runtime


def fake_node_of(
    runtime: ContainerRuntime,
    settings: NodeSettings,
    *,
    probe: GpuProbe | None = None,
    allocator: GpuAllocator | None = None,
    clock: Clock = SYSTEM_CLOCK,
    port_held: bool = False,
) -> Node:
    """The node's services over a test's runtime and cards, made as production makes
    them (`build_node`); the test starts and closes it."""
    if allocator is None:
        allocator = GpuAllocator(runtime, settings, probe=probe)
    return build_node(
        settings, runtime=runtime, allocator=allocator, clock=clock, port_held=port_held
    )


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# The node's own files for engine tests (podman's seccomp profile): never the real home.
ENGINE_STATE_DIR = Path(tempfile.gettempdir()) / "tuneplane-tests-state"


def engine_settings(engine: str, **overrides: object) -> NodeSettings:
    base: dict[str, object] = {
        "local_runtime": engine,
        "node_state_dir": ENGINE_STATE_DIR,
        "local_api_timeout": 30,
        "runtime_threads": 8,
        # The development engines run --bridge=none --iptables=false: docker's isolation
        # would hold nothing there. The network tests ask for theirs (test_daemon_jobnet).
        "job_network": "bridge",
        # They run in the machine's network namespace, whose firewall no test touches: a
        # host-network job's egress rule would land in its OUTPUT chain. The egress tests
        # ask for it, on engines in namespaces of their own (test_daemon_egress).
        "job_egress_rule": False,
    }
    base.update(overrides)
    # The suite's engines where the test names none; the one the node uses is asked
    # for as the lane's (`lane_engine`; the other is never called).
    if "docker_host" not in base:
        base["docker_host"] = docker_host() if engine == "docker" else suite_docker()
    if "podman_url" not in base:
        base["podman_url"] = podman_url() if engine == "podman" else suite_podman()
    return NodeSettings(**base)  # type: ignore[arg-type]


def job(command: list[str], *, image: str = IMAGE, **fields: Any) -> ContainerSpec:
    """A job container of the node (run-id label) with a unique name."""
    run_id = unique("rt")
    labels = {LABEL_RUN_ID: run_id, **fields.pop("labels", {})}
    return ContainerSpec(
        name=container_name(run_id), image=image, command=tuple(command), labels=labels, **fields
    )


# --- runtimes that clean up only what the test made --------------------------------------


class TrackingRuntime:
    """Wraps a runtime and force-removes, at the end, every container a test made through it."""

    def __init__(self, runtime: ContainerRuntime, made: list[str] | None = None) -> None:
        self.inner = runtime
        self.made: list[str] = [] if made is None else made

    def __getattr__(self, item: str) -> Any:
        return getattr(self.inner, item)

    async def run(self, spec: ContainerSpec) -> str:
        self.made.append(spec.name)
        return await self.inner.run(spec)

    def track(self, name: str) -> None:
        """A container the test made some other way (the SDK, the API)."""
        self.made.append(name)

    async def cleanup(self) -> None:
        for name in self.made:
            await self.inner.remove(name)


async def forget_image(runtime: ContainerRuntime, image: str) -> None:
    """Make sure the engine does not have the image's layers, so a pull really downloads.

    The image goes under every name it has on the engine, however pulled (the registry's,
    a proxy's): the test images' names (``*/tuneplane-test/...``) are the suite's own.
    Other images are never touched.
    """
    inner = runtime.inner if isinstance(runtime, TrackingRuntime) else runtime
    repository = image.split("/", 1)[1].rsplit(":", 1)[0]  # tuneplane-test/big
    if isinstance(inner, DockerRuntime):
        api = inner.api
        listed = await inner.pool.call(api.images, filters={"reference": f"*/{repository}"})
        for entry in listed:
            await inner.pool.call(_quietly, api.remove_image, entry["Id"], force=True)
    else:
        assert isinstance(inner, PodmanRuntime), inner
        images = await inner.pool.call(inner.client.images.list)
        for entry in images:
            if any(tag.split("/", 1)[-1].startswith(f"{repository}:") for tag in entry.tags):
                await inner.pool.call(_quietly, inner.client.images.remove, entry.id, force=True)


def _quietly(remove: Callable[..., object], ref: str, **options: Any) -> None:
    with contextlib.suppress(Exception):  # gone already
        remove(ref, **options)


async def log_text(runtime: ContainerRuntime, ref: str, tail: int = 100) -> str:
    """A container's last lines as text; "" when it is missing."""
    text = await runtime.logs(ref, LogQuery(tail=tail, max_bytes=8 * 2**20))
    return "" if text is None else text.text


async def wait_status(
    runtime: ContainerRuntime, name: str, wanted: str, timeout: float = 20, poll: float = 0.1
) -> ContainerState:
    """The container's state once it reads ``wanted``, or as it is when time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        state = await runtime.inspect(name)
        if state.status == wanted or time.monotonic() > deadline:
            return state
        await asyncio.sleep(poll)


async def wait_until(predicate: Callable[[], object], timeout: float = 30) -> None:
    """Poll until ``predicate()`` is true; fail the test when it never becomes so."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never became true"
        await asyncio.sleep(0.02)


async def settle(rounds: int = 50) -> None:
    """Let every task that can run without waiting on I/O run (no wall-clock sleep)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


# --- the node's promises, checked against the engine's truth -------------------------------

ENGINE_LIVE = frozenset({"running", "created", "restarting", "paused"})  # holds its cards


async def check_promises(
    node: Node,
    truth: Mapping[str, tuple[str, tuple[int, ...]]],
    *,
    cards: int,
    wrecks_allowed: Collection[str] = (),
) -> None:
    """The six promises of `test_jobs_model.py`. ``truth``: every container of the node
    on the engine, by name, as (its status, the cards on its label); ``wrecks_allowed``:
    created, never-started containers no sweep was due to take yet."""
    live = {name: held for name, (status, held) in truth.items() if status in ENGINE_LIVE}
    labelled = [card for held in live.values() for card in held]
    assert len(labelled) == len(set(labelled)), f"a card on two jobs: {live}"
    occupancy = await node.allocator.occupancy()
    assert set(occupancy.by_job) == set(labelled), (dict(occupancy.by_job), labelled)
    pending = {r.ref: r for r in node.pending.records() if r.phase != FAILED}
    claimed = {ref for ref, claim in occupancy.claims.items() if claim}
    wanted = {ref for ref, r in pending.items() if r.request.requested_gpus}
    assert claimed == wanted, (claimed, wanted)
    # Every card is in exactly one place: available, held, reserved, or kept back
    # (unhealthy, or used outside the node) while nobody holds or claims it.
    held, reserved, available = set(labelled), set(occupancy.reserved), set(occupancy.available)
    kept = (set(occupancy.unhealthy) | set(occupancy.external)) - held - reserved
    places = [available, held, reserved, kept]
    assert sum(map(len, places)) == cards and set().union(*places) == set(range(cards)), places
    assert not set(pending) & set(truth), "a ref both pending and a container"
    wrecks = {n for n, (status, _) in truth.items() if status == "created" and n not in pending}
    stray = wrecks - set(wrecks_allowed)
    assert not stray, f"created, never started, no launch making them: {stray}"
    views = await node.jobs.observe([*truth, *pending])
    for ref, view in views.items():
        assert view.exists, f"{ref} exists, observe says not"
        assert isinstance(view, PendingView) == (ref in pending)


# --- the daemon as a process of its own ------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def python_path() -> str:
    """This checkout first, then whatever PYTHONPATH brought (a machine whose packages
    come that way, not from a venv's site-packages)."""
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def spawn_daemon(
    tmp_path: Path,
    port: int,
    *,
    preexec: Callable[[], None] | None = None,
    settings_of: Mapping[str, str] | None = None,
    **settings: str,
) -> subprocess.Popen[bytes]:
    """`python -m tuneplane_node serve` on loopback, its output in ``serve.log``; only
    the given settings (``settings_of`` and keywords; a state dir and storage root under
    ``tmp_path``) apply. ``TUNEPLANE_DEV_SHARED_ENGINE`` is on unless given: the
    suite's engines hold the daemons of every test at once."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "PYTHONPATH": python_path(),
        "TUNEPLANE_NODE_TOKEN": TOKEN,
        "TUNEPLANE_NODE_STATE_DIR": str(state_dir(tmp_path)),
        "TUNEPLANE_STORAGE_ROOT": str(storage_root(tmp_path)),
        "TUNEPLANE_DEV_SHARED_ENGINE": "true",
        **(settings_of or {}),
        **settings,
    }
    if env.get("TUNEPLANE_LOCAL_RUNTIME") == "podman":
        # The suite's podman runs in the machine's own network namespace, whose firewall
        # the job networks' guard would write to (docker's run --iptables=false): its
        # jobs are bridged, as engine_settings has it. The network tests' throwaway
        # engines, in namespaces of their own, keep the node's default.
        env.setdefault("TUNEPLANE_JOB_NETWORK", "bridge")
    argv = [sys.executable, "-m", "tuneplane_node", "serve", "--host", "127.0.0.1"]
    with (tmp_path / "serve.log").open("a") as output:
        return subprocess.Popen(
            [*argv, "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            preexec_fn=preexec,
        )


# --- a console over a real socket --------------------------------------------------------

INVENTORY_KEYS = [
    "accelerator_series",
    "accelerator_name",
    "accelerator_count",
    "driver",
    "runtime",
    "storage_root_visible",
    "disk_free_bytes",
    "cpu_count",
    "memory_bytes",
    "node_id",
    "hostname",
    "agent_version",
    "cuda_version",
    "gpus",
    "storage",
    "local_disk",
    "fabrics",
    "node_state",  # added after every field of 0.3.15
    "cpu_affinity",
    "image_store",  # issue 21
    "conditions",  # issue 34
    "job_disk",
    "protocols",
    "features",
    "isolation",  # issue 37
    "volume_store",  # issue 39
    "gpus_draining",  # issue 53
]


def console_0315(run_id: str, requested: int = 2, **container: Any) -> dict[str, Any]:
    """A 0.3.15 console's launch: every field of its ContainerSpec, "" where it has none."""
    spec = {
        "name": "",
        "image": "registry/trainer:1",
        "command": ["python", "-m", "train"],
        "env": {},
        "gpus": [],
        "mounts": [],
        "labels": {},
        "workdir": "",
        "shm_size": "",
        "cpu_limit": "",
        "memory_limit": "",
        "network": "",
        "user": "",
    }
    return {"run_id": run_id, "requested_gpus": requested, "container": {**spec, **container}}


class ServedAsServe(TestServer):
    """aiohttp's test server without its handler cancellation, which `serve`'s runner
    does not have: what the node does about a client that went away is tested as it
    runs (aiohttp's test server cancels such a handler itself)."""

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        return web.AppRunner(self.app, **{**kwargs, "handler_cancellation": False})


TOKEN = "test-token-0123456789"
HEADERS = {"Authorization": f"Bearer {TOKEN}", PROTOCOL_HEADER: str(PROTOCOL)}


class Console:
    """A console stand-in: speaks the node's wire protocol over a real socket."""

    def __init__(
        self,
        client: TestClient[web.Request, web.Application],
        made: list[str] | None = None,
        *,
        settle: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.client = client
        self.app = client.app
        self.made = made  # names launched through it, for the fixture's clean-up
        # Awaited before each request: over the fake engine, until the node has taken
        # every event of what the test did to the engine (an engine's events take a
        # moment; the node must not be asked in between, or the test is a race).
        self.settle = settle

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        if self.settle is not None:
            await self.settle()
        kwargs.setdefault("headers", HEADERS)
        async with self.client.request(method, path, **kwargs) as response:
            return response.status, await response.json()

    async def ok(self, method: str, path: str, **kwargs: Any) -> Any:
        status, body = await self.call(method, path, **kwargs)
        assert status == 200, (status, body)
        return body

    async def launch(
        self,
        command: list[str] | None = None,
        *,
        gpus: int = 0,
        image: str = IMAGE,
        run_id: str | None = None,
        expect: int = 200,
        **container: Any,
    ) -> tuple[str, Any]:
        run_id = run_id or unique("job")
        name = container.pop("name", container_name(run_id))
        body = {
            "run_id": run_id,
            "requested_gpus": gpus,
            "container": {
                "name": name,
                "image": image,
                "command": command or ["/bin/sleep", "300"],
                **container,
            },
        }
        if self.made is not None:
            self.made.append(name)
        status, answer = await self.call("POST", "/node/v1/launch", json=body)
        assert status == expect, (status, answer)
        return name, answer

    async def observe(self, *refs: str) -> dict[str, Any]:
        body = await self.ok("POST", "/node/v1/observe", json={"refs": list(refs)})
        return body["states"]  # type: ignore[no-any-return]

    async def state(self, ref: str) -> dict[str, Any]:
        return (await self.observe(ref))[ref]  # type: ignore[no-any-return]

    async def jobs(self) -> Any:
        """``GET /node/v1/jobs``: every job, and the index to watch from."""
        return await self.ok("GET", "/node/v1/jobs")

    async def watch(self, index: str, wait: float | None = None) -> Any:
        """One blocking query from ``index`` (``wait``: the node's default when None)."""
        params = {"index": index, **({} if wait is None else {"wait": f"{wait:g}"})}
        return await self.ok("GET", "/node/v1/jobs", params=params)

    async def failed(self, ref: str) -> Any:
        """The state of a launch once it failed; its cards are all free again (4 of 4)."""
        state = await self.wait_for(ref, "status", "dead")
        assert state["pending_phase"] == "failed"
        health = await self.answered_health()  # a loaded engine's silence: cards unknown
        assert (health["gpus_reserved"], health["gpus_free"]) == (0, 4)  # released
        return state

    async def wait_for(self, ref: str, key: str, wanted: Any, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            state = await self.state(ref)
            if state.get(key) == wanted:
                return state
            assert time.monotonic() < deadline, f"{ref}: {key} never became {wanted}: {state}"
            await asyncio.sleep(0.05)

    async def stopping(self, refs: list[str], timeout: float = 30) -> dict[str, Any]:
        """The states of ``refs`` once each shows a stop under way (its first signal sent),
        asked in one observe at a time; fails the test after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            states = await self.observe(*refs)
            if all("stopping" in state for state in states.values()):
                return states
            waiting = [ref for ref, state in states.items() if "stopping" not in state]
            assert time.monotonic() < deadline, f"no stop under way for {waiting}"
            await asyncio.sleep(0.1)

    async def stop(self, ref: str, timeout: float | None = None, **fields: Any) -> Any:
        """A stop; ``fields``: its others (``signal``, ``warn_signal``, ``warn_s``)."""
        body: dict[str, Any] = {"ref": ref, **fields}
        if timeout is not None:
            body["timeout"] = timeout
        return await self.ok("POST", "/node/v1/stop", json=body)

    async def signal(self, ref: str, signal: object) -> tuple[int, Any]:
        """The signal verb's (status, answer)."""
        return await self.call("POST", "/node/v1/signal", json={"ref": ref, "signal": signal})

    async def remove(self, ref: str) -> Any:
        return await self.ok("POST", "/node/v1/remove", json={"ref": ref})

    async def health(self) -> Any:
        return await self.ok("GET", "/node/v1/health")

    async def answered_health(self, timeout: float = 30) -> Any:
        """Health once the engine has answered it. Health waits 1.5 s for the engine
        (its version, once per sync; an unanswered heartbeat) and else says it is silent,
        the cards unknown: on a loaded machine a test of what the cards are waits for
        the engine's word, as a console polls again."""
        deadline = time.monotonic() + timeout
        while not (health := await self.health())["ok"] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return health

    async def logs(self, ref: str, tail: int | None = None) -> str:
        params = {"ref": ref} if tail is None else {"ref": ref, "tail": str(tail)}
        return (await self.ok("GET", "/node/v1/logs", params=params))["logs"]  # type: ignore[no-any-return]

    async def follow(self, ref: str, *, tail: int | None = None, timeout: float = 60) -> str:
        """A followed log, read whole: the stream ends when the job does."""
        params = {"ref": ref, "follow": "1", **({"tail": str(tail)} if tail else {})}
        if self.settle is not None:
            await self.settle()
        async with self.client.get("/node/v1/logs", params=params, headers=HEADERS) as response:
            assert response.status == 200, (response.status, await response.text())
            assert response.headers["Content-Type"] == "text/plain; charset=utf-8"
            return await asyncio.wait_for(response.text(), timeout)


# --- a slow, stalled or wedged peer --------------------------------------------------------

PROXY_PORTS = range(5001, 5010)  # engines.sh marks these as insecure registries for podman


class _Relay:
    """Copies bytes between a client and an upstream; ``pause`` stops the flow back to the
    client (connections stay open and nothing answers), ``resume`` restarts it."""

    rate = 0  # bytes per second back to the client; 0 is unthrottled

    def __init__(self) -> None:
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.connections = 0
        self.open_connections = 0
        self.bytes_sent = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def pause(self) -> None:
        self.flowing.clear()

    def resume(self) -> None:
        self.flowing.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        raise NotImplementedError

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await self._upstream()
            await asyncio.gather(
                self._pump(reader, up_writer, back=False),
                self._pump(up_reader, writer, back=True),
            )
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self.open_connections -= 1
            self._tasks.discard(task)
            writer.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, back: bool
    ) -> None:
        throttle = back and self.rate > 0
        chunk_size = max(1024, self.rate // 20) if throttle else 65536
        try:
            while data := await reader.read(chunk_size):
                if back:
                    await self.flowing.wait()
                    self.bytes_sent += len(data)
                if throttle:
                    await asyncio.sleep(len(data) / self.rate)
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.close()


class ThrottlingProxy(_Relay):
    """A TCP proxy on loopback in front of the local registry, which sends registry bytes
    back at ``rate`` bytes per second and can stall outright (``pause``)."""

    def __init__(self, *, upstream_port: int = 5000, rate: int = 200_000) -> None:
        super().__init__()
        self.upstream_port = upstream_port
        self.rate = rate
        self.port = 0

    async def start(self) -> ThrottlingProxy:
        for port in PROXY_PORTS:
            with contextlib.suppress(OSError):
                self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
                self.port = port
                return self
        raise RuntimeError("no free proxy port in 5001-5009")

    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def big_image(self, runtime: ContainerRuntime, *, rate: int) -> str:
        """The registry's big image reached through this proxy at ``rate`` bytes a
        second, removed from ``runtime`` first so that a launch or a pull downloads it."""
        self.rate = rate
        image = f"{self.address()}/tuneplane-test/big:1"
        await forget_image(runtime, image)
        return image

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.upstream_port)


class WedgeProxy(_Relay):
    """A unix socket in front of an engine's; ``pause`` wedges the engine (connections are
    accepted and never answered)."""

    def __init__(self, path: Path, upstream: Path) -> None:
        super().__init__()
        self.path = path
        self.upstream = upstream

    async def start(self) -> WedgeProxy:
        self._server = await asyncio.start_unix_server(self._serve, str(self.path))
        return self

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_unix_connection(str(self.upstream))
