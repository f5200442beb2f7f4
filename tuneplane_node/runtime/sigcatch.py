"""Which signals a job's processes catch, read from ``/proc``.

A warning signal (SIGUSR1 before a stop) is a request to checkpoint: only a process
with a handler for it hears a request. To one without, the kernel's default action for
SIGUSR1, SIGUSR2, SIGHUP, SIGINT or SIGQUIT is to end it at once (exit 138 for
SIGUSR1): no stop signal, no grace, nothing saved. So before warning, the node reads
``SigCgt`` (the mask of caught signals) of each of the job's processes: its init's
descendants, or the command itself when it is PID 1 (no init). The init (tini,
catatonit) catches every signal to pass it on: it never counts.
"""

from __future__ import annotations

from pathlib import Path

from tuneplane_node.runtime.cgroups import PROC_ROOT

INITS = frozenset({"docker-init", "tini", "tini-static", "catatonit"})
"""The engines' init processes, by the name the kernel gives them (``comm``)."""


def caught(root: int, signal: int, *, proc: Path = PROC_ROOT) -> bool | None:
    """Whether a process of the job whose first process is ``root`` catches ``signal``;
    None when ``root`` cannot be read (gone, or not in this machine's pid namespace)."""
    comm = _read(proc / str(root) / "comm")
    if comm is None:
        return None
    pids = _descendants(root, proc)
    if comm.strip() not in INITS:
        pids.append(root)
    return any(_catches(pid, signal, proc) for pid in pids)


def _catches(pid: int, signal: int, proc: Path) -> bool:
    status = _read(proc / str(pid) / "status") or ""
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split(":", 1)[1].strip(), 16) >> (signal - 1) & 1)
    return False


def _descendants(root: int, proc: Path) -> list[int]:
    """Every process below ``root``, from each process's parent in ``/proc/<pid>/stat``."""
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read(entry / "stat")
        if stat is None:
            continue
        fields = stat.rpartition(")")[2].split()  # the name may hold spaces and ")"
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # gone meanwhile, or not ours to read
        return None
