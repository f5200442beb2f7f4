"""PodmanRuntime: job containers on the podman API service. The only module that imports `podman`.

Same semantics as DockerRuntime. GPUs are CDI devices (``nvidia.com/gpu=N``); pulls ask
libpod for the docker-compatible progress stream so bytes are reported. SDK errors are
translated here, in `translate`.
"""

from __future__ import annotations

import json
import logging
import math
import signal
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import podman
import podman.errors
import requests.exceptions

from tuneplane_node.errors import NodeError, RuntimeFailure, RuntimeUnavailable
from tuneplane_node.runtime.base import (
    LABEL_GPUS,
    LABEL_RUN_ID,
    BlockingPool,
    ContainerSpec,
    ContainerState,
    ProgressCallback,
    RuntimeHealth,
    close_http_stream,
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
ENGINE = "podman"
CPU_PERIOD_US = 100_000
# libpod's own words for the states docker calls created and exited.
_OURS = {"label": [LABEL_RUN_ID]}
_STATUS = {"configured": "created", "initialized": "created", "stopped": "exited"}
_UNREACHABLE = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, OSError)


def translate(exc: BaseException, *, action: str) -> NodeError:
    """The node's error for an SDK exception: unreachable, or refused."""
    if isinstance(exc, NodeError):
        return exc
    # podman-py wraps transport failures in an APIError with no response.
    cause = exc.__cause__ if isinstance(exc, podman.errors.APIError) else exc
    if isinstance(cause, _UNREACHABLE) or (
        isinstance(exc, podman.errors.APIError) and exc.response is None
    ):
        return RuntimeUnavailable(engine=ENGINE, reason=str(cause or exc) or type(exc).__name__)
    if isinstance(exc, podman.errors.APIError):
        reason = exc.explanation or str(exc)
        return RuntimeFailure(engine=ENGINE, action=action, reason=str(reason))
    return RuntimeFailure(engine=ENGINE, action=action, reason=describe(exc))


def describe(exc: BaseException) -> str:
    """``Type: message``, even for SDK exceptions whose __str__ itself fails."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:
        return type(exc).__name__


def state_from_inspect(data: Mapping[str, Any]) -> ContainerState:
    """ContainerState from libpod's inspect document."""
    state = data.get("State") or {}
    raw = str(state.get("Status", "")).lower()
    status = _STATUS.get(raw, raw)
    config = data.get("Config") or {}
    return ContainerState(
        name=str(data.get("Name", "")).lstrip("/"),
        exists=True,
        status=status,
        exit_code=int(state.get("ExitCode", 0)) if status in ("exited", "dead") else None,
        labels=dict(config.get("Labels") or {}),
        created_at=iso(parse_time(data.get("Created"))),
        started_at=iso(parse_time(state.get("StartedAt"))),
        finished_at=iso(parse_time(state.get("FinishedAt"))),
        oom_killed=bool(state.get("OOMKilled")),
        id=data.get("Id"),
    )


