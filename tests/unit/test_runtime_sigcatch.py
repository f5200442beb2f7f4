"""Which signals a job's processes catch, from a ``/proc`` laid out by hand: the init
never counts, its descendants do, and a command that is PID 1 counts itself."""

from __future__ import annotations

import signal
from pathlib import Path

from tuneplane_node.runtime.sigcatch import caught

USR1 = int(signal.SIGUSR1)
TERM = int(signal.SIGTERM)


def process(proc: Path, pid: int, parent: int, name: str, *catches: int) -> None:
    mask = sum(1 << (number - 1) for number in catches)
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "comm").write_text(f"{name}\n")
    (proc / str(pid) / "stat").write_text(f"{pid} ({name} (x)) S {parent} {pid} {pid} 0\n")
    (proc / str(pid) / "status").write_text(f"Name:\t{name}\nSigCgt:\t{mask:016x}\n")


def test_a_handler_below_the_init_counts_and_the_inits_own_never(tmp_path: Path) -> None:
    process(tmp_path, 40, 1, "docker-init", USR1, TERM)  # tini catches all, to pass them on
    process(tmp_path, 41, 40, "sh", TERM)
    process(tmp_path, 42, 41, "python", USR1)
    process(tmp_path, 50, 1, "python", USR1)  # another container's, not below 40
    assert caught(40, USR1, proc=tmp_path) is True
    assert caught(40, int(signal.SIGUSR2), proc=tmp_path) is False
    (tmp_path / "42" / "status").write_text("Name:\tpython\nSigCgt:\t0000000000000000\n")
    assert caught(40, USR1, proc=tmp_path) is False


def test_a_command_that_is_pid_1_counts_itself(tmp_path: Path) -> None:
    process(tmp_path, 60, 1, "sh", USR1)  # TUNEPLANE_JOB_INIT=false: no init
    assert caught(60, USR1, proc=tmp_path) is True


def test_a_process_this_machine_cannot_read_is_unknown(tmp_path: Path) -> None:
    assert caught(70, USR1, proc=tmp_path) is None
