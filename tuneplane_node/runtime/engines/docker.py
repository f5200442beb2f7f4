"""DockerRuntime: job containers on a Docker engine. The only module that imports `docker`.

What differs from podman: the SDK's Mount type, the stop signal by name, ``nano_cpus``,
GPUs as a device request, and private SDK helpers for a pull whose socket a cancel can
close. The rest is `EngineRuntime`'s.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from typing import Any

import docker
import docker.errors
import docker.types
import requests.exceptions
import urllib3.exceptions
from docker.models.containers import (  # type: ignore[attr-defined]  # the SDK's own
    _create_container_args as create_container_args,
)

from tuneplane_node.errors import NodeError
from tuneplane_node.runtime.base import Brief, ContainerState
from tuneplane_node.runtime.engines import dockerformat as fmt
from tuneplane_node.runtime.engines.engine import (
    OURS_FILTER,
    EngineRuntime,
    Events,
    asked_support,
)
from tuneplane_node.runtime.engines.isolation import registered
from tuneplane_node.runtime.engines.networks import hostguard
from tuneplane_node.runtime.engines.networks.egress import (
    DOCKER_USER,
    EgressPolicy,
    EgressRule,
)
from tuneplane_node.runtime.engines.networks.jobnetwork import (
    FABRIC_KIND,
    LABEL_NODE_NETWORK,
    NO_ICC,
    NODE_NETWORKS,
    SEALED,
    checked,
    configured,
    docker_network,
    fabric_checked,
    fabric_network,
    gateway,
)
from tuneplane_node.runtime.engines.pulling import PullStream
from tuneplane_node.runtime.engines.seam import ErrorTable
from tuneplane_node.runtime.facts import CDI_GPU_KIND, DeviceSupport, IsolationSupport
from tuneplane_node.runtime.labels import LABEL_FABRIC_ADDRESS
from tuneplane_node.runtime.logstream import ONE_USE, opened
from tuneplane_node.runtime.spec import FABRIC, RDMA_CAPABILITY, Confinement, ContainerSpec
from tuneplane_node.settings import Fabric, NodeSettings, local_engine, unix_socket

log = logging.getLogger(__name__)
ENGINE = "docker"
# The oldest engine we support (20.10). Pinned so that building the client asks the
# engine nothing: a daemon must start, and say "unreachable", while the engine is down.
API_VERSION = "1.41"
NETWORK_LOCK = threading.Lock()
GUARDED: set[tuple[str, str]] = set()  # (engine, bridge): the host guard tried, under the lock
"""Held while the jobs' network is looked for and made (docker's duplicate check races)."""
ERRORS = ErrorTable(
    engine=ENGINE,
    unreachable=(
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        urllib3.exceptions.HTTPError,
        ConnectionError,
        FileNotFoundError,
        TimeoutError,
    ),
    api_error=docker.errors.APIError,
    not_found=docker.errors.NotFound,  # ImageNotFound is one too
    stopped=("is not running",),  # "Container <id> is not running" (409)
)


def _bounds(confinement: Confinement) -> dict[str, Any]:
    """The capabilities kept, the log rotated by the engine (json-file, which the logs verb
    reads), and no setuid binary regaining what was dropped."""
    config = {
        "max-size": str(confinement.log_max_bytes),
        "max-file": str(confinement.log_max_files),
    }
    options: dict[str, Any] = {
        "log_config": docker.types.LogConfig(type="json-file", config=config),
        # From none, whatever the engine's default set: docker gives a non-root user none
        # of these (no ambient set), and refuses to drop a capability it does not know.
        "cap_drop": ["ALL"],
        "cap_add": list(confinement.capabilities),
    }
    if confinement.no_new_privileges:
        options["security_opt"] = ["no-new-privileges"]
    if confinement.init:  # docker-init (tini) as PID 1: it passes signals on, reaps zombies
        options["init"] = True
    return options


class Created:
    """A container just created: its id, and its start."""

    def __init__(self, container_id: str, api: Any) -> None:
        self.id, self.api = container_id, api

    @classmethod
    def made(cls, api: Any, options: Mapping[str, Any]) -> Created:
        """The SDK's ``containers.create`` without the inspect it makes after: the create
        answers the id, which is all the start needs (4 ms of every launch, issue 56).
        The options are turned into the API's arguments by the SDK's own function."""
        args = create_container_args({**options, "version": api.api_version})
        return cls(str(api.create_container(**args)["Id"]), api)

    def start(self) -> None:
        self.api.start(self.id)


class DockerRuntime(EngineRuntime, errors=ERRORS):
    """The ContainerRuntime of a Docker engine."""

    client: docker.DockerClient
    support: DeviceSupport | None = None  # the engine's last word on handing out cards

    def _connect(self, settings: NodeSettings) -> docker.DockerClient:
        options: dict[str, Any] = {
            "timeout": math.ceil(settings.local_api_timeout),
            "max_pool_size": self.http_connections,
            "version": API_VERSION,
        }
        if settings.docker_host:
            return docker.DockerClient(base_url=settings.docker_host, **options)
        return docker.from_env(**options)

    @property
    def api(self) -> docker.APIClient:
        return self.client.api

    def _engine_options(self, spec: ContainerSpec) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if spec.stop_signal:  # else the image's STOPSIGNAL, else SIGTERM: docker's own rule
            options["stop_signal"] = spec.stop_signal
        options["detach"] = True
        if spec.network in NODE_NETWORKS:  # made before the container (`_create`)
            options["network_mode"] = docker_network(spec.network)
        if spec.network == FABRIC:  # made before the container (`_create`)
            options.update(self._fabric_options(spec))
        options.update(_bounds(spec.confinement))
        options["mounts"] = [
            docker.types.Mount(m.container, m.host, type="bind", read_only=m.read_only)
            for m in spec.mounts
        ]
        if spec.cpu_limit:
            options["nano_cpus"] = int(spec.cpu_limit * 1e9)
        cpus, mems = spec.cpuset()  # at create only: never updated on a running job
        if cpus:
            options["cpuset_cpus"] = cpus
        if mems:
            options["cpuset_mems"] = mems
        if cards := self.handed_cards(spec):
            options["device_requests"] = [self._card_request(cards)]
        if spec.read_only_root:
            options["read_only"] = True
            options["tmpfs"] = {each.path: each.options() for each in spec.tmpfs}
        if spec.rdma_devices:
            options["devices"] = spec.rdma_mappings()
            memlock = -1 if spec.rdma_memlock is None else spec.rdma_memlock  # -1: unlimited
            options["ulimits"] = [docker.types.Ulimit(name="memlock", soft=memlock, hard=memlock)]
            options["cap_add"] = [*options["cap_add"], RDMA_CAPABILITY]
        return options

    def _create(self, spec: ContainerSpec) -> Any:
        if spec.network in NODE_NETWORKS:
            with NETWORK_LOCK:  # two launches at once make one network, not two
                self._ready_network(spec.network)
        if spec.network == FABRIC:
            self._ready_fabric(configured(self.settings))
        return Created.made(self.api, self.create_options(spec))

    def _fabric_options(self, spec: ContainerSpec) -> dict[str, Any]:
        """On the fabric network only, at the address its label holds (a static IP)."""
        name = fabric_network(configured(self.settings))
        endpoint = self.api.create_endpoint_config(ipv4_address=spec.labels[LABEL_FABRIC_ADDRESS])
        return {"network_mode": name, "network": name, "networking_config": {name: endpoint}}

    def _ready_fabric(self, fabric: Fabric) -> None:
        """The fabric's network, made when missing; one of that name that is not the
        settings' is refused (`fabric_checked`), never used."""
        name = fabric_network(fabric)
        try:
            found = self.api.inspect_network(name)
        except docker.errors.NotFound:
            # The gateway always given: docker's own choice is the range's first address.
            pool = docker.types.IPAMPool(
                subnet=str(fabric.subnet), iprange=str(fabric.range), gateway=str(gateway(fabric))
            )
            try:
                self.api.create_network(
                    name,
                    driver=fabric.network,
                    options={"parent": fabric.interface},
                    ipam=docker.types.IPAMConfig(pool_configs=[pool]),
                    labels={LABEL_NODE_NETWORK: FABRIC_KIND},
                    check_duplicate=True,
                )
                log.info(
                    "made the fabric network %s (%s on %s)", name, fabric.network, fabric.interface
                )
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: another launch made it first
                    raise
            found = self.api.inspect_network(name)
        configs = (found.get("IPAM") or {}).get("Config") or []
        fabric_checked(
            ENGINE, fabric,
            labels=found.get("Labels") or {},
            driver=str(found.get("Driver") or ""),
            parent=str((found.get("Options") or {}).get("parent") or ""),
            subnets=[str(config.get("Subnet")) for config in configs],
        )  # fmt: skip

    def _ready_network(self, kind: str) -> None:
        """The node's network of that kind, made when missing; one of that name the node
        did not make is refused (`checked`), never used."""
        name = docker_network(kind)
        try:
            found = self.api.inspect_network(name)
        except docker.errors.NotFound:
            try:
                self.api.create_network(
                    name,
                    driver="bridge",
                    options={NO_ICC: "false"},
                    internal=kind == SEALED,
                    labels={LABEL_NODE_NETWORK: kind},
                    check_duplicate=True,
                )
                log.info("made the jobs' network %s (%s)", name, kind)
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: another node made it first
                    raise
            found = self.api.inspect_network(name)
        checked(ENGINE, name, kind, found)
        self._guard_host(name, found)

    def _guard_host(self, name: str, network: dict[str, Any]) -> None:
        """The rule that keeps the network's jobs off this machine's ports (`hostguard`),
        once per engine and network, and the egress rule (`egress`), once per runtime
        and network (its settings'); where either cannot hold, said once in the log."""
        address, interface = (
            self.settings.engine_address(ENGINE),
            hostguard.bridge_interface(network),
        )
        if interface not in self.egress_held:
            self.egress_held.add(interface)
            self.egress.hold(interface, ipv6=bool(network.get("EnableIPv6")))
        if (address, interface) in GUARDED:
            return
        GUARDED.add((address, interface))
        pid, why = hostguard.engine_pid(unix_socket(address))
        why = hostguard.guard(pid, interface) if pid else why
        if why is not None:
            log.warning("the jobs on %s can open this machine's ports: %s", name, why)

    @functools.cached_property
    def egress(self) -> EgressRule:
        """The egress rule of the node's networks (`egress`): jumped to from DOCKER-USER,
        in the iptables docker's firewall uses."""
        address = self.settings.engine_address(ENGINE)
        return EgressRule(
            EgressPolicy.of(self.settings), address=address, parent=lambda: DOCKER_USER,
            socket_path=unix_socket(address), tool=lambda pid: "iptables", ipv6=True,
        )  # fmt: skip

    @functools.cached_property
    def egress_held(self) -> set[str]:
        """The bridges whose egress jump this runtime held (under `NETWORK_LOCK`)."""
        return set()

    async def start(self) -> None:
        """The egress rule's jumps whose network is gone removed, its chain written with
        this start's settings; with the rule off, all of it removed."""
        try:
            await self.seam.call("sweep the egress rule", self.egress.sweep, set)
        except NodeError as exc:
            log.warning("the egress rule not swept (the engine did not answer): %s", exc.message)

    def _card_request(self, cards: tuple[int, ...]) -> docker.types.DeviceRequest:
        """The NVIDIA device request (``--gpus``), or the cards as CDI devices on a docker
        that has no nvidia runtime but reads CDI specifications (what readiness accepts)."""
        support = self.support or self._device_support()
        if support.cards_by_cdi:
            ids = [f"{CDI_GPU_KIND}={gpu}" for gpu in cards]
            return docker.types.DeviceRequest(driver="cdi", device_ids=ids)
        ids = [str(gpu) for gpu in cards]
        return docker.types.DeviceRequest(device_ids=ids, capabilities=[["gpu"]])

    def _inspect(self, ref: str) -> ContainerState:
        return fmt.state_from_inspect(self.api.inspect_container(ref))

    def _document(self, ref: str) -> Mapping[str, Any]:
        return self.api.inspect_container(ref)  # type: ignore[no-any-return]

    def _stats(self, ref: str) -> Mapping[str, Any]:
        # one_shot: the figures now, not two samples a second apart.
        return self.api.stats(ref, stream=False, one_shot=True)  # type: ignore[no-any-return]

    def _log_entries(self, ref: str, tail: int, since: datetime | None) -> Iterator[bytes]:
        stream = self.api.logs(
            ref,
            stdout=True,
            stderr=True,
            timestamps=True,
            tail=tail,
            since=since.timestamp() if since else None,
            stream=True,
            follow=False,
        )
        try:
            yield from stream
        finally:
            stream.close()

    def _open_follow(self, ref: str, params: Mapping[str, int | float]) -> Any:
        # The public logs() reads with the client's timeout, which would end the stream
        # of a job quiet for that long, and hides the response a close must shut.
        api: Any = self.api  # private: not in the stubs
        timeout = self.settings.local_api_timeout
        url = api._url("/containers/{0}/logs", ref)
        response = api._get(
            url, params=params, headers=ONE_USE, stream=True, timeout=(timeout, timeout)
        )
        return opened(response, api._raise_for_status)

    def _kill(self, ref: str, signal: str) -> None:
        self.api.kill(ref, signal=signal)

    def _remove(self, name: str) -> None:
        try:
            self.api.remove_container(name, force=True, v=True)
        except docker.errors.APIError as exc:
            if exc.status_code == 409 and "in progress" in str(exc.explanation):
                return  # someone else is removing it: the goal is met
            raise

    def _list_brief(self) -> list[Brief]:
        return [
            fmt.brief_from_list(entry)
            for entry in self.api.containers(all=True, filters=OURS_FILTER)
        ]

    def _open_events(self) -> tuple[Events, Callable[[], None]]:
        stream = self.api.events(decode=True, filters={"type": "container", **OURS_FILTER})
        return (fmt.event_from_docker(event) for event in stream), stream.close

    def _version(self) -> str:
        return str(self.api.version().get("Version"))

    async def device_support(self) -> DeviceSupport:
        return await asked_support(self, self._device_support)

    def _device_support(self) -> DeviceSupport:
        info = self.api.info()
        local = unix_socket(self.settings.engine_address("docker")) is not None
        self.support = DeviceSupport(
            runtimes=tuple(sorted(info.get("Runtimes") or {})),
            # Docker 25 and later, with the cdi feature on; absent or empty before.
            cdi_dirs=tuple(info.get("CDISpecDirs") or ()),
            cdi_local=local,
        )
        return self.support

    def _engine_dirs(self) -> list[str]:
        # Docker reports no exec root (its --exec-root, /run/docker by default: under /run).
        return [str(self.api.info().get("DockerRootDir") or "")]

    def _cgroup_driver(self) -> str:
        return str(self.api.info().get("CgroupDriver") or "cgroupfs")

    def _remaps_users(self) -> bool:
        return self._isolation_support().remaps_users

    def _isolation_support(self) -> IsolationSupport:
        # No per-container user namespaces before docker 28's: the daemon's remap only.
        info = self.api.info()
        options = info.get("SecurityOptions") or []
        return IsolationSupport(
            default_runtime=str(info.get("DefaultRuntime") or ""),
            runtimes=registered(info.get("Runtimes") or {}),
            remaps_users=any("name=userns" in str(option) for option in options),
        )

    def _inspect_image(self, image: str) -> Mapping[str, Any]:
        return self.api.inspect_image(image)  # type: ignore[no-untyped-call,no-any-return]  # untyped in the stubs

    def _open_pull(self, image: str, headers: Mapping[str, str]) -> PullStream:
        # The public pull() hides the HTTP response, and a cancel needs it to close the
        # socket under the reading thread; these private helpers are what pull() uses
        # (with auth_config, pull() sends the same X-Registry-Auth header).
        api: Any = self.api  # private: not in the stubs
        response = api._post(
            api._url("/images/create"),
            params=fmt.pull_params(image),
            headers={**headers, **ONE_USE},
            stream=True,
            timeout=None,
        )
        opened(response, api._raise_for_status)
        return api._stream_helper(response, decode=True), response

    def _data_root(self) -> str:
        return str(self.api.info().get("DockerRootDir") or "")

    def _storage_status(self) -> object:
        return self.api.info().get("DriverStatus")

    def _local(self) -> bool:
        return local_engine(self.settings.engine_address("docker"))

    def _image_entries(self) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
        return self.api.images(), self.api.containers(all=True)

    def _remove_image_ref(self, ref: str) -> None:
        self.api.remove_image(ref, force=False, noprune=False)

    def _close_client(self) -> None:
        self.client.close()
