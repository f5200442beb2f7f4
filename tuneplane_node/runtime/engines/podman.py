"""PodmanRuntime: job containers on the podman API service. The only module that imports `podman`.

What differs from docker: mounts as plain dicts, the stop signal by number, a CFS quota
for the CPU limit, GPUs as CDI devices (``nvidia.com/gpu=N``), and list, events and
pulls through the docker-compatible endpoints (their shapes are docker's, and the pull
stream reports bytes). The create's pieces libpod spells its own way are
`runtime.engines.podmanoptions`'; the rest is `EngineRuntime`'s.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import podman
import podman.api
import podman.domain.containers_create
import podman.errors
import requests.exceptions

from tuneplane_node.errors import NodeError, SandboxUnavailable, SpecRefused
from tuneplane_node.runtime.base import Brief, ContainerState
from tuneplane_node.runtime.engines import dockerformat as fmt
from tuneplane_node.runtime.engines import seccomp
from tuneplane_node.runtime.engines.engine import (
    OURS_FILTER,
    EngineRuntime,
    Events,
    asked_support,
)
from tuneplane_node.runtime.engines.handover import hand_over_mounts
from tuneplane_node.runtime.engines.isolation import maps_mount_ids
from tuneplane_node.runtime.engines.networks.egress import EgressRule
from tuneplane_node.runtime.engines.networks.jobnetwork import (
    NODE_NETWORKS,
    configured,
    fabric_checked,
    fabric_network,
    podman_fabric_body,
)
from tuneplane_node.runtime.engines.networks.podmanjobs import (
    JobNetworks,
    PruneLater,
    container_gone,
)
from tuneplane_node.runtime.engines.podmanoptions import confined, engine_options, own_userns
from tuneplane_node.runtime.engines.pulling import PullStream, closed_after
from tuneplane_node.runtime.engines.seam import ErrorTable
from tuneplane_node.runtime.facts import DeviceSupport, IsolationSupport
from tuneplane_node.runtime.labels import LABEL_RUN_ID
from tuneplane_node.runtime.logstream import ONE_USE, opened, shut
from tuneplane_node.runtime.spec import (
    FABRIC,
    Confinement,
    ContainerSpec,
)
from tuneplane_node.settings import Fabric, NodeSettings, local_engine

log = logging.getLogger(__name__)
ENGINE = "podman"
REMOVE_TRIES = 3
"""A forced remove that raced the job's own end is tried again, this many times in all."""
CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
"""Where podman reads CDI specifications (containers.conf's ``cdi_spec_dirs`` default)."""
ERRORS = ErrorTable(
    engine=ENGINE,
    unreachable=(requests.exceptions.ConnectionError, requests.exceptions.Timeout, OSError),
    api_error=podman.errors.APIError,
    not_found=podman.errors.NotFound,
    # libpod's words for a kill of a container that is not running, and for one whose
    # runtime found it stopped as the signal went out ("container state improper:
    # stopped"): a kill, a stop's, a forced remove's, that raced the job's own end.
    stopped=("can only kill running containers", "container state improper"),
)


def _ready_fabric(api: Any, fabric: Fabric) -> None:
    """The fabric's network, made when missing; one of that name that is not the
    settings' is refused (`fabric_checked`), never used."""
    name, json_body = fabric_network(fabric), {"content-type": "application/json"}
    found = api.get(f"/networks/{name}/json")
    if found.status_code == 404:
        body = json.dumps(podman_fabric_body(fabric))
        made = api.post("/networks/create", headers=json_body, data=body)
        if made.status_code != 409:  # 409: another launch made it first
            made.raise_for_status()
            log.info("made the fabric network %s (%s)", name, fabric.network)
        found = api.get(f"/networks/{name}/json")
    found.raise_for_status()
    doc = found.json()
    fabric_checked(
        ENGINE, fabric,
        labels=doc.get("labels") or {},
        driver=str(doc.get("driver") or ""),
        parent=str(doc.get("network_interface") or ""),
        subnets=[str(each.get("subnet")) for each in doc.get("subnets") or []],
    )  # fmt: skip


def create_body(
    options: Mapping[str, Any],
    storage: Mapping[str, str] | None = None,
    spec: ContainerSpec | None = None,
) -> dict[str, Any]:
    """libpod's create body for these create() options, with ``storage_opts`` and the
    spec's user namespace of its own where it has one (`own_userns`)."""
    render: Any = podman.domain.containers_create.CreateMixin._render_payload  # private
    body: dict[str, Any] = render({**options})
    if storage is not None:
        body["storage_opts"] = dict(storage)
    return own_userns(body, spec) if spec is not None and spec.own_userns else body