class PodmanRuntime:
    """The ContainerRuntime of a podman API service."""

    name = ENGINE

    def __init__(self, settings: NodeSettings, *, pool: BlockingPool | None = None) -> None:
        self.settings = settings
        self.pool = pool or BlockingPool(settings.runtime_threads, name="podman")
        self.client = podman.PodmanClient(
            base_url=settings.podman_url,
            timeout=math.ceil(settings.local_api_timeout),
            max_pool_size=settings.runtime_threads,
        )
        self.api = self.client.api
        # A stream waits for the engine as long as it takes (deadlines are ours); podman-py
        # reads None as "the client default", so say it with a (connect, read) pair.
        self._streaming = (settings.local_api_timeout, None)

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
            "stop_signal": int(signal.SIGTERM),  # libpod wants the number
            "mounts": [
                {"type": "bind", "source": m.host, "target": m.container, "read_only": m.read_only}
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
        }
        options.update({key: value for key, value in optional.items() if value is not None})
        if spec.cpu_limit:
            # podman-py ignores nano_cpus; a CFS quota says the same thing.
            options["cpu_period"] = CPU_PERIOD_US
            options["cpu_quota"] = int(spec.cpu_limit * CPU_PERIOD_US)
        if spec.gpus and self.settings.local_gpu_passthrough:
            options["devices"] = [f"nvidia.com/gpu={gpu}" for gpu in spec.gpus]
        return options

    async def inspect(self, name: str) -> ContainerState:
        return await self._call(f"inspect {name}", self._inspect, name)

    def _inspect(self, name: str) -> ContainerState:
        try:
            return state_from_inspect(self.client.containers.get(name).attrs)
        except podman.errors.NotFound:
            return ContainerState.missing(name)

    async def logs(self, name: str, tail_lines: int) -> str:
        return await self._call(f"read the logs of {name}", self._logs, name, tail_lines)

    def _logs(self, name: str, tail_lines: int) -> str:
        try:
            container = self.client.containers.get(name)
            raw = container.logs(stdout=True, stderr=True, timestamps=True, tail=tail_lines)
        except podman.errors.NotFound:
            return f"no logs: container {name} does not exist"
        except podman.errors.APIError as exc:
            if exc.response is None:
                raise
            return f"no logs for {name}: {exc.explanation or exc}"
        chunks = raw if isinstance(raw, bytes) else b"".join(raw)
        return chunks.decode("utf-8", errors="replace")

    async def stop(self, name: str, timeout: float) -> None:
        await self._call(f"stop {name}", self._stop, name, timeout)

    def _stop(self, name: str, timeout: float) -> None:
        try:
            self.client.containers.get(name).stop(timeout=math.ceil(timeout))
        except podman.errors.NotFound:
            log.debug("stop %s: no such container, nothing to do", name)

    async def remove(self, name: str) -> None:
        await self._call(f"remove {name}", self._remove, name)

    def _remove(self, name: str) -> None:
        try:
            self.client.containers.remove(name, force=True, v=True)
        except podman.errors.NotFound:
            log.debug("remove %s: no such container, nothing to do", name)

    async def ps(self) -> list[ContainerState]:
        return await self._call("list containers", self._ps)

    def _ps(self) -> list[ContainerState]:
        listed = self.client.containers.list(all=True, filters={"label": LABEL_RUN_ID})
        states = (self._inspect(str(container.id)) for container in listed)
        return [state for state in states if state.exists]

    # --- the state cache's feed (blocking: called on the pool or the event thread) ---
    # The docker-compatible endpoints: their list and event shapes are docker's.

    def list_brief(self) -> list[Brief]:
        return self._guarded("list containers", self._list_brief)

    def _list_brief(self) -> list[Brief]:
        params = {"all": "true", "filters": json.dumps(_OURS)}
        response = self.api.get("/containers/json", params=params, compatible=True)
        response.raise_for_status()
        return [brief_from_list(entry) for entry in response.json()]

    def inspect_now(self, ref: str) -> ContainerState:
        return self._guarded(f"inspect {ref}", self._inspect, ref)

    def open_events(self) -> tuple[Iterator[tuple[str, str]], Callable[[], None]]:
        return self._guarded("stream events", self._open_events)

    def _open_events(self) -> tuple[Iterator[tuple[str, str]], Callable[[], None]]:
        # podman 4 ignores a bare label key in an event filter: filter on our side.
        params = {"filters": json.dumps({"type": ["container"]})}
        response = self.api.get(
            "/events", params=params, stream=True, timeout=self._streaming, compatible=True
        )
        response.raise_for_status()
        return self._event_pairs(response), lambda: close_http_stream(response)

    def _event_pairs(self, response: Any) -> Iterator[tuple[str, str]]:
        try:
            for line in response.iter_lines():
                if line:
                    event = json.loads(line)
                    actor = event.get("Actor") or {}
                    if LABEL_RUN_ID in (actor.get("Attributes") or {}):
                        yield str(event.get("id") or actor.get("ID")), str(event.get("Action", ""))
        except Exception as exc:
            raise translate(exc, action="stream events") from exc

    async def health(self) -> RuntimeHealth:
        try:
            version = await self._call("report its version", self.client.version)
        except NodeError as exc:
            return RuntimeHealth(ok=False, engine=ENGINE, error=exc.message)
        return RuntimeHealth(ok=True, engine=ENGINE, version=str(version.get("Version")))

    async def image_exists(self, image: str) -> bool:
        return await self._call(f"inspect image {image}", self.client.images.exists, image)

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
        # The docker-compatible endpoint reports per-layer progress; libpod's own pull
        # (before podman 5) reports bare text lines only.
        response = self.api.post(
            "/images/create",
            params=pull_params(image),
            stream=True,
            timeout=self._streaming,
            compatible=True,
        )
        response.raise_for_status()
        return self._messages(response, image), response

    def _messages(self, response: Any, image: str) -> Iterator[Mapping[str, Any]]:
        try:
            for line in response.iter_lines():
                if line:
                    yield json.loads(line)
        except Exception as exc:
            raise translate(exc, action=f"pull {image}") from exc

    async def close(self) -> None:
        self.pool.close()
        self.client.close()  # type: ignore[no-untyped-call]  # podman-py is untyped here
