"""EngineRuntime: what the docker and podman runtimes share, whatever their SDK.

The async verbs, the pool, the create options both engines take alike and the pull's
deadlines live here; every call passes one seam (`EngineSeam`, `runtime.engines.seam`),
which is handed to the helpers `EngineRuntime` composes: the store's and the mounts'
(`store`), the jobs' parent cgroup's (`cgroupparent`), the processes' and isolation's
(`isolation`). An adapter supplies its blocking SDK calls (`EngineCalls`: ``_create``,
``_inspect``, ...), its `ErrorTable` and the create options that truly differ (mounts,
stop signal, CPU limit, GPUs). Nothing here imports an SDK.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import (
    EngineRefused,
    NodeError,
)
from tuneplane_node.runtime import facts
from tuneplane_node.runtime.base import (
    RUNNING,
    Brief,
    ContainerState,
    EngineEvent,
    LogQuery,
    LogStream,
    LogText,
    ProgressCallback,
    PullLimits,
    no_cache,
    tells_no_changes,
)
from tuneplane_node.runtime.engines import dockerformat as fmt
from tuneplane_node.runtime.engines.cgroupparent import EngineParent, ParentReport
from tuneplane_node.runtime.engines.dockerformat import LogFold
from tuneplane_node.runtime.engines.isolation import EngineIsolation, EngineProcesses
from tuneplane_node.runtime.engines.networks.egress import EgressRule, hold_host_job
from tuneplane_node.runtime.engines.pulling import PullStream, drive_pull, pull_headers
from tuneplane_node.runtime.engines.seam import EngineSeam, ErrorTable
from tuneplane_node.runtime.engines.store import EngineImages, EngineMounts, StoreCalls
from tuneplane_node.runtime.engines.usage import EngineUsage
from tuneplane_node.runtime.facts import DeviceSupport, ImageInfo, RuntimeHealth, Usage
from tuneplane_node.runtime.labels import LABEL_RUN_ID, job_labels
from tuneplane_node.runtime.logstream import LogRelay, unbound_reads
from tuneplane_node.runtime.pool import BlockingPool
from tuneplane_node.runtime.spec import (
    DEVICES_ENV,
    Confinement,
    ContainerSpec,
    format_gpus,
)
from tuneplane_node.settings import NodeSettings
from tuneplane_node.telemetry import NO_TELEMETRY, Telemetry
from tuneplane_node.wire.values import RegistryAuth

T = TypeVar("T")
POLL_S = 0.25
Events = Iterator[EngineEvent]


def common_options(spec: ContainerSpec) -> dict[str, Any]:
    """The create() arguments both SDKs take alike: entrypoint replaced, no auto-remove."""
    options: dict[str, Any] = {
        "image": spec.image,
        "name": spec.name,
        "environment": dict(spec.env),
        "labels": job_labels(spec),
        "network_mode": spec.network,
    }
    if spec.command:
        options["entrypoint"] = [spec.command[0]]
        options["command"] = list(spec.command[1:])
    optional = {
        "working_dir": spec.workdir,
        "user": spec.user,
        "shm_size": spec.shm_size,
        "mem_limit": spec.memory_limit,
    }
    if spec.runtime:  # both SDKs' create() take it (docker's Runtime, libpod's oci_runtime)
        options["runtime"] = spec.runtime
    options.update({key: value for key, value in optional.items() if value is not None})
    return {**options, **confinement_options(spec.confinement)}


def confinement_options(confinement: Confinement) -> dict[str, Any]:
    """The bounds both SDKs spell alike: a pids limit and the job's OOM score (the kernel
    takes a job before the node or the engine). Capabilities are the adapters'."""
    return {"pids_limit": confinement.pids_limit, "oom_score_adj": confinement.oom_score_adj}


async def asked_support(runtime: EngineRuntime, read: Callable[[], DeviceSupport]) -> DeviceSupport:
    """An adapter's `device_support`: ``read`` on its pool within the deadline, an error
    as the answer's ``error`` (never raised: health asks it)."""
    try:
        return await runtime.seam.call("report its runtimes", read, read=True)
    except NodeError as exc:
        return DeviceSupport(error=exc.message)


OURS_FILTER = {"label": [LABEL_RUN_ID]}
"""The engines' list and event filter for the node's containers."""


