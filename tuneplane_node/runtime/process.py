"""ProcessRuntime: each job a bare process group, for development machines without an engine.

A "container" is a directory ``<state>/<name>/`` and the session its process leads::

    spec.json    id, name, created_at and the spec (labels included), written before start
    proc.json    pid and /proc start time of the job and of its log stamper, and started_at
    output.log   stdout and stderr, each line prefixed with an RFC 3339 nanosecond time
    rc           the exit code, written atomically by the job's wrapper as it ends

Everything ``inspect`` and ``ps`` report is rebuilt from these files and /proc, so a
daemon restart loses nothing and the jobs keep running. There is no isolation: image,
mounts, network, limits, the node's confinement and user are ignored, and a job that
calls ``setsid`` escapes ``stop`` (a container's pid namespace would not let it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import platform
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncGenerator, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuneplane_node.clock import SYSTEM_CLOCK, parse_rfc3339, rfc3339
from tuneplane_node.errors import EngineConflict, EngineRefused, EngineUnavailable, InvalidField
from tuneplane_node.runtime.base import (
    EXIT_SIGKILL,
    CacheStatus,
    ContainerSpec,
    ContainerState,
    LogQuery,
    LogStream,
    LogText,
    ProgressCallback,
    PullLimits,
    RuntimeHealth,
    Usage,
    format_gpus,
    job_labels,
)
from tuneplane_node.runtime.pool import BlockingPool
from tuneplane_node.settings import NodeSettings
from tuneplane_node.telemetry import NO_TELEMETRY, Telemetry

log = logging.getLogger(__name__)

ENGINE = "process"
SPEC_FILE = "spec.json"
PROC_FILE = "proc.json"
LOG_FILE = "output.log"
RC_FILE = "rc"
JOB_DIR_ENV = "TUNEPLANE_JOB_DIR"
_VALID_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,254}")  # docker's rule: no "/" or ".."
_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_POLL_S = 0.05
_KILL_GRACE_S = 5.0
_DRAIN_S = 1.0
_TAIL_CHUNK = 64 * 1024
_FOLLOW_POLL_S = 0.2
"""How often a followed log looks for new lines: a read of the file, no thread held."""
_HAS_PROC = Path("/proc/self/stat").exists()
_BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")
_SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL, "SIGINT": signal.SIGINT}

# Runs as `/bin/sh -c _WRAPPER tuneplane-wrapper <argv...>`: the argv is never parsed by
# a shell. `env` execs argv[0] from PATH, so a name like `exit` or `eval` is a program
# to find, not a shell builtin, as in a container. TERM and INT are caught (not ignored,
# which the job would inherit) so the wrapper outlives the job and records its code.
# `command -p` finds env and mv even when the job's PATH does not. The last line kills
# whatever the job left behind in its group, as a container's end does.
_WRAPPER = """\
d=$TUNEPLANE_JOB_DIR
unset TUNEPLANE_JOB_DIR
trap : TERM INT
command -p env -- "$@"
rc=$?
printf '%s' "$rc" > "$d/rc.tmp" && command -p mv -f "$d/rc.tmp" "$d/rc"
kill -s KILL 0
"""

# Reads the job's merged stdout/stderr from a pipe and appends each line, stamped with
# the time it arrived, to the log (its stdout). It is a process of its own, in a session
# of its own, so it survives a daemon restart and a stop of the job's group, and ends
# when the last writer closes the pipe.
_STAMPER = """\
import sys, time
src, out = sys.stdin.buffer, sys.stdout.buffer
while True:
    line = src.readline(65536)
    if not line:
        break
    ns = time.time_ns()
    head = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9))
    out.write(b"%s.%09dZ %s" % (head.encode(), ns % 10**9, line))
    if not line.endswith(b"\\n"):
        out.write(b"\\n")
    out.flush()
