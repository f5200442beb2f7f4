"""DockerRuntime: job containers on a Docker engine. The only module that imports `docker`.

Every SDK call runs on the runtime's one `BlockingPool`, and the SDK's HTTP connection
pool is sized to match it, so parallel calls neither block the loop nor queue on sockets.
SDK errors are translated here, in `translate`, with the cause chained.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import docker
import docker.errors
import docker.types
import requests.exceptions
import urllib3.exceptions

from tuneplane_node.errors import NodeError, RuntimeFailure, RuntimeUnavailable
from tuneplane_node.runtime.base import (
    LABEL_GPUS,
    LABEL_RUN_ID,
    BlockingPool,
    ContainerSpec,
    ContainerState,
    ProgressCallback,
    RuntimeHealth,
    drive_pull,
    format_gpus,
    iso,
    parse_time,
    pull_params,
)
from tuneplane_node.runtime.cache import Brief, brief_from_list
from tuneplane_node.settings import NodeSettings

log = logging.getLogger(__name__)
T = TypeVar("T")
ENGINE = "docker"
# The oldest engine we support (20.10). Pinned so that building the client asks the
# engine nothing: a daemon must start, and say "unreachable", while the engine is down.
API_VERSION = "1.41"
_UNREACHABLE = (
    requests.exceptions.ConnectionError,
    requests.exceptions.Timeout,
    urllib3.exceptions.HTTPError,
    ConnectionError,
    FileNotFoundError,
    TimeoutError,
)


def translate(exc: BaseException, *, action: str) -> NodeError:
    """The node's error for an SDK (or transport) exception: unreachable, or refused."""
    if isinstance(exc, NodeError):
        return exc
    if isinstance(exc, _UNREACHABLE):
        return RuntimeUnavailable(engine=ENGINE, reason=str(exc) or type(exc).__name__)
    if isinstance(exc, docker.errors.APIError):
        reason = exc.explanation or str(exc)
        return RuntimeFailure(engine=ENGINE, action=action, reason=str(reason))
    return RuntimeFailure(engine=ENGINE, action=action, reason=describe(exc))