class PodmanNetworking(EngineRuntime):
    """The podman runtime's job networks of their own (`JobNetworks`): made by its create
    (`PodmanRuntime._create`), removed with the job, and the ones whose job is gone pruned
    at start (a killed daemon's) and after each launch on one, off its path (`PruneLater`)."""

    client: podman.PodmanClient

    @property
    def api(self) -> Any:
        return self.client.api

    async def run(self, spec: ContainerSpec) -> str:
        """`EngineRuntime.run`; on a job network of its own, the networks whose job is
        gone pruned after the job started (`PruneLater`), not before its network."""
        ref = await super().run(spec)
        if spec.network in NODE_NETWORKS:
            self._pruning.soon()
        return ref

    @functools.cache  # noqa: B019  # one service, one store, for the runtime's life
    def _store(self) -> str:
        return self._data_root()

    @functools.cached_property
    def networks(self) -> JobNetworks:
        errors = (podman.errors.APIError, requests.exceptions.RequestException)
        return JobNetworks(lambda: self.api, self._store, self.settings, errors)

    @functools.cached_property
    def _pruning(self) -> PruneLater:
        return PruneLater(functools.partial(self._prune_networks, sweep=False))

    @property
    def egress(self) -> EgressRule:
        return self.networks.egress

    async def start(self) -> None:
        """The job networks whose container is gone pruned, and their rules (a killed
        daemon's)."""
        await self._prune_networks(sweep=True)

    async def _prune_networks(self, *, sweep: bool) -> None:
        prune = functools.partial(self.networks.prune, sweep=sweep)
        try:
            await self.seam.deadlined("prune job networks", "prune", prune)
        except NodeError as exc:
            log.warning("job networks not pruned (the engine did not answer): %s", exc.message)

    async def close(self) -> None:
        await self._pruning.close()
        await super().close()


