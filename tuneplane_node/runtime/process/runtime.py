"""ProcessRuntime: each job a bare process group, for development machines without an engine.

A "container" is a directory ``<state>/<name>/`` of records (runtime/processfiles.py)
and the session its process leads (runtime/processgroups.py); its output goes through a
log stamper into a file (runtime/processlogs.py). Everything ``inspect`` and ``ps``
report is rebuilt from these files and /proc, so a daemon restart loses nothing and the
jobs keep running. There is no isolation: image, mounts, network, limits, the node's
confinement and user are ignored, and a job that calls ``setsid`` escapes ``stop`` (a
container's pid namespace would not let it).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import platform
import secrets
import shutil
import signal
from collections.abc import AsyncGenerator, Collection, Iterable, Sequence
from pathlib import Path

from tuneplane_node.clock import SYSTEM_CLOCK, Clock, rfc3339
from tuneplane_node.errors import EngineConflict, EngineRefused, InvalidField
from tuneplane_node.logformat import job_fields
from tuneplane_node.runtime.base import (
    ContainerState,
    LogQuery,
    LogStream,
    LogText,
    ProgressCallback,
    PullLimits,
    no_cache,
    tells_no_changes,
)
from tuneplane_node.runtime.facts import (
    DIRECT,
    DataRoot,
    DeviceSupport,
    DiskUse,
    EngineImage,
    ImageInfo,
    IsolationSupport,
    MountSupport,
    RuntimeHealth,
    Usage,
)
from tuneplane_node.runtime.labels import run_id_of
from tuneplane_node.runtime.pool import BlockingPool
from tuneplane_node.runtime.process.files import ENGINE as ENGINE
from tuneplane_node.runtime.process.files import LOG_FILE as LOG_FILE
from tuneplane_node.runtime.process.files import PROC_FILE as PROC_FILE
from tuneplane_node.runtime.process.files import RC_FILE as RC_FILE
from tuneplane_node.runtime.process.files import SPEC_FILE as SPEC_FILE
from tuneplane_node.runtime.process.files import (
    Job,
    JobFiles,
    exit_record,
    refusal,
    unreadable,
    write_spec,
    write_started,
)
from tuneplane_node.runtime.process.groups import (
    HAS_PROC,
    KILL_GRACE_S,
    Proc,
    ProcessGroups,
    group_of,
    group_usage,
    job_environment,
    proc_of,
)
from tuneplane_node.runtime.process.groups import JOB_DIR_ENV as JOB_DIR_ENV
from tuneplane_node.runtime.process.logs import read_at, tail, tail_at
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings
from tuneplane_node.signals import JOB_SIGNALS
from tuneplane_node.telemetry import NO_TELEMETRY, Telemetry
from tuneplane_node.wire.values import RegistryAuth

log = logging.getLogger(__name__)
# Imported `as` themselves: ENGINE, the file names and JOB_DIR_ENV were this module's
# before the split, and stay importable from here.

_POLL_S = 0.02
_DRAIN_S = 1.0
_FOLLOW_POLL_S = 0.2
"""How often a followed log looks for new lines: a read of the file, no thread held."""
_SIGNALS = {**JOB_SIGNALS, "SIGKILL": int(signal.SIGKILL)}


class ProcessRuntime:
    """The ContainerRuntime of bare processes: development only, no isolation at all."""

    name = ENGINE

    def __init__(
        self,
        settings: NodeSettings,
        *,
        state_dir: Path | None = None,
        telemetry: Telemetry = NO_TELEMETRY,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        root = state_dir if state_dir is not None else settings.state_dir / "process-runtime"
        self.root = root.expanduser().absolute()
        self._settings = settings
        self._clock = clock  # the polls' waits, the jobs' created and started times
        self._pool = BlockingPool(
            settings.runtime_threads, name="tuneplane-process", telemetry=telemetry
        )
        self._files = JobFiles(self.root)
        self._groups = ProcessGroups()

    # -- the ContainerRuntime verbs ------------------------------------------------------

    async def start(self) -> None:
        return None  # nothing to fill: every read looks at the files

    status = cache_generation = no_cache  # no cache: every read looks at the files

    on_change = tells_no_changes  # an exit is seen only by reading the files

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
        job = await self._pool.call(self._files.load, name)
        if job is None:
            return None
        await self._drain(job)
        return await self._pool.call(tail, job.dir / LOG_FILE, query)

    async def follow_logs(self, name: str, query: LogQuery) -> LogStream | None:
        """The stamped lines, then new ones as the stamper writes them, read from the file
        every 0.2 s (each read a short call: no thread is held while the job is quiet),
        until the job and its stamper have ended."""
        job = await self._pool.call(self._files.load, name)
        return None if job is None else self._follow(job, query)

    async def _follow(self, job: Job, query: LogQuery) -> AsyncGenerator[bytes, None]:
        path = job.dir / LOG_FILE
        await self._drain(job)  # an ended job's tail counts its last lines, as logs' does
        text, offset = await self._pool.call(tail_at, path, query)
        if text.text:
            yield text.text.encode()
        while True:
            writing = await self._writing(job)  # asked before the read: no line is missed
            chunk = await self._pool.call(read_at, path, offset)
            offset += len(chunk)
            if chunk:
                yield chunk
            elif not writing:
                return
            else:
                await self._clock.sleep(_FOLLOW_POLL_S)

    async def _writing(self, job: Job) -> bool:
        """Whether lines may still come: the job or its stamper still runs."""
        procs = [proc for proc in (job.main, job.stamper) if proc is not None]
        return any([await self._pool.call(self._groups.alive, proc) for proc in procs])

    async def kill(self, ref: str, signal: str) -> bool:
        """The signal to the job's whole process group; no job, or ended: nothing to do."""
        job = await self._pool.call(self._files.load, ref)
        if job is None or job.main is None:
            return False
        return await self._pool.call(self._groups.signal, job.main, _SIGNALS[signal], group=True)

    async def catches(self, ref: str, signal: str) -> bool | None:
        """Not read: a job's signals go to its whole process group, the warning as
        asked (a development runtime)."""
        return None

    async def wait_exited(self, name: str, timeout: float) -> bool:
        job = await self._pool.call(self._files.load, name)
        if job is None or job.main is None:
            return True
        return await self._wait_gone(job.main, timeout)

    async def remove(self, name: str) -> None:
        """Kill the job if it runs, then delete its directory, once every process of the
        job has ended; no job is no-op."""
        job = await self._pool.call(self._files.load, name)
        if job is not None and job.main is not None:
            await self._kill_group(job, action=f"remove {name}")
            if job.stamper is not None:
                # It ends by itself at EOF, unless a writer escaped the group: cut that off.
                await self._pool.call(self._groups.signal, job.stamper, signal.SIGKILL, group=False)
                await self._wait_gone(job.stamper, KILL_GRACE_S)
        job_dir = self._files.dir(name)
        if job_dir is not None:
            await self._pool.call(self._files.delete, name, job_dir)

    async def ps(self) -> list[ContainerState]:
        """Every job of the node in the state directory (one with the run-id label, as
        the engines' list filter says), exited ones included."""
        return await self._pool.call(self._ps)

    async def usage(self, refs: Sequence[str]) -> dict[str, Usage]:
        """Summed over the processes of each job's group, from /proc: CPU time (reaped
        children included), resident memory, and how many. No limit: nothing enforces one."""
        return await self._pool.call(self._usage, list(refs))

    def _usage(self, names: list[str]) -> dict[str, Usage]:
        leaders = self._leaders(names)
        groups = group_usage(set(leaders.values())) if HAS_PROC else {}
        return {name: groups.get(pid, Usage(source="proc")) for name, pid in leaders.items()}

    def holders_of(self, pids: Collection[int]) -> dict[int, str | None]:
        """A job's processes are its process group: each job starts a session of its
        own (one that calls ``setsid`` escapes, as it escapes stop and usage)."""
        jobs = {pid: name for name, pid in self._leaders(self._files.names()).items()}
        groups = {pid: group_of(pid) for pid in pids}
        return {pid: jobs.get(group) if group else None for pid, group in groups.items()}

    def _leaders(self, names: Iterable[str]) -> dict[str, int]:
        """Each running job's main pid, which leads its process group, by job name."""
        jobs = [job for name in names if (job := self._files.load(name)) is not None]
        alive = self._groups.alive
        return {job.name: job.main.pid for job in jobs if job.main and alive(job.main)}

    async def health(self) -> RuntimeHealth:
        """Ok while the state directory can be made; the version names the platform."""
        try:
            await self._pool.call(self.root.mkdir, parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            return RuntimeHealth(ok=False, engine=ENGINE, error=f"state directory: {exc}")
        version = f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
        return RuntimeHealth(ok=True, engine=ENGINE, version=version)

    async def device_support(self) -> DeviceSupport:
        return DeviceSupport()  # no engine between: a job sees its cards by CUDA_VISIBLE_DEVICES

    async def image_exists(self, image: str) -> bool:
        return True  # a process runtime has no images: every one is "there"

    async def image_info(self, image: str) -> ImageInfo | None:
        return None  # no images: nothing the node could list or collect

    async def pull(
        self,
        image: str,
        *,
        limits: PullLimits,
        on_progress: ProgressCallback | None = None,
        auth: RegistryAuth | None = None,
    ) -> None:
        return None  # nothing to pull

    # A process runtime has no images: no data root, nothing to list, nothing removed
    # (the image GC has nothing to do, and health's image_store is unknown).
    async def data_root(self) -> DataRoot | None:
        return None

    async def mount_support(self) -> MountSupport:
        return MountSupport(DIRECT)  # it mounts nothing: a job sees the host (development)

    async def isolation_support(self) -> IsolationSupport:
        return IsolationSupport()  # no OCI runtime, no namespaces: a bare process

    async def disk_usage(self, ref: str, *, budget_s: float) -> DiskUse | None:
        """Unknown: a bare process writes wherever its user may, not in a layer."""
        names = await self._pool.call(self._files.names)
        return DiskUse(None) if ref in names else None

    async def list_images(self) -> list[EngineImage]:
        return []

    async def remove_image(self, image: EngineImage) -> bool:
        return True

    async def close(self) -> None:
        """Stop the pool; jobs and their log stampers keep running, as containers would."""
        self._pool.close()

    # -- starting -----------------------------------------------------------------------

    def _start(self, spec: ContainerSpec) -> str:
        job_dir = self._files.dir(spec.name)
        action = f"run {spec.name}"
        if job_dir is None:
            raise InvalidField("container.name", "not a valid job name")
        if not spec.command:
            raise InvalidField("container.command", "the process runtime needs a command")
        with refusal(action):
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
        write_spec(job_dir, spec, job_id=job_id, created_at=self._now())
        log.debug("process runtime ignores image, mounts, network, limits, user of %s", spec.name)
        # Read before the spawn: a job that ends at once may write its code before the
        # spawn returns, and its start must not come after its finish.
        started_at = self._now()
        stamper, main = self._groups.spawn(
            spec.command,
            log_file=job_dir / LOG_FILE,
            cwd=spec.workdir,
            env=job_environment(spec, job_dir, gpus=self._settings.local_gpu_passthrough),
            cpus=spec.cpuset_cpus,  # memory nodes: the kernel's first touch keeps it near
        )
        main_proc, stamper_proc = proc_of(main), proc_of(stamper)
        try:
            write_started(job_dir, started_at=started_at, main=main_proc, stamper=stamper_proc)
        except BaseException:
            os.killpg(main.pid, signal.SIGKILL)  # unrecorded, it could never be stopped
            raise
        run_id = run_id_of(spec.labels)
        log.info(
            "started job %s as pid %d", spec.name, main.pid, extra=job_fields(spec.name, run_id)
        )
        return job_id

    # -- observing ----------------------------------------------------------------------

    def _inspect(self, name: str) -> ContainerState:
        job = self._files.load(name)
        return ContainerState.missing(name) if job is None else self._state(job)

    def _state(self, job: Job) -> ContainerState:
        # No id: the job's name is its only handle (see ContainerRuntime's verbs).
        state = ContainerState(
            name=job.name,
            exists=True,
            status="created",
            labels=job.labels,
            created_at=job.created_at,
            stop_signal=job.stop_signal,
            read_only_root=False,  # a bare process writes wherever its user may
        )
        if job.main is None:
            return state  # never started (or the daemon died while starting it)
        state = dataclasses.replace(state, status="running", started_at=job.started_at)
        if self._groups.alive(job.main):
            return state
        with unreadable():
            exit_code, finished_at = exit_record(job.dir / RC_FILE, job.started_at)
        return dataclasses.replace(
            state, status="exited", exit_code=exit_code, finished_at=finished_at
        )

    def _ps(self) -> list[ContainerState]:
        states = [self._inspect(name) for name in self._files.names()]
        return [state for state in states if state.ours]

    async def _drain(self, job: Job) -> None:
        """Give an ended job's stamper a moment to write its last lines (at most 1 s)."""
        if job.main is None or job.stamper is None:
            return
        if await self._pool.call(self._groups.alive, job.main):
            return
        await self._wait_gone(job.stamper, _DRAIN_S)

    # -- stopping -----------------------------------------------------------------------

    async def _wait_gone(self, proc: Proc, timeout: float, *, group: bool = False) -> bool:
        """Poll (asleep between) until the process ends (``group``: every process of the
        group it leads); False if it outlives ``timeout``."""
        alive = self._groups.group_alive if group else self._groups.alive
        deadline = self._clock.monotonic() + timeout
        while await self._pool.call(alive, proc):
            if self._clock.monotonic() >= deadline:
                return False
            await self._clock.sleep(_POLL_S)
        return True

    async def _kill_group(self, job: Job, *, action: str) -> None:
        """SIGKILL to the job's group; returns once every process of it has ended."""
        assert job.main is not None
        await self._pool.call(self._groups.signal, job.main, signal.SIGKILL, group=True)
        if not await self._wait_gone(job.main, KILL_GRACE_S, group=True):
            reason = f"the group of pid {job.main.pid} outlived SIGKILL for {KILL_GRACE_S:g} s"
            raise EngineRefused(engine=ENGINE, action=action, reason=reason)

    def _now(self) -> str:
        return rfc3339(self._clock.now())