class EngineCalls(ABC):
    """What an adapter supplies: its blocking SDK calls, each run on the pool under the
    seam (`EngineSeam`) by `EngineRuntime` or one of its helpers. Declarations only."""

    @abstractmethod
    def _connect(self, settings: NodeSettings) -> Any:
        """The SDK's client, built without asking the engine anything: the node must
        start, and say "unreachable", while the engine is down."""

    @abstractmethod
    def _engine_options(self, spec: ContainerSpec) -> dict[str, Any]:
        """The create() arguments this SDK spells its own way (mounts, CPUs, cards...)."""

    # Each may raise the table's ``not_found``: the verbs above make that "missing".
    @abstractmethod
    def _inspect(self, ref: str) -> ContainerState: ...
    @abstractmethod
    def _document(self, ref: str) -> Mapping[str, Any]:
        """The engine's inspect document of the container, as the engine wrote it."""

    @abstractmethod
    def _stats(self, ref: str) -> Mapping[str, Any]:
        """One ``/containers/{ref}/stats`` document, taken once (no stream)."""

    @abstractmethod
    def _log_entries(self, ref: str, tail: int, since: datetime | None) -> Iterator[bytes]:
        """The last ``tail`` log entries (``TIMESTAMP text``, a long line in pieces)."""

    @abstractmethod
    def _open_follow(self, ref: str, params: Mapping[str, int | float]) -> Any:
        """The streamed HTTP response of ``/containers/{ref}/logs`` with these parameters,
        its status checked; its headers within the deadline, its reads unbounded."""

    @abstractmethod
    def _kill(self, ref: str, signal: str) -> None: ...
    @abstractmethod
    def _remove(self, name: str) -> None: ...
    @abstractmethod
    def _list_brief(self) -> list[Brief]: ...
    @abstractmethod
    def _version(self) -> str: ...
    @abstractmethod
    def _inspect_image(self, image: str) -> Mapping[str, Any]: ...  # docker's shape

    @abstractmethod
    def _open_pull(self, image: str, headers: Mapping[str, str]) -> PullStream: ...

    @abstractmethod
    def _open_events(self) -> tuple[Events, Callable[[], None]]: ...
    @abstractmethod
    def _close_client(self) -> None: ...

    @abstractmethod
    def _create(self, spec: ContainerSpec) -> Any:
        """Create (not start) the container from `create_options`; the SDK's object.
        The one create: `EngineRuntime.run` readies the jobs' parent before it."""

    @abstractmethod
    def _remaps_users(self) -> bool: ...
    @abstractmethod
    def _local(self) -> bool:
        """Whether the engine runs on this machine: its address is a unix socket."""

    # The store's calls (each as `StoreCalls` says it), and what the engine's info says.
    @abstractmethod
    def _data_root(self) -> str: ...
    @abstractmethod
    def _storage_status(self) -> object: ...
    @abstractmethod
    def _image_entries(self) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]: ...
    @abstractmethod
    def _remove_image_ref(self, ref: str) -> None: ...

    @abstractmethod
    def _engine_dirs(self) -> list[str]:
        """The engine's own directories as its info gives them (data root, run root)."""

    @abstractmethod
    def _cgroup_driver(self) -> str:
        """The engine's cgroup driver, as its info says: ``cgroupfs`` or ``systemd``."""

    @abstractmethod
    def _isolation_support(self) -> facts.IsolationSupport:
        """The engine's info read for its runtimes and namespaces."""

    @property
    @abstractmethod
    def egress(self) -> EgressRule:
        """The node's egress rule on this engine."""


