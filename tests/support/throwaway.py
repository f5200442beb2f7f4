"""Engines of one test's own: a Docker engine and a podman service, started for the test
and removed with everything on them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from tests.support.engines import DEV_ROOT, RUN_DIR, suite_docker, suite_podman
from tests.support.images import IMAGE
from tests.support.namespaces import Namespaces
from tuneplane_node.runtime.engines.networks.jobnetwork import own_network


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