def describe(exc: BaseException) -> str:
    """``Type: message``, even for SDK exceptions whose __str__ itself fails."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return type(exc).__name__


_OURS = {"label": [LABEL_RUN_ID]}


def state_from_inspect(data: Mapping[str, Any]) -> ContainerState:
    """ContainerState from an engine inspect document (docker's, or podman's compat one)."""
    state = data.get("State") or {}
    status = str(state.get("Status", "")).lower()
    config = data.get("Config") or {}
    return ContainerState(
        name=str(data.get("Name", "")).lstrip("/"),
        exists=True,
        status=status,
        # An exit code means something only once the process has exited.
        exit_code=int(state.get("ExitCode", 0)) if status in ("exited", "dead") else None,
        labels=dict(config.get("Labels") or {}),
        created_at=iso(parse_time(data.get("Created"))),
        started_at=iso(parse_time(state.get("StartedAt"))),
        finished_at=iso(parse_time(state.get("FinishedAt"))),
        oom_killed=bool(state.get("OOMKilled")),
        id=data.get("Id"),
    )


class DockerRuntime:
    """The ContainerRuntime of a Docker engine."""

    name = ENGINE

    def __init__(self, settings: NodeSettings, *, pool: BlockingPool | None = None) -> None:
        self.settings = settings
        self.pool = pool or BlockingPool(settings.runtime_threads, name="docker")
        self.client = self._client(settings)
        self.api = self.client.api

    @staticmethod
    def _client(settings: NodeSettings) -> docker.DockerClient:
        options: dict[str, Any] = {
            "timeout": math.ceil(settings.local_api_timeout),
            "max_pool_size": settings.runtime_threads,
            "version": API_VERSION,
        }
        if settings.docker_host:
            return docker.DockerClient(base_url=settings.docker_host, **options)
        return docker.from_env(**options)

    async def _call(self, action: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await self.pool.call(self._guarded, action, fn, *args, **kwargs)

    @staticmethod
    def _guarded(action: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise translate(exc, action=action) from exc

    async def run(self, spec: ContainerSpec) -> str:
        return await self._call(f"run {spec.name}", self._run, spec)

    def _run(self, spec: ContainerSpec) -> str:
        container = self.client.containers.create(**self.create_options(spec))
        try:
            container.start()
        except Exception:
            # A created container carries GPU labels: left behind, it holds cards forever.
            self._remove(spec.name)
            raise
        return str(container.id)

    def create_options(self, spec: ContainerSpec) -> dict[str, Any]:
        """The SDK's create() arguments for a spec: entrypoint replaced, no auto-remove."""
        options: dict[str, Any] = {
            "image": spec.image,
            "name": spec.name,
            "environment": dict(spec.env),
            "labels": {**spec.labels, LABEL_GPUS: format_gpus(spec.gpus)},
            "network_mode": spec.network,
            "stop_signal": "SIGTERM",
            "detach": True,
            "mounts": [
                docker.types.Mount(m.container, m.host, type="bind", read_only=m.read_only)
                for m in spec.mounts
            ],
        }
        if spec.command:
            options["entrypoint"] = [spec.command[0]]
            options["command"] = list(spec.command[1:])
        optional = {
            "working_dir": spec.workdir,
            "user": spec.user,
            "shm_size": spec.shm_size,
            "mem_limit": spec.memory_limit,
            "nano_cpus": int(spec.cpu_limit * 1e9) if spec.cpu_limit else None,
        }
        options.update({key: value for key, value in optional.items() if value is not None})
        if spec.gpus and self.settings.local_gpu_passthrough:
            ids = [str(gpu) for gpu in spec.gpus]
            options["device_requests"] = [
                docker.types.DeviceRequest(device_ids=ids, capabilities=[["gpu"]])
            ]
        return options

    async def inspect(self, name: str) -> ContainerState:
        return await self._call(f"inspect {name}", self._inspect, name)

    def _inspect(self, name: str) -> ContainerState:
        try:
            return state_from_inspect(self.api.inspect_container(name))
        except docker.errors.NotFound:
            return ContainerState.missing(name)

    async def logs(self, name: str, tail_lines: int) -> str:
        return await self._call(f"read the logs of {name}", self._logs, name, tail_lines)

    def _logs(self, name: str, tail_lines: int) -> str:
        try:
            raw = self.api.logs(name, stdout=True, stderr=True, timestamps=True, tail=tail_lines)
        except docker.errors.NotFound:
            return f"no logs: container {name} does not exist"
        except docker.errors.APIError as exc:
            return f"no logs for {name}: {exc.explanation or exc}"
        return bytes(raw).decode("utf-8", errors="replace")

    async def stop(self, name: str, timeout: float) -> None:
        await self._call(f"stop {name}", self._stop, name, timeout)

    def _stop(self, name: str, timeout: float) -> None:
        try:
            # docker-py widens its HTTP timeout by the stop timeout itself.
            self.api.stop(name, timeout=math.ceil(timeout))
        except docker.errors.NotFound:
            log.debug("stop %s: no such container, nothing to do", name)

    async def remove(self, name: str) -> None:
        await self._call(f"remove {name}", self._remove, name)

    def _remove(self, name: str) -> None:
        try:
            self.api.remove_container(name, force=True, v=True)
        except docker.errors.NotFound:
            log.debug("remove %s: no such container, nothing to do", name)
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and "in progress" in str(exc.explanation):
                return  # someone else is removing it: the goal is met
            raise

    async def ps(self) -> list[ContainerState]:
        return await self._call("list containers", self._ps)

    def _ps(self) -> list[ContainerState]:
        listed = self.api.containers(all=True, filters=_OURS)
        states = (self._inspect(entry["Id"]) for entry in listed)
        # A container removed between the list and its inspect is simply gone.
        return [state for state in states if state.exists]

    # --- the state cache's feed (blocking: called on the pool or the event thread) ---

    def list_brief(self) -> list[Brief]:
        listed = self._guarded("list containers", self.api.containers, all=True, filters=_OURS)
        return [brief_from_list(entry) for entry in listed]

    def inspect_now(self, ref: str) -> ContainerState:
        return self._guarded(f"inspect {ref}", self._inspect, ref)

    def open_events(self) -> tuple[Iterator[tuple[str, str]], Callable[[], None]]:
        stream = self._guarded(
            "stream events", self.api.events, decode=True, filters={"type": "container", **_OURS}
        )
        return self._event_pairs(stream), stream.close

    def _event_pairs(self, stream: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, str]]:
        try:
            for event in stream:
                yield (
                    str(event.get("id") or event.get("Actor", {}).get("ID")),
                    str(event.get("Action") or event.get("status", "")),
                )
        except Exception as exc:
            raise translate(exc, action="stream events") from exc

    async def health(self) -> RuntimeHealth:
        try:
            version = await self._call("report its version", self.api.version)
        except NodeError as exc:
            return RuntimeHealth(ok=False, engine=ENGINE, error=exc.message)
        return RuntimeHealth(ok=True, engine=ENGINE, version=str(version.get("Version")))

    async def image_exists(self, image: str) -> bool:
        return await self._call(f"inspect image {image}", self._image_exists, image)

    def _image_exists(self, image: str) -> bool:
        try:
            self.api.inspect_image(image)
        except docker.errors.NotFound:  # ImageNotFound is a NotFound
            return False
        return True

    async def pull(
        self,
        image: str,
        *,
        timeout: float,
        stall_timeout: float,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        await drive_pull(
            self.pool,
            engine=ENGINE,
            image=image,
            open_stream=lambda: self._guarded(f"pull {image}", self._open_pull, image),
            timeout=timeout,
            stall_timeout=stall_timeout,
            on_progress=on_progress,
        )
        if not await self.image_exists(image):
            raise RuntimeFailure(
                engine=ENGINE, action=f"pull {image}", reason="the stream ended without the image"
            )

    def _open_pull(self, image: str) -> tuple[Iterator[Mapping[str, Any]], Any]:
        # The public pull() hides the HTTP response, and a cancel needs it to close the
        # socket under the reading thread; these private helpers are what pull() uses.
        response = self.api._post(
            self.api._url("/images/create"), params=pull_params(image), stream=True, timeout=None
        )
        self.api._raise_for_status(response)
        messages = self.api._stream_helper(response, decode=True)
        return self._translated(messages, image), response

    def _translated(
        self, messages: Iterator[Mapping[str, Any]], image: str
    ) -> Iterator[Mapping[str, Any]]:
        try:
            yield from messages
        except Exception as exc:
            raise translate(exc, action=f"pull {image}") from exc

    async def close(self) -> None:
        self.pool.close()
        self.client.close()
