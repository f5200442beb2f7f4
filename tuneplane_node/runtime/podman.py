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
    close_http_stream,
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
        reason = str(exc.explanation or exc)
        return refused(ENGINE, action=action, status=exc.status_code, reason=reason)
    return RuntimeFailure(engine=ENGINE, action=action, reason=describe(exc))


class PodmanRuntime(EngineRuntime):
    """The ContainerRuntime of a podman API service."""

    name = ENGINE

    def __init__(self, settings: NodeSettings, *, pool: BlockingPool | None = None) -> None:
        super().__init__(settings, pool=pool)
        self.client = podman.PodmanClient(
            base_url=settings.podman_url,
            timeout=math.ceil(settings.local_api_timeout),
            max_pool_size=pool_size(settings),
        )
        self.api = self.client.api
        # A stream waits for the engine as long as it takes (deadlines are ours); podman-py
        # reads None as "the client default", so say it with a (connect, read) pair.
        self._streaming = (settings.local_api_timeout, None)

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

    def _inspect(self, ref: str) -> ContainerState:
        try:
            return state_from_inspect(self.client.containers.get(ref).attrs, statuses=_STATUS)
        except podman.errors.NotFound:
            return ContainerState.missing(ref)

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

    def _stop(self, name: str, timeout: float) -> None:
        try:
            self.client.containers.get(name).stop(timeout=math.ceil(timeout))
        except podman.errors.NotFound:
            log.debug("stop %s: no such container, nothing to do", name)

    def _remove(self, name: str) -> None:
        try:
            self.client.containers.remove(name, force=True, v=True)
        except podman.errors.NotFound:
            log.debug("remove %s: no such container, nothing to do", name)

    # The docker-compatible endpoints below: their list, event and pull shapes are docker's.

    def _list_brief(self) -> list[Brief]:
        params = {"all": "true", "filters": json.dumps(_OURS)}
        response = self.api.get("/containers/json", params=params, compatible=True)
        response.raise_for_status()
        return [brief_from_list(entry) for entry in response.json()]

    def _open_events(self) -> tuple[Events, Callable[[], None]]:
        # podman 4 ignores a bare label key in an event filter: filter on our side.
        params = {"filters": json.dumps({"type": ["container"]})}
        response = self.api.get(
            "/events", params=params, stream=True, timeout=self._streaming, compatible=True
        )
        response.raise_for_status()
        return self._event_pairs(response), lambda: close_http_stream(response)

    @staticmethod
    def _event_pairs(response: Any) -> Events:
        for event in _json_lines(response):
            actor = event.get("Actor") or {}
            if LABEL_RUN_ID in (actor.get("Attributes") or {}):
                yield event_from_docker(event)

    def _version(self) -> str:
        return str(self.client.version().get("Version"))  # type: ignore[no-untyped-call]

    def _image_exists(self, image: str) -> bool:
        return bool(self.client.images.exists(image))

    def _open_pull(self, image: str) -> tuple[Iterator[Mapping[str, Any]], Any]:
        # libpod's own pull (before podman 5) reports bare text lines, no layers.
        response = self.api.post(
            "/images/create",
            params=pull_params(image),
            stream=True,
            timeout=self._streaming,
            compatible=True,
        )
        response.raise_for_status()
        return _json_lines(response), response

    def _close_client(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]  # podman-py is untyped here


def _json_lines(response: Any) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line:
            yield json.loads(line)