class PodmanRuntime(PodmanNetworking, errors=ERRORS):
    """The ContainerRuntime of a podman API service."""

    def _connect(self, settings: NodeSettings) -> podman.PodmanClient:
        return podman.PodmanClient(
            base_url=settings.podman_url,
            timeout=math.ceil(settings.local_api_timeout),
            max_pool_size=self.http_connections,
        )

    @property
    def _streaming(self) -> tuple[float, None]:
        # A stream waits for the engine as long as it takes (deadlines are ours); podman-py
        # reads None as "the client default", so say it with a (connect, read) pair.
        return (self.settings.local_api_timeout, None)

    def _engine_options(self, spec: ContainerSpec) -> dict[str, Any]:
        fabric = configured(self.settings) if spec.network == FABRIC else None
        cards = self.handed_cards(spec)
        return engine_options(spec, self._bounds(spec.confinement), cards, fabric=fabric)

    def _create(self, spec: ContainerSpec) -> Any:
        """podman-py refuses ``storage_opt`` (it maps no field of libpod's for it): with a
        size to hold the writable layer to (project quotas), the body is podman-py's own
        rendering with libpod's ``storage_opts`` added, posted as its create posts it."""
        if spec.network == FABRIC:
            _ready_fabric(self.api, configured(self.settings))
        if spec.network not in NODE_NETWORKS:
            return self._create_container(spec)
        with self.networks.launching(spec.name):
            held = self.networks.make(spec)  # its rules written while the container is made
            try:
                try:
                    return self._create_container(spec)
                finally:
                    held()  # before the job's start, and before a failed create's clean-up
            except Exception:
                # No container, so no removal to take it: gone now, not at the next prune.
                self.networks.forget(spec.name)
                raise

    def _create_container(self, spec: ContainerSpec) -> Any:
        options = self.create_options(spec)
        storage = options.pop("storage_opt", None)
        if storage is None and not spec.own_userns:
            container = self.client.containers.create(**options)
        else:
            response = self.api.post(
                "/containers/create",
                headers={"content-type": "application/json"},
                data=podman.api.prepare_body(create_body(options, storage, spec)),
            )
            response.raise_for_status()
            container = self.client.containers.get(response.json()["Id"])
        if spec.runtime:
            self._check_runtime(container, spec.runtime)
        try:
            if spec.chown_mounts:  # its range chosen by the create: before its start
                hand_over_mounts(container.attrs.get("HostConfig") or {}, spec.mounts)
        except SpecRefused:
            self.seam.or_missing(None, self._remove, container.id)
            raise
        return container

    def _check_runtime(self, container: Any, wanted: str) -> None:
        """The runtime the container was made with, as asked: podman 4.3's API drops a
        container's oci_runtime and would run a sandboxed job under runc, unsaid."""
        got = str(container.attrs.get("OCIRuntime") or "")
        if got != wanted:
            self.seam.or_missing(None, self._remove, container.id)
            raise SandboxUnavailable(
                runtime=wanted,
                why=f"the podman engine made the container with {got or 'its default'}",
                fix=f"make {wanted} podman's runtime in containers.conf ([engine] runtime)",
            )

    def _bounds(self, confinement: Confinement) -> dict[str, Any]:
        """The capabilities kept, the log bounded (libpod keeps one file and truncates it at
        its size: the same budget as docker's rotated files), no setuid regain, no user
        namespaces."""
        options = confined(confinement)
        if self.seccomp_profile is not None:
            options["seccomp_profile_path"] = str(self.seccomp_profile)
        return options

    @functools.cached_property
    def seccomp_profile(self) -> Path | None:
        """The node's profile for podman jobs (`seccomp`), on this machine; None for a
        remote service, which cannot read a file of ours."""
        if self.remote:
            # The scheme only: an ssh:// or https:// address may carry a user's password.
            scheme = self.settings.podman_url.split("://", 1)[0]
            log.warning("podman is remote (%s): its jobs keep its own seccomp profile", scheme)
            return None
        return seccomp.write_profile(self.settings.state_dir)

    @property
    def remote(self) -> bool:
        """Whether the service is another machine's (no file of ours reaches it)."""
        return not local_engine(self.settings.podman_url)

    def _inspect(self, ref: str) -> ContainerState:
        return fmt.state_from_inspect(self.client.containers.get(ref).attrs)

    def _document(self, ref: str) -> Mapping[str, Any]:
        return self.client.containers.get(ref).attrs

    def _stats(self, ref: str) -> Mapping[str, Any]:
        # The compat endpoint: docker's document, which `dockerformat` reads.
        params = {"stream": "false", "one-shot": "true"}
        response = self.api.get(f"/containers/{ref}/stats", params=params, compatible=True)
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]

    def _log_entries(self, ref: str, tail: int, since: datetime | None) -> Iterator[bytes]:
        container = self.client.containers.get(ref)
        # podman-py follows a stream unless told not to.
        frames = container.logs(
            stdout=True,
            stderr=True,
            timestamps=True,
            tail=tail,
            since=since,
            stream=True,
            follow=False,
        )
        assert not isinstance(frames, bytes)  # a stream was asked for
        yield from frames

    def _open_follow(self, ref: str, params: Mapping[str, int | float]) -> Any:
        # The compat endpoint: docker's parameters and frames (logs() hides the response
        # a close must shut). Headers within the deadline; reads unbounded after them.
        timeout = self.settings.local_api_timeout
        response = self.api.get(
            f"/containers/{ref}/logs",
            params=dict(params),
            headers=ONE_USE,
            stream=True,
            timeout=(timeout, timeout),
            compatible=True,
        )
        return opened(response)

    def _kill(self, ref: str, signal: str) -> None:
        self.client.containers.get(ref).kill(signal=signal)

    def _remove(self, name: str) -> None:
        # timeout=0: a forced remove kills at once; podman-py's remove() cannot say it,
        # and libpod then waits 10 s for a job that ignores SIGTERM (docker kills at once).
        params = {"force": True, "v": True, "volumes": True, "timeout": 0}
        for _ in range(REMOVE_TRIES):
            response = self.api.delete(f"/containers/{name}", params=params)
            if response.ok:
                self.networks.forget(name)
                return
            if self._gone(name):
                self.networks.forget(name)
                # podman 4.3 and a job of its own user namespace: "unlinkat .../userdata/shm:
                # device or resource busy" once all is removed (record, layer, mounts).
                log.debug("podman's remove of %s erred, but it is gone", name)
                return
            if not self.errors.ended(response.text):
                break
            # The job ended between libpod's look at its state and its SIGKILL ("container
            # state improper: stopped"): the next try finds it stopped and removes it.
            log.debug("podman's remove of %s raced the job's end: trying again", name)
        response.raise_for_status()

    def _gone(self, name: str) -> bool:
        return container_gone(self.api, name)

    def _list_brief(self) -> list[Brief]:
        params = {"all": "true", "filters": json.dumps(OURS_FILTER)}
        response = self.api.get("/containers/json", params=params, compatible=True)
        response.raise_for_status()
        return [fmt.brief_from_list(entry) for entry in response.json()]

    def _open_events(self) -> tuple[Events, Callable[[], None]]:
        # podman 4 ignores a bare label key in an event filter: filter on our side.
        params = {"filters": json.dumps({"type": ["container"]})}
        response = self.api.get(
            "/events",
            params=params,
            headers=ONE_USE,
            stream=True,
            timeout=self._streaming,
            compatible=True,
        )
        opened(response)
        events = (
            fmt.event_from_docker(event)
            for event in closed_after(response, fmt.json_lines(response.iter_lines()))
            if LABEL_RUN_ID in fmt.event_labels(event)
        )
        return events, lambda: shut(response)

    def _version(self) -> str:
        return str(self.client.version().get("Version"))  # type: ignore[no-untyped-call]

    async def device_support(self) -> DeviceSupport:
        return await asked_support(self, self._device_support)

    def _device_support(self) -> DeviceSupport:
        # containers.conf's cdi_spec_dirs, whose defaults these are, is not in the API.
        local = local_engine(self.settings.podman_url)
        return DeviceSupport(cdi_dirs=CDI_DIRS, cdi_local=local)

    def _engine_dirs(self) -> list[str]:
        store = self.client.info().get("store") or {}  # type: ignore[no-untyped-call]
        return [str(store.get("graphRoot") or ""), str(store.get("runRoot") or "")]

    def _cgroup_driver(self) -> str:
        host = self.client.info().get("host") or {}  # type: ignore[no-untyped-call]
        return str(host.get("cgroupManager") or "cgroupfs")

    def _isolation_support(self) -> IsolationSupport:
        # libpod lists no other runtimes in its info, and podman 4.3's API drops a
        # container's oci_runtime: its configured one is the only one a job is sure of
        # (a sandbox asked for is checked on the container made, `_create`).
        host = self.client.info().get("host") or {}  # type: ignore[no-untyped-call]
        runtime = host.get("ociRuntime") or {}
        name, version = str(runtime.get("name") or ""), str(runtime.get("version") or "")
        return IsolationSupport(
            default_runtime=name,
            runtime_version=version.splitlines()[0] if version else "",
            runtimes={name: ()} if name else {},
            per_job_userns=not (host.get("security") or {}).get("rootless"),
            idmap_mounts=maps_mount_ids(name, version),
            remaps_users=self._remaps_users(),
        )

    def _remaps_users(self) -> bool:
        # A rootful service maps users only where containers.conf says userns = "auto";
        # that file is the service's, not readable through the API: rootless is what it says.
        security = (self.client.info().get("host") or {}).get("security") or {}  # type: ignore[no-untyped-call]
        return bool(security.get("rootless"))

    def _inspect_image(self, image: str) -> Mapping[str, Any]:
        # The compatible endpoint: docker's shape (RepoTags, Size, a sha256: id).
        response = self.api.get(f"/images/{image}/json", compatible=True)
        response.raise_for_status()
        return response.json()  # type: ignore[no-any-return]  # a JSON object

    def _open_pull(self, image: str, headers: Mapping[str, str]) -> PullStream:
        # libpod's own pull (before podman 5) reports bare text lines, no layers. The
        # compat endpoint reads docker's X-Registry-Auth (podman 4.3 included).
        response = self.api.post(
            "/images/create",
            params=fmt.pull_params(image),
            headers={**headers, **ONE_USE},
            stream=True,
            timeout=self._streaming,
            compatible=True,
        )
        return fmt.json_lines(opened(response).iter_lines()), response

    def _data_root(self) -> str:
        store = self.client.info().get("store") or {}  # type: ignore[no-untyped-call]
        return str(store.get("graphRoot") or "")

    def _storage_status(self) -> object:
        store = self.client.info().get("store") or {}  # type: ignore[no-untyped-call]
        return store.get("graphStatus")

    def _local(self) -> bool:
        return local_engine(self.settings.podman_url)

    def _image_entries(self) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
        # The compat lists: docker's shapes, which `dockerformat` reads.
        images = self.api.get("/images/json", compatible=True)
        images.raise_for_status()
        containers = self.api.get("/containers/json", params={"all": "true"}, compatible=True)
        containers.raise_for_status()
        return images.json(), containers.json()

    def _remove_image_ref(self, ref: str) -> None:
        # The compat endpoint answers 409 for an image a container uses, as docker does.
        response = self.api.delete(f"/images/{ref}", params={"force": False}, compatible=True)
        response.raise_for_status()

    def _close_client(self) -> None:
        self.client.close()  # type: ignore[no-untyped-call]  # podman-py is untyped here
