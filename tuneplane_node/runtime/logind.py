"""Logind: systemd-logind on the system bus, as the node uses it: a *delay* inhibitor of
shutdown, and the ``PrepareForShutdown`` signal that says one has begun.

When the OS shuts down (a cloud's ACPI power-off of a preempted VM arrives this way),
logind tells every client ``PrepareForShutdown(true)`` and waits for the delay locks,
``InhibitDelayMaxSec`` at most (5 s by default): the node drains in that time, then lets
its lock go. jeepney's blocking connection (the one of its clients that passes a file
descriptor, which the lock is), so every call here blocks: the caller runs it in a
thread. The bus is the system's (``DBUS_SYSTEM_BUS_ADDRESS`` names another, as for every
D-Bus client). Its errors are `LogindUnavailable`, with the cause chained.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque

from jeepney import DBusAddress, DBusErrorResponse, MatchRule, Message, Properties, new_method_call
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import DBusConnection, open_dbus_connection
from jeepney.wrappers import unwrap_msg

LOGIN1 = DBusAddress(
    "/org/freedesktop/login1",
    bus_name="org.freedesktop.login1",
    interface="org.freedesktop.login1.Manager",
)
PREPARE = MatchRule(
    type="signal",
    sender="org.freedesktop.login1",
    interface="org.freedesktop.login1.Manager",
    member="PrepareForShutdown",
    path="/org/freedesktop/login1",
)
"""What the bus is asked to send: logind's own signal (the bus knows its owner)."""
HEARD = MatchRule(
    type="signal",
    interface="org.freedesktop.login1.Manager",
    member="PrepareForShutdown",
    path="/org/freedesktop/login1",
)
"""How this connection picks it out: a signal carries its sender's unique name, not
``org.freedesktop.login1``, and the bus delivers only what `PREPARE` lets through."""


class LogindUnavailable(Exception):
    """No system bus, no logind on it, or it refused: the OS's shutdown is not heard."""


class Logind:
    """One connection to logind; ``bus``: ``SYSTEM`` or a bus address."""

    def __init__(self, bus: str = "SYSTEM") -> None:
        self.bus = bus
        self._connection: DBusConnection | None = None
        self._signals: deque[Message] | None = None
        self._filter: contextlib.ExitStack | None = None

    def open(self) -> None:
        """Connect, with file descriptors, and hear ``PrepareForShutdown``."""
        try:
            connection = open_dbus_connection(self.bus, enable_fds=True)
            connection.send_and_get_reply(message_bus.AddMatch(PREPARE), timeout=5)
        except (OSError, ValueError, KeyError, DBusErrorResponse, TimeoutError) as exc:
            raise LogindUnavailable(f"the system bus does not answer: {exc}") from exc
        self._connection = connection
        self._filter = contextlib.ExitStack()
        self._signals = self._filter.enter_context(connection.filter(HEARD))

    def delay_max_s(self) -> float:
        """logind's ``InhibitDelayMaxSec``: the most a delay lock holds a shutdown."""
        reply = self._call(Properties(LOGIN1).get("InhibitDelayMaxUSec"))
        _, usec = reply.body[0]
        return float(usec) / 1e6

    def inhibit(self, why: str) -> int:
        """A delay lock on shutdown, held while the descriptor returned stays open."""
        message = new_method_call(
            LOGIN1, "Inhibit", "ssss", ("shutdown", "tuneplane-node", why, "delay")
        )
        reply = self._call(message)
        handle = reply.body[0]
        return handle.to_raw_fd() if hasattr(handle, "to_raw_fd") else int(handle)

    def prepared(self, timeout: float) -> bool | None:
        """``PrepareForShutdown``'s word when it comes within ``timeout`` seconds: True, a
        shutdown begins; False, it was cancelled; None, nothing came."""
        assert self._connection is not None and self._signals is not None
        try:
            signal = self._connection.recv_until_filtered(self._signals, timeout=timeout)
        except TimeoutError:
            return None
        except OSError as exc:
            raise LogindUnavailable(f"the system bus went away: {exc}") from exc
        return bool(signal.body[0])

    def _call(self, message: Message) -> Message:
        """The reply to ``message``; an error reply raised."""
        assert self._connection is not None
        try:
            reply = self._connection.send_and_get_reply(message, timeout=5)
            unwrap_msg(reply)  # an error reply: DBusErrorResponse
        except (OSError, DBusErrorResponse, TimeoutError) as exc:
            raise LogindUnavailable(f"logind refused: {exc}") from exc
        return reply

    def close(self) -> None:
        if self._filter is not None:
            self._filter.close()
        if self._connection is not None:
            self._connection.close()
        self._connection = None


def release(fd: int) -> None:
    """The delay lock let go: logind goes on with the shutdown."""
    with contextlib.suppress(OSError):
        os.close(fd)