class EngineRuntime(EngineCalls):
    """A ContainerRuntime and EngineFeed over a synchronous engine SDK: its verbs over
    the adapter's calls, with helpers composed around one seam (the store's, the mounts',
    the jobs' parent's, the processes', the isolation's), each made with the functions
    it needs, as Nomad's docker driver makes its dangling reconciler."""

    name: str
    errors: ErrorTable

    def __init_subclass__(cls, *, errors: ErrorTable | None = None, **options: Any) -> None:
        """``class DockerRuntime(EngineRuntime, errors=ERRORS)``: the table names the engine."""
        super().__init_subclass__(**options)
        if errors is not None:
            cls.errors, cls.name = errors, errors.engine

    def __init__(
        self,
        settings: NodeSettings,
        *,
        pool: BlockingPool | None = None,
        telemetry: Telemetry = NO_TELEMETRY,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.settings = settings
        self.clock = clock  # a stop's grace, a pull's deadlines
        threads = settings.runtime_threads
        self.pool = pool or BlockingPool(threads, name=self.name, telemetry=telemetry)
        # HTTP connections the SDK keeps: one per pool thread, plus the state cache's
        # event stream and the inspect its thread makes after each event.
        self.http_connections = settings.runtime_threads + 2
        self.deadline_s = settings.local_api_timeout + 1
        self.client = self._connect(settings)
        self.seam = EngineSeam(
            self.errors,
            self.pool,
            deadline_s=self.deadline_s,
            document=self._document,
            local=self._local,
        )
        self._compose()

    def _compose(self) -> None:
        """The helpers, each with the seam and the adapter's calls it makes."""
        seam = self.seam
        calls = StoreCalls(
            self._data_root, self._storage_status, self._image_entries, self._remove_image_ref
        )
        self.images = EngineImages(seam, calls)
        self.mounts = EngineMounts(seam, self._engine_dirs)
        self.jobs_parent = EngineParent(seam, self.settings, self._cgroup_driver)
        self.processes = EngineProcesses(seam)
        self.isolation = EngineIsolation(seam, self._isolation_support)
        self.usage_reader = EngineUsage(seam, self._stats)

    def create_options(self, spec: ContainerSpec) -> dict[str, Any]:
        """The SDK's create() arguments: the common ones and the engine's own. The
        container sees the cards it was handed and no other, whatever the host's default
        runtime would show it."""
        options = common_options(spec)
        options["environment"][DEVICES_ENV] = format_gpus(self.handed_cards(spec)) or "void"
        if (parent := self.jobs_parent.parent) is not None:
            options["cgroup_parent"] = parent.engine_form
        return {**options, **self._engine_options(spec), **self.images.disk_bound(spec)}

    def handed_cards(self, spec: ContainerSpec) -> tuple[int, ...]:
        """The cards the container is given as devices; none without passthrough (the
        label still names them)."""
        return spec.gpus if self.settings.local_gpu_passthrough else ()

    on_change = tells_no_changes  # the ContainerRuntime verbs; the state cache tells changes

    async def start(self) -> None:
        return None  # nothing to fill: every read asks the engine

    status = cache_generation = no_cache  # no cache: every read asks the engine

    async def run(self, spec: ContainerSpec) -> str:
        return await self.seam.call(f"run {spec.name}", self._run, spec)

    def _run(self, spec: ContainerSpec) -> str:
        self.jobs_parent.ready()
        container = self._create(spec)
        try:
            hold_host_job(spec, self.jobs_parent.parent, self.egress)
            container.start()
        except Exception:
            # A created container carries GPU labels: left behind, it holds cards forever.
            self.seam.or_missing(None, self._remove, spec.name)
            raise
        return str(container.id)

    async def inspect(self, name: str) -> ContainerState:
        return await self.seam.call(f"inspect {name}", self._by_name, name, read=True)

    inspect_fresh = inspect  # every inspect asks the engine

    async def inspect_many(self, names: Sequence[str]) -> list[ContainerState]:
        return [await self.inspect(name) for name in names]

    def _by_name(self, name: str) -> ContainerState:
        """Exactly this name: an engine would answer a full id or an id prefix first."""
        state = self._inspect_or_missing(name)
        return state if state.name == name else ContainerState.missing(name)

    def _inspect_or_missing(self, ref: str) -> ContainerState:
        return self.seam.or_missing(ContainerState.missing(ref), self._inspect, ref)

    async def logs(self, ref: str, query: LogQuery) -> LogText | None:
        action = f"read the logs of {ref}"
        return await self.seam.call_or(action, None, self._read_logs, ref, query, read=True)

    def _read_logs(self, ref: str, query: LogQuery) -> LogText:
        """The last ``tail`` lines, streamed through a `LogFold`.

        Engines count entries, not lines: a line longer than 16 KiB is several. So a read
        asks for one entry more than lines (the first may begin mid-line), and when long
        lines leave fewer whole lines than asked, asks again for eight times as many,
        until it reaches the start of the log.
        """
        wanted = query.tail + 1
        while True:
            fold = LogFold(keep=query.tail, max_bytes=query.max_bytes)
            for entry in self._log_entries(ref, wanted, query.since):
                fold.add(entry)
            whole = fold.entries < wanted  # the read reached the log's start (or `since`)
            if whole or fold.complete > query.tail:
                return fold.text(skip_first=not whole)
            wanted *= 8

    async def follow_logs(self, ref: str, query: LogQuery) -> LogStream | None:
        relay = LogRelay(engine=self.name)
        params = fmt.follow_params(query.tail, query.since)
        read = functools.partial(self._follow, ref, params)
        return relay if await relay.start(self.pool, read, deadline_s=self.deadline_s) else None

    def _follow(self, ref: str, params: Mapping[str, int | float], relay: LogRelay) -> None:
        """On a pool thread: open the stream, then hand its text on until it ends (the
        container stopped) or the relay is closed (its socket shut under this read)."""
        action = f"follow the logs of {ref}"
        response = self.seam.guarded(
            action, self.seam.or_missing, None, self._open_follow, ref, params
        )
        if not relay.attach(response):
            if response is not None:
                response.close()
            return
        try:
            unbound_reads(response)
            pieces = fmt.log_pieces(response.raw.read, piece=relay.limit)
            for piece in self.seam.translated(pieces, action=action):
                if not relay.put(piece):
                    return
        finally:
            response.close()  # here, by the reading thread only (see `logstream`)

    async def kill(self, ref: str, signal: str) -> bool:
        return await self.seam.call_or(f"signal {ref}", False, self._quiet_kill, ref, signal)

    def _quiet_kill(self, ref: str, signal: str) -> bool:
        try:
            self._kill(ref, signal)
        except self.errors.api_error as exc:
            if self.errors.ended(exc):  # the job ended before the signal reached it
                return False
            raise
        return True

    async def wait_exited(self, name: str, timeout: float) -> bool:
        """Polls (each look a short call on the pool): this runtime keeps no events."""
        deadline = self.clock.monotonic() + timeout
        while (await self.inspect(name)).status in RUNNING:
            remaining = deadline - self.clock.monotonic()
            if remaining <= 0:
                return False
            await self.clock.sleep(min(POLL_S, remaining))
        return True

    async def remove(self, name: str) -> None:
        await self.seam.call_or(f"remove {name}", None, self._remove, name)

    async def ps(self) -> list[ContainerState]:
        return await self.seam.call("list containers", self._ps, read=True)

    def _ps(self) -> list[ContainerState]:
        states = (self._inspect_or_missing(brief.id) for brief in self._list_brief())
        # A container removed between the list and its inspect is simply gone.
        return [state for state in states if state.exists]

    async def health(self) -> RuntimeHealth:
        try:
            version = await self.seam.call("report its version", self._version, read=True)
        except NodeError as exc:
            return RuntimeHealth(ok=False, engine=self.name, error=exc.message)
        return RuntimeHealth(ok=True, engine=self.name, version=version)

    @abstractmethod
    async def device_support(self) -> DeviceSupport: ...  # `asked_support`

    async def remaps_users(self) -> bool:
        """Whether a job's uid 0 is another on the host (userns-remap, rootless podman)."""
        return await self.seam.call("report its security options", self._remaps_users, read=True)

    @abstractmethod
    def _remaps_users(self) -> bool: ...

    async def image_exists(self, image: str) -> bool:
        return await self.image_info(image) is not None

    async def image_info(self, image: str) -> ImageInfo | None:
        doc = await self.seam.call_or(
            f"inspect image {image}", None, self._inspect_image, image, read=True
        )
        return fmt.image_named(image, doc)

    async def pull(
        self,
        image: str,
        *,
        limits: PullLimits,
        on_progress: ProgressCallback | None = None,
        auth: RegistryAuth | None = None,
    ) -> None:
        """Stream the pull (deadlines and cancel in `drive_pull`); done = image present."""
        action = f"pull {image}"
        headers = pull_headers(image, auth)
        await drive_pull(
            self.pool,
            engine=self.name,
            image=image,
            open_stream=lambda: self.seam.guarded(action, self._open_translated, image, headers),
            limits=limits,
            on_progress=on_progress,
            clock=self.clock,
            auth=auth,
        )
        if not await self.image_exists(image):
            reason = "the stream ended without the image"
            raise EngineRefused(engine=self.name, action=action, reason=reason)

    def _open_translated(self, image: str, headers: Mapping[str, str]) -> PullStream:
        messages, response = self._open_pull(image, headers)
        return self.seam.translated(messages, action=f"pull {image}"), response

    async def usage(self, refs: Sequence[str]) -> dict[str, Usage]:
        return await self.usage_reader.usage(refs)

    # --- the helpers' verbs ---------------------------------------------------------------

    async def data_root(self) -> facts.DataRoot | None:
        return await self.images.data_root()

    async def disk_usage(self, ref: str, *, budget_s: float) -> facts.DiskUse | None:
        return await self.images.disk_usage(ref, budget_s=budget_s)

    async def list_images(self) -> list[facts.EngineImage]:
        return await self.images.list_images()

    async def remove_image(self, image: facts.EngineImage) -> bool:
        return await self.images.remove_image(image)

    async def mount_support(self) -> facts.MountSupport:
        return await self.mounts.support()

    async def cgroup_parent(self) -> ParentReport:
        return await self.jobs_parent.report()

    def holders_of(self, pids: Collection[int]) -> dict[int, str | None]:
        return self.processes.holders_of(pids)

    async def catches(self, ref: str, signal: str) -> bool | None:
        return await self.processes.catches(ref, signal)

    async def isolation_support(self) -> facts.IsolationSupport:
        return await self.isolation.support()

    async def close(self) -> None:
        self.pool.close()
        self._close_client()

    # --- the EngineFeed calls (blocking: on the pool or the cache's event thread) ------

    def list_brief(self) -> list[Brief]:
        return self.seam.guarded("list containers", self._list_brief, read=True)

    def inspect_now(self, ref: str) -> ContainerState:
        return self.seam.guarded(f"inspect {ref}", self._inspect_or_missing, ref, read=True)

    def open_events(self) -> tuple[Events, Callable[[], None]]:
        events, close = self.seam.guarded("stream events", self._open_events)
        return self.seam.translated(events, action="stream events"), close
