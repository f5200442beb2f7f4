"""The signals a console may have the node send a job: to stop it, to warn it first, or
to tell it something (checkpoint now) while it runs.

One list for the launch's ``stop_signal``, stop's ``signal`` and ``warn_signal`` and the
signal verb. SIGKILL and SIGSTOP are not in it: a job cannot catch either, so neither
warns or stops it gracefully (SIGKILL is what the node sends itself when the grace period
ends, and a stopped job would hold its cards forever). Numbers are Linux's.
"""

from __future__ import annotations

import signal

JOB_SIGNALS: dict[str, int] = {
    name: int(getattr(signal, name))
    for name in ("SIGINT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGWINCH")
}
DEFAULT_STOP_SIGNAL = "SIGTERM"
_BY_NUMBER = {number: name for name, number in JOB_SIGNALS.items()}


def job_signal(value: object) -> str | None:
    """The signal's name (``SIGUSR1``) for a name in any case, with or without ``SIG``,
    or its number (as an int or digits); None when it is not one of `JOB_SIGNALS`."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _BY_NUMBER.get(value)
    if not isinstance(value, str) or not 0 < len(value) <= 12:
        return None
    if value.isascii() and value.isdigit():
        return _BY_NUMBER.get(int(value))
    name = value.upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    return name if name in JOB_SIGNALS else None


def engine_stop_signal(value: object) -> str:
    """The stop signal an engine recorded for a container (docker: a name or nothing;
    libpod: a number), by name; nothing recorded is the engines' own default, SIGTERM.
    A signal outside the list (an image's STOPSIGNAL SIGRTMIN+3) keeps the engine's word."""
    if value in (None, "", 0):
        return DEFAULT_STOP_SIGNAL
    known = job_signal(value)
    if known is not None:
        return known
    if isinstance(value, int):
        try:
            return signal.Signals(value).name
        except ValueError:
            return str(value)
    return str(value)