"""


@dataclass(frozen=True)
class _Proc:
    """A process we started, told from a stranger given its recycled pid.

    ``ticks`` is its start time (clock ticks since boot, /proc/<pid>/stat field 22) and
    ``boot`` the kernel's boot id, since ticks restart from zero at every boot.
    """

    pid: int
    ticks: int | None
    boot: str | None = None


@dataclass(frozen=True)
class _Job:
    name: str
    dir: Path
    id: str
    created_at: str | None
    labels: dict[str, str]
    started_at: str | None = None
    main: _Proc | None = None
    stamper: _Proc | None = None


class ProcessRuntime:
    """The ContainerRuntime of bare processes: development only, no isolation at all."""

    name = ENGINE

    def __init__(
        self,
        settings: NodeSettings,
        *,
        state_dir: Path | None = None,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        root = state_dir if state_dir is not None else settings.state_dir / "process-runtime"
        self.root = root.expanduser().absolute()
        self._settings = settings
        self._pool = BlockingPool(
            settings.runtime_threads, name="tuneplane-process", telemetry=telemetry
        )
        # Popen objects of the processes this daemon started: polling them reaps zombies.
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    # -- the ContainerRuntime verbs ------------------------------------------------------

    async def start(self) -> None:
        return None  # nothing to fill: every read looks at the files

    def status(self) -> CacheStatus | None:
        return None

    async def run(self, spec: ContainerSpec) -> str:
        """Start the job in a new session; a name in use, running or not, is a conflict."""
        return await self._pool.call(self._start, spec)

    async def inspect(self, name: str) -> ContainerState:
        return await self._pool.call(self._inspect, name)

    inspect_fresh = inspect  # every inspect reads the job's files

    async def inspect_many(self, names: Sequence[str]) -> list[ContainerState]:
        return [await self.inspect(name) for name in names]

    async def logs(self, name: str, query: LogQuery) -> LogText | None:
        """The stamped lines the query asks for; None for no such job. The stamper
        writes a line longer than 64 KiB as several, and each counts as a line here."""
        job = await self._pool.call(self._load, name)
        if job is None:
            return None
        await self._drain(job)
        return await self._pool.call(_tail, job.dir / LOG_FILE, query)

    async def follow_logs(self, name: str, query: LogQuery) -> LogStream | None:
        """The stamped lines, then new ones as the stamper writes them, read from the file
        every 0.2 s (each read a short call: no thread is held while the job is quiet),
        until the job and its stamper have ended."""
        job = await self._pool.call(self._load, name)
        return None if job is None else self._follow(job, query)

    async def _follow(self, job: _Job, query: LogQuery) -> AsyncGenerator[bytes, None]:
        path = job.dir / LOG_FILE
        text, offset = await self._pool.call(_tail_at, path, query)
        if text.text:
            yield text.text.encode()
        while True:
            writing = await self._writing(job)  # asked before the read: no line is missed
            chunk = await self._pool.call(_read_at, path, offset)
            offset += len(chunk)
            if chunk:
                yield chunk
            elif not writing:
                return
            else:
                await asyncio.sleep(_FOLLOW_POLL_S)

    async def _writing(self, job: _Job) -> bool:
        """Whether lines may still come: the job or its stamper still runs."""
        procs = [proc for proc in (job.main, job.stamper) if proc is not None]
        return any([await self._pool.call(self._alive, proc) for proc in procs])

    async def kill(self, ref: str, signal: str) -> None:
        """The signal to the job's whole process group; no job, or ended: nothing to do."""
        job = await self._pool.call(self._load, ref)
        if job is not None and job.main is not None:
            await self._pool.call(self._signal, job.main, _SIGNALS[signal], group=True)

    async def wait_exited(self, name: str, timeout: float) -> bool:
        job = await self._pool.call(self._load, name)
        if job is None or job.main is None:
            return True
        return await self._wait_gone(job.main, timeout)

    async def remove(self, name: str) -> None:
        """Kill the job if it runs, then delete its directory; no job is no-op."""
        job = await self._pool.call(self._load, name)
        if job is not None and job.main is not None:
            await self._kill_group(job, action=f"remove {name}")
            if job.stamper is not None:
                # It ends by itself at EOF, unless a writer escaped the group: cut that off.
                await self._pool.call(self._signal, job.stamper, signal.SIGKILL, group=False)
                await self._wait_gone(job.stamper, _KILL_GRACE_S)
        job_dir = self._job_dir(name)
        if job_dir is not None:
            await self._pool.call(self._delete, name, job_dir)

    async def ps(self) -> list[ContainerState]:
        """Every job in the state directory, exited ones included."""
        return await self._pool.call(self._ps)

    async def usage(self, refs: Sequence[str]) -> dict[str, Usage]:
        """Summed over the processes of each job's group, from /proc: CPU time (reaped
        children included), resident memory, and how many. No limit: nothing enforces one."""
        return await self._pool.call(self._usage, list(refs))

    def _usage(self, names: list[str]) -> dict[str, Usage]:
        leaders = self._leaders(names)
        groups = _group_usage(set(leaders.values())) if _HAS_PROC else {}
        return {name: groups.get(pid, Usage(source="proc")) for name, pid in leaders.items()}

    def holders_of(self, pids: Collection[int]) -> dict[int, str | None]:
        """A job's processes are its process group: each job starts a session of its
        own (one that calls ``setsid`` escapes, as it escapes stop and usage)."""
        jobs = {pid: name for name, pid in self._leaders(self._names()).items()}
        groups = {pid: _group_of(pid) for pid in pids}
        return {pid: jobs.get(group) if group else None for pid, group in groups.items()}

    def _leaders(self, names: Iterable[str]) -> dict[str, int]:
        """Each running job's main pid, which leads its process group, by job name."""
        jobs = [job for name in names if (job := self._load(name)) is not None]
        return {job.name: job.main.pid for job in jobs if job.main and self._alive(job.main)}

    async def health(self) -> RuntimeHealth:
        """Ok while the state directory can be made; the version names the platform."""
        try:
            await self._pool.call(self.root.mkdir, parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            return RuntimeHealth(ok=False, engine=ENGINE, error=f"state directory: {exc}")
        version = f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
        return RuntimeHealth(ok=True, engine=ENGINE, version=version)

    async def image_exists(self, image: str) -> bool:
        return True  # a process runtime has no images: every one is "there"

    async def pull(
        self, image: str, *, limits: PullLimits, on_progress: ProgressCallback | None = None
    ) -> None:
        return None  # nothing to pull

    async def close(self) -> None:
        """Stop the pool; jobs and their log stampers keep running, as containers would."""
        self._pool.close()

    # -- starting -----------------------------------------------------------------------

    def _start(self, spec: ContainerSpec) -> str:
        job_dir = self._job_dir(spec.name)
        action = f"run {spec.name}"
        if job_dir is None:
            raise InvalidField("container.name", "not a valid job name")
        if not spec.command:
            raise InvalidField("container.command", "the process runtime needs a command")
        with _refusal(action):
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                job_dir.mkdir(mode=0o700)  # atomic: of two runs of one name, one wins
            except FileExistsError:
                status = self._inspect(spec.name).status or "half-made"
                reason = f"the name is already in use by a job that is {status}; remove it first"
                raise EngineConflict(engine=ENGINE, action=action, reason=reason) from None
            try:
                return self._launch(spec, job_dir)
            except BaseException:
                shutil.rmtree(job_dir, ignore_errors=True)
                raise

    def _launch(self, spec: ContainerSpec, job_dir: Path) -> str:
        job_id = secrets.token_hex(32)
        record = {"id": job_id, "name": spec.name, "created_at": _now(), "spec": _spec_record(spec)}
        _write_atomic(job_dir / SPEC_FILE, json.dumps(record, indent=2, default=_jsonable))
        log.debug("process runtime ignores image, mounts, network, limits, user of %s", spec.name)
        stamper, main = self._spawn(spec, job_dir)
        started = {
            "started_at": _now(),
            "main": _proc_record(main),
            "stamper": _proc_record(stamper),
        }
        try:
            _write_atomic(job_dir / PROC_FILE, json.dumps(started))
        except BaseException:
            os.killpg(main.pid, signal.SIGKILL)  # unrecorded, it could never be stopped
            raise
        log.info("started job %s as pid %d", spec.name, main.pid)
        return job_id

    def _spawn(
        self, spec: ContainerSpec, job_dir: Path
    ) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
        """Start the stamper, then the job writing into it: (stamper, job)."""
        read_end, write_end = os.pipe()
        try:
            stamper = self._spawn_stamper(read_end, job_dir)
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        try:
            main = self._adopt(
                ["/bin/sh", "-c", _WRAPPER, "tuneplane-wrapper", *spec.command],
                stdin=subprocess.DEVNULL,
                stdout=write_end,
                stderr=write_end,
                cwd=spec.workdir,  # None: the daemon's own working directory
                env=self._environment(spec, job_dir),
            )
        except BaseException:
            os.close(write_end)
            stamper.wait(_KILL_GRACE_S)  # it sees EOF and ends
            raise
        os.close(write_end)
        return stamper, main

    def _spawn_stamper(self, read_end: int, job_dir: Path) -> subprocess.Popen[bytes]:
        with (job_dir / LOG_FILE).open("ab") as log_file:
            return self._adopt(
                [sys.executable, "-I", "-S", "-c", _STAMPER],
                stdin=read_end,
                stdout=log_file,
                stderr=log_file,
                cwd="/",
                env={},
            )

    def _adopt(self, argv: list[str], **options: Any) -> subprocess.Popen[bytes]:
        """Popen in a new session, kept so it can be reaped; forgets children that ended."""
        child = subprocess.Popen(argv, start_new_session=True, **options)
        with self._lock:
            for pid, known in list(self._children.items()):
                if known.poll() is not None:
                    del self._children[pid]
            self._children[child.pid] = child
        return child

    def _environment(self, spec: ContainerSpec, job_dir: Path) -> dict[str, str]:
        """A minimal base (never the daemon's own, which holds its token), then the spec's.

        CUDA_VISIBLE_DEVICES comes last so a spec cannot reach past its cards; it is
        empty, not unset, with no cards (unset would mean every card).
        """
        env = {"PATH": os.environ.get("PATH", _DEFAULT_PATH), "HOME": os.environ.get("HOME", "/")}
        env.update(spec.env)
        passthrough = self._settings.local_gpu_passthrough
        env["CUDA_VISIBLE_DEVICES"] = format_gpus(spec.gpus) if passthrough else ""
        env[JOB_DIR_ENV] = str(job_dir)  # read and unset by the wrapper
        return env

    # -- observing ----------------------------------------------------------------------

    def _job_dir(self, name: str) -> Path | None:
        """The job's directory, or None for a name that could point outside the root."""
        return self.root / name if _VALID_NAME.fullmatch(name) else None

    def _load(self, name: str) -> _Job | None:
        """The job's files; None when there is no job (or it is still being made)."""
        job_dir = self._job_dir(name)
        if job_dir is None:
            return None
        with _unreadable():
            try:
                record = json.loads((job_dir / SPEC_FILE).read_text())
            except FileNotFoundError:
                return None
            labels = {str(k): str(v) for k, v in record["spec"].get("labels", {}).items()}
            job = _Job(name, job_dir, str(record["id"]), record.get("created_at"), labels)
            with contextlib.suppress(FileNotFoundError):
                started = json.loads((job_dir / PROC_FILE).read_text())
                job = dataclasses.replace(
                    job,
                    started_at=started["started_at"],
                    main=_Proc(**started["main"]),
                    stamper=_Proc(**started["stamper"]),
                )
        return job

    def _inspect(self, name: str) -> ContainerState:
        job = self._load(name)
        return ContainerState.missing(name) if job is None else self._state(job)

    def _state(self, job: _Job) -> ContainerState:
        # No id: the job's name is its only handle (see ContainerRuntime's verbs).
        state = ContainerState(
            name=job.name,
            exists=True,
            status="created",
            labels=job.labels,
            created_at=job.created_at,
        )
        if job.main is None:
            return state  # never started (or the daemon died while starting it)
        state = dataclasses.replace(state, status="running", started_at=job.started_at)
        if self._alive(job.main):
            return state
        with _unreadable():
            exit_code, finished_at = _exit_record(job.dir / RC_FILE)
        return dataclasses.replace(
            state, status="exited", exit_code=exit_code, finished_at=finished_at
        )

    def _ps(self) -> list[ContainerState]:
        states = [self._inspect(name) for name in self._names()]
        return [state for state in states if state.exists]

    def _names(self) -> list[str]:
        """Every job's name: its directory's."""
        with _unreadable():
            if not self.root.is_dir():
                return []
            return sorted(entry.name for entry in self.root.iterdir() if entry.is_dir())

    def _alive(self, proc: _Proc) -> bool:
        """Running and ours; polls (so reaps) it when this daemon is its parent."""
        with self._lock:
            child = self._children.get(proc.pid)
            if child is not None and child.poll() is not None:
                del self._children[proc.pid]
        if child is not None:
            return child.returncode is None
        return _pid_alive(proc)

    async def _drain(self, job: _Job) -> None:
        """Give an ended job's stamper a moment to write its last lines (at most 1 s)."""
        if job.main is None or job.stamper is None:
            return
        if await self._pool.call(self._alive, job.main):
            return
        await self._wait_gone(job.stamper, _DRAIN_S)

    # -- stopping -----------------------------------------------------------------------

    def _signal(self, proc: _Proc, sig: int, *, group: bool) -> bool:
        """Signal our process (or its group) if it runs; False when it did not."""
        if not self._alive(proc):
            return False
        try:
            if group:
                os.killpg(proc.pid, sig)
            else:
                os.kill(proc.pid, sig)
        except ProcessLookupError:
            return False
        return True

    async def _wait_gone(self, proc: _Proc, timeout: float) -> bool:
        """Poll (asleep between) until the process ends; False if it outlives ``timeout``."""
        deadline = time.monotonic() + timeout
        while await self._pool.call(self._alive, proc):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_POLL_S)
        return True

    async def _kill_group(self, job: _Job, *, action: str) -> None:
        assert job.main is not None
        await self._pool.call(self._signal, job.main, signal.SIGKILL, group=True)
        if not await self._wait_gone(job.main, _KILL_GRACE_S):
            reason = f"pid {job.main.pid} outlived SIGKILL for {_KILL_GRACE_S:g} s"
            raise EngineRefused(engine=ENGINE, action=action, reason=reason)

    def _delete(self, name: str, job_dir: Path) -> None:
        """Delete the job's files; already gone (or going, by another remove) is done."""
        with _refusal(f"remove {name}"):
            try:
                shutil.rmtree(job_dir)
            except FileNotFoundError:
                return
        log.info("removed job %s", name)


