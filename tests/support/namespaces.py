"""Network namespaces of an engine's own, and "the outside world" beside them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path


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
