"""A fake systemd-logind on a private bus of the test's own (issue 54): a ``dbus-daemon``
with a configuration that lets anyone own any name, and a thread that owns
``org.freedesktop.login1`` and answers what the node asks of logind: the
``InhibitDelayMaxUSec`` property, and ``Inhibit`` (a pipe's read end, as logind's lock
is a descriptor whose closing releases it). The test sends ``PrepareForShutdown``
(`prepare`) and asks whether every lock is released (`released`).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

from jeepney import DBusAddress, MessageType, new_method_return, new_signal
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import DBusConnection, open_dbus_connection

CONFIG = """<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>session</type>
  <listen>unix:path={path}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow send_destination="*" eavesdrop="true"/>
    <allow eavesdrop="true"/>
    <allow own="*"/>
  </policy>
</busconfig>
"""
MANAGER = DBusAddress("/org/freedesktop/login1", interface="org.freedesktop.login1.Manager")


def has_dbus() -> bool:
    return shutil.which("dbus-daemon") is not None


class PrivateBus:
    """A dbus-daemon of the test's own, on a socket under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "bus"
        (directory / "bus.conf").write_text(CONFIG.format(path=self.path))
        self.process = subprocess.Popen(
            ["dbus-daemon", f"--config-file={directory / 'bus.conf'}", "--nofork"]
        )
        # Its socket exists once bound, a moment before it listens (a connect then is
        # refused): up once a connect succeeds. 10 s: a loaded machine's margin.
        deadline = time.monotonic() + 10
        while not self._listening():
            assert time.monotonic() < deadline and self.process.poll() is None, "no bus"
            time.sleep(0.02)
        self.address = f"unix:path={self.path}"

    def _listening(self) -> bool:
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(self.path))
            except OSError:  # not there yet, or not listening yet
                return False
        return True

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(10)


class FakeLogind:
    """logind as the node sees it; ``delay_s``: its InhibitDelayMaxSec."""

    def __init__(self, address: str, *, delay_s: float) -> None:
        self.delay_s = delay_s
        self.connection: DBusConnection = open_dbus_connection(address, enable_fds=True)
        reply = self.connection.send_and_get_reply(
            message_bus.RequestName("org.freedesktop.login1"), timeout=5
        )
        assert reply.body[0] == 1, reply.body  # the primary owner
        self.locks: list[int] = []  # the write ends of the locks handed out
        self.inhibited = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                message = self.connection.receive(timeout=0.1)
            except TimeoutError:
                continue
            except OSError:
                return
            if message.header.message_type == MessageType.method_call:
                self._answer(message)

    def _answer(self, message: object) -> None:
        member = message.header.fields.get(3)  # type: ignore[attr-defined]
        if member == "Get":
            reply = new_method_return(message, "v", (("t", int(self.delay_s * 1e6)),))
        elif member == "Inhibit":
            read, write = os.pipe()
            self.locks.append(write)
            reply = new_method_return(message, "h", (read,))
            self.connection.send(reply)
            os.close(read)  # the node holds the only reader now
            self.inhibited.set()
            return
        else:
            return
        self.connection.send(reply)

    def prepare(self, starting: bool) -> None:
        """``PrepareForShutdown(starting)``, to every client of the bus."""
        self.connection.send(new_signal(MANAGER, "PrepareForShutdown", "b", (starting,)))

    def released(self) -> bool:
        """Whether every lock handed out was let go (its reader closed)."""
        for write in self.locks:
            poller = select.poll()
            poller.register(write, select.POLLERR)
            if not poller.poll(0):
                return False
        return bool(self.locks)

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        for write in self.locks:
            with contextlib.suppress(OSError):
                os.close(write)
        self.connection.close()