def _now() -> str:
    return rfc3339(SYSTEM_CLOCK.now())


def _spec_record(spec: ContainerSpec) -> dict[str, Any]:
    record = {field.name: getattr(spec, field.name) for field in dataclasses.fields(spec)}
    return {**record, "labels": job_labels(spec)}


def _jsonable(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _proc_record(child: subprocess.Popen[bytes]) -> dict[str, int | str | None]:
    return {"pid": child.pid, "ticks": _start_ticks(child.pid), "boot": _boot_id()}


def _write_atomic(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of it."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _exit_record(rc_file: Path) -> tuple[int | None, str | None]:
    """(exit code, finished_at) of an ended job.

    A job gone without writing its code was killed (SIGKILL to its group, the OOM
    killer, a reboot): it is given 137, once, and the moment it was found dead becomes
    its finish time. ``os.link`` never replaces, so a code the wrapper wrote stays.
    """
    if not rc_file.exists():
        tmp = rc_file.with_name(f".{rc_file.name}.{secrets.token_hex(4)}.tmp")
        tmp.write_text(str(EXIT_SIGKILL))
        with contextlib.suppress(FileExistsError):
            os.link(tmp, rc_file)
        tmp.unlink()
    text = rc_file.read_text().strip()
    finished = rfc3339(datetime.fromtimestamp(rc_file.stat().st_mtime, timezone.utc))
    if not text.isdigit():
        log.warning("unreadable exit code %r in %s", text, rc_file)
        return None, finished
    return int(text), finished


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) from /proc/<pid>/stat; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the name in (...) may hold spaces
    return fields[0], int(fields[19])  # fields 3 and 22 of proc(5)


def _group_usage(groups: set[int]) -> dict[int, Usage]:
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


def _stat_fields(entry: Path) -> list[str] | None:
    """/proc/<pid>/stat after the name (state is [0]); None when the process is gone."""
    try:
        text = (entry / "stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _start_ticks(pid: int) -> int | None:
    stat = _proc_stat(pid) if _HAS_PROC else None
    return stat[1] if stat else None


def _boot_id() -> str | None:
    try:
        return _BOOT_ID_FILE.read_text().strip()
    except OSError:
        return None


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:  # gone, or not ours to ask
        return None


def _pid_alive(proc: _Proc) -> bool:
    """Alive and the same process (same boot, same start time); zombies are dead."""
    if not _HAS_PROC:  # no /proc (macOS): existence is all there is to go on
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


def _tail(path: Path, query: LogQuery) -> LogText:
    """The last lines, read backwards, so a huge log costs no more than the answer."""
    return _tail_at(path, query)[0]


def _read_at(path: Path, offset: int) -> bytes:
    """At most a tail chunk of the log from ``offset`` on; none when there is no log."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read(_TAIL_CHUNK)
    except FileNotFoundError:
        return b""


def _tail_at(path: Path, query: LogQuery) -> tuple[LogText, int]:
    """`_tail`, and the offset of the log's end it read up to (a follow reads on there)."""
    end = 0
    try:
        with path.open("rb") as file:
            position = end = file.seek(0, os.SEEK_END)
            data = b""
            while position > 0 and data.count(b"\n") <= query.tail:
                if len(data) > query.max_bytes:
                    break  # the cap is reached: older lines would be cut anyway
                step = min(_TAIL_CHUNK, position)
                position -= step
                file.seek(position)
                data = file.read(step) + data
    except FileNotFoundError:
        return LogText(""), 0
    lines = data.splitlines(keepends=True)
    if position > 0:
        lines = lines[1:]  # it may have begun before what was read
    lines = [line for line in lines[max(0, len(lines) - query.tail) :] if _since(line, query.since)]
    return _capped(lines, query.max_bytes), end


def _since(line: bytes, since: datetime | None) -> bool:
    stamp = parse_rfc3339(line.partition(b" ")[0].decode("ascii", "replace"))
    return since is None or stamp is None or stamp >= since


def _capped(lines: list[bytes], max_bytes: int) -> LogText:
    """The newest lines within ``max_bytes``; the front of a longer last line is cut."""
    kept: list[bytes] = []
    size, truncated = 0, False
    for line in reversed(lines):
        if size + len(line) > max_bytes:
            truncated = True
            kept.append(line[len(line) - (max_bytes - size) :])  # its newest part
            break
        kept.append(line)
        size += len(line)
    return LogText(b"".join(reversed(kept)).decode("utf-8", "replace"), truncated)


@contextlib.contextmanager
def _refusal(action: str) -> Iterator[None]:
    """An OS error while changing a job: the runtime answered, and refused."""
    try:
        yield
    except OSError as exc:
        raise EngineRefused(engine=ENGINE, action=action, reason=str(exc)) from exc


@contextlib.contextmanager
def _unreadable() -> Iterator[None]:
    """State that cannot be read is unknown (503), never "the job is gone"."""
    try:
        yield
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EngineUnavailable(engine=ENGINE, reason=f"cannot read job state: {exc!r}") from exc
