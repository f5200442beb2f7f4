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

from tuneplane_node.errors import (
    NodeError,
    RuntimeFailure,
    RuntimeUnavailable,
)
from tuneplane_node.runtime.base import (
    LABEL_RUN_ID,
    BlockingPool,
    ContainerSpec,
    ContainerState,
    job_labels,
    pull_params,
)
from tuneplane_node.runtime.cache import Brief, brief_from_list, event_from_docker
from tuneplane_node.runtime.engine import (
    EngineRuntime,
    Events,
    describe,
    pool_size,
    refused,
    state_from_inspect,
)
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
        reason = str(exc.explanation or exc)
        return refused(ENGINE, action=action, status=exc.status_code, reason=reason)
    return RuntimeFailure(engine=ENGINE, action=action, reason=describe(exc))


_OURS = {"label": [LABEL_RUN_ID]}


class DockerRuntime(EngineRuntime):
    """The ContainerRuntime of a Docker engine."""

    name = ENGINE

    def __init__(self, settings: NodeSettings, *, pool: BlockingPool | None = None) -> None:
        super().__init__(settings, pool=pool)
        self.client = self._client(settings)
        self.api = self.client.api

    @staticmethod
    def _client(settings: NodeSettings) -> docker.DockerClient:
        options: dict[str, Any] = {
            "timeout": math.ceil(settings.local_api_timeout),
            "max_pool_size": pool_size(settings),
            "version": API_VERSION,
        }
        if settings.docker_host:
            return docker.DockerClient(base_url=settings.docker_host, **options)
        return docker.from_env(**options)

    def translate(self, exc: BaseException, *, action: str) -> NodeError:
        return translate(exc, action=action)

    def _create(self, spec: ContainerSpec) -> Any:
        return self.client.containers.create(**self.create_options(spec))

    def create_options(self, spec: ContainerSpec) -> dict[str, Any]:
        """The SDK's create() arguments for a spec: entrypoint replaced, no auto-remove."""
        options: dict[str, Any] = {
            "image": spec.image,
            "name": spec.name,
            "environment": dict(spec.env),
            "labels": job_labels(spec),
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

    def _inspect(self, ref: str) -> ContainerState:
        try:
            return state_from_inspect(self.api.inspect_container(ref))
        except docker.errors.NotFound:
            return ContainerState.missing(ref)

    def _logs(self, name: str, tail_lines: int) -> str:
        try:
            raw = self.api.logs(name, stdout=True, stderr=True, timestamps=True, tail=tail_lines)
        except docker.errors.NotFound:
            return f"no logs: container {name} does not exist"
        except docker.errors.APIError as exc:
            return f"no logs for {name}: {exc.explanation or exc}"
        return bytes(raw).decode("utf-8", errors="replace")

    def _stop(self, name: str, timeout: float) -> None:
        try:
            # docker-py widens its HTTP timeout by the stop timeout itself.
            self.api.stop(name, timeout=math.ceil(timeout))
        except docker.errors.NotFound:
            log.debug("stop %s: no such container, nothing to do", name)

    def _remove(self, name: str) -> None:
        try:
            self.api.remove_container(name, force=True, v=True)
        except docker.errors.NotFound:
            log.debug("remove %s: no such container, nothing to do", name)
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and "in progress" in str(exc.explanation):
                return  # someone else is removing it: the goal is met
            raise

    def _list_brief(self) -> list[Brief]:
        listed = self.api.containers(all=True, filters=_OURS)
        return [brief_from_list(entry) for entry in listed]

    def _open_events(self) -> tuple[Events, Callable[[], None]]:
        stream = self.api.events(decode=True, filters={"type": "container", **_OURS})
        return self._event_pairs(stream), stream.close

    @staticmethod
    def _event_pairs(stream: Iterable[Mapping[str, Any]]) -> Events:
        return (event_from_docker(event) for event in stream)

    def _version(self) -> str:
        return str(self.api.version().get("Version"))

    def _image_exists(self, image: str) -> bool:
        try:
            self.api.inspect_image(image)
        except docker.errors.NotFound:  # ImageNotFound is a NotFound
            return False
        return True

    def _open_pull(self, image: str) -> tuple[Iterator[Mapping[str, Any]], Any]:
        # The public pull() hides the HTTP response, and a cancel needs it to close the
        # socket under the reading thread; these private helpers are what pull() uses.
        response = self.api._post(
            self.api._url("/images/create"), params=pull_params(image), stream=True, timeout=None
        )
        self.api._raise_for_status(response)
        return self.api._stream_helper(response, decode=True), response

    def _close_client(self) -> None:
        self.client.close()
