"""The process runtime's process groups: started, told from strangers, signalled, measured.

Each job, and each job's log stamper, leads a session of its own. A pid alone is no
proof a process is ours (pids are recycled), so a started process is recorded with its
/proc start time and the boot it started in. Kept apart from the job's files so that
/proc is read in one place.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuneplane_node.runtime.facts import Usage
from tuneplane_node.runtime.process.logs import STAMPER
from tuneplane_node.runtime.spec import ContainerSpec, format_gpus

JOB_DIR_ENV = "TUNEPLANE_JOB_DIR"
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HAS_PROC = Path("/proc/self/stat").exists()
_BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
KILL_GRACE_S = 5.0
"""How long a killed process may take to be gone (its group, or a stamper at EOF)."""

# Runs as `/bin/sh -c _WRAPPER tuneplane-wrapper <argv...>`: the argv is never parsed by
# a shell. `env` execs argv[0] from PATH, so a name like `exit` or `eval` is a program
# to find, not a shell builtin, as in a container. The job signals are caught (not ignored,
# which the job would inherit) so the wrapper outlives the job and records its code.
# `command -p` finds env and mv even when the job's PATH does not. The last line kills
# whatever the job left behind in its group, as a container's end does.
_WRAPPER = """\
d=$TUNEPLANE_JOB_DIR
unset TUNEPLANE_JOB_DIR
trap : TERM INT USR1 USR2 HUP QUIT WINCH
command -p env -- "$@"
rc=$?
printf '%s' "$rc" > "$d/rc.tmp" && command -p mv -f "$d/rc.tmp" "$d/rc"
kill -s KILL 0
"""


@dataclass(frozen=True)
class Proc:
    """A process we started, told from a stranger given its recycled pid.

    ``ticks`` is its start time (clock ticks since boot, /proc/<pid>/stat field 22) and
    ``boot`` the kernel's boot id, since ticks restart from zero at every boot.
    """

    pid: int
    ticks: int | None
    boot: str | None = None


class ProcessGroups:
    """The sessions this daemon started, their Popen kept: polling them reaps zombies."""

    def __init__(self) -> None:
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    def spawn(
        self,
        command: Sequence[str],
        *,
        log_file: Path,
        cwd: str | None,
        env: dict[str, str],
        cpus: tuple[int, ...] = (),
    ) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
        """Start the stamper, then the job writing into it: (stamper, job).

        ``env`` (job_environment) names the job's directory in JOB_DIR_ENV: the wrapper
        writes the exit code there, and unsets it before the job starts. ``cpus``: the
        job's CPU affinity, set in the child before it runs anything (its threads and
        children inherit it); (): every CPU.
        """
        read_end, write_end = os.pipe()
        try:
            stamper = self._spawn_stamper(read_end, log_file)
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        try:
            main = self.adopt(
                ["/bin/sh", "-c", _WRAPPER, "tuneplane-wrapper", *command],
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=write_end,
                cwd=cwd,  # None: the daemon's own working directory
                env=env,
                # One system call between fork and exec: no lock of ours is taken there.
                preexec_fn=functools.partial(os.sched_setaffinity, 0, cpus) if cpus else None,
            )
        except BaseException:
            os.close(write_end)
            stamper.wait(KILL_GRACE_S)  # it sees EOF and ends
            raise
        os.close(write_end)
        return stamper, main

    def _spawn_stamper(self, read_end: int, log_file: Path) -> subprocess.Popen[bytes]:
        with log_file.open("ab") as out:
            return self.adopt(
                [sys.executable, "-I", "-S", "-c", STAMPER],
                stdin=read_end,
                stdout=out,
                stderr=out,
                cwd="/",
                env={},
            )

    def adopt(self, argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
        """Popen in a new session, kept so it can be reaped; forgets children that ended."""
        child = subprocess.Popen(argv, start_new_session=True, **options)
        with self._lock:
            for pid, known in list(self._children.items()):
                if known.poll() is not None:
                    del self._children[pid]
            self._children[child.pid] = child
        return child

    def alive(self, proc: Proc) -> bool:
        """Running and ours; polls (so reaps) it when this daemon is its parent."""
        with self._lock:
            child = self._children.get(proc.pid)
            if child is not None and child.poll() is not None:
                del self._children[proc.pid]
        if child is not None:
            return child.returncode is None
        return pid_alive(proc)

    def group_alive(self, proc: Proc) -> bool:
        """Whether a process of the group ``proc`` leads still runs: the leader, or one
        it started (a zombie has ended). The leader's end is not its group's: a SIGKILL
        sent to the group ends each member when the kernel next runs it, and under load
        the leader can be gone and reaped while a member has not run yet."""
        return self.alive(proc) or group_running(proc.pid)

    def signal(self, proc: Proc, sig: int, *, group: bool) -> bool:
        """Signal our process (or its group) if it runs; False when it did not."""
        if not self.alive(proc):
            return False
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        except ProcessLookupError:
            return False
        return True


def job_environment(spec: ContainerSpec, job_dir: Path, *, gpus: bool) -> dict[str, str]:
    """A minimal base (never the daemon's own, which holds its token), then the spec's.

    CUDA_VISIBLE_DEVICES comes last so a spec cannot reach past its cards; it is
    empty, not unset, with no cards (unset would mean every card). ``gpus``: the
    operator lets the job see its cards (local_gpu_passthrough).
    """
    env = {"PATH": os.environ.get("PATH", _DEFAULT_PATH), "HOME": os.environ.get("HOME", "/")}
    env.update(spec.env)
    env["CUDA_VISIBLE_DEVICES"] = format_gpus(spec.gpus) if gpus else ""
    env[JOB_DIR_ENV] = str(job_dir)  # read and unset by the wrapper
    return env


def proc_of(child: subprocess.Popen[bytes]) -> Proc:
    """What tells this child from a later process given its pid."""
    return Proc(child.pid, _start_ticks(child.pid), _boot_id())


def pid_alive(proc: Proc) -> bool:
    """Alive and the same process (same boot, same start time); zombies are dead."""
    if not HAS_PROC:  # no /proc (macOS): existence is all there is to go on
        try:
            os.kill(proc.pid, 0)
        except OSError:
            return False
        return True
    if proc.boot is not None and proc.boot != _boot_id():
        return False
    stat = _proc_stat(proc.pid)
    if stat is None or stat[0] in ("Z", "X"):
        return False
    return proc.ticks is None or stat[1] == proc.ticks


def group_running(group: int) -> bool:
    """Whether a process of the process group ``group`` runs (zombies are ended), in
    one pass over /proc; without /proc, whether the group has any process."""
    if not HAS_PROC:
        try:
            os.killpg(group, 0)
        except OSError:
            return False
        return True
    for entry in Path("/proc").iterdir():
        fields = _stat_fields(entry) if entry.name.isdigit() else None
        if fields is not None and int(fields[2]) == group and fields[0] not in ("Z", "X"):
            return True
    return False


def group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:  # gone, or not ours to ask
        return None


def group_usage(groups: set[int]) -> dict[int, Usage]:
    """``group leader -> Usage`` of the process groups asked for, in one pass over /proc."""
    ticks: dict[int, int] = {}
    pages: dict[int, int] = {}
    count: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        fields = _stat_fields(entry) if entry.name.isdigit() else None
        if fields is None or (group := int(fields[2])) not in groups:
            continue
        # utime, stime, cutime, cstime (proc(5) fields 14 to 17), and rss (field 24).
        ticks[group] = ticks.get(group, 0) + sum(int(f) for f in fields[11:15])
        pages[group] = pages.get(group, 0) + int(fields[21])
        count[group] = count.get(group, 0) + 1
    hz, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    return {
        group: Usage(ticks[group] / hz, pages[group] * page, None, count[group], source="proc")
        for group in count
    }


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) from /proc/<pid>/stat; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name in (...) may hold spaces
    return fields[0], int(fields[19])  # fields 3 and 22 of proc(5)


def _stat_fields(entry: Path) -> list[str] | None:
    """/proc/<pid>/stat after the name (state is [0]); None when the process is gone."""
    try:
        text = (entry / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _start_ticks(pid: int) -> int | None:
    stat = _proc_stat(pid) if HAS_PROC else None
    return stat[1] if stat else None


def _boot_id() -> str | None:
    try:
        return _BOOT_ID_FILE.read_text().strip()
    except OSError:
        return None
