"""Each podman job's network of its own (`jobnetwork`), with the host guard's rules and
the egress rule's jump for its bridge (`hostguard`, `egress`): made before its container,
removed after it, and the ones whose job is gone pruned after a launch (off its path),
at a removal and at start (a killed daemon's). Blocking: on the engine's pool. The
podman SDK's errors are its runtime's (`JobNetworks`' ``errors``): no SDK import here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from typing import Any

from tuneplane_node.runtime.engines.networks import hostguard
from tuneplane_node.runtime.engines.networks.egress import (
    EgressPolicy,
    EgressRule,
    podman_parent,
)
from tuneplane_node.runtime.engines.networks.jobnetwork import (
    LABEL_NETWORK_OF,
    LABEL_NETWORK_STORE,
    LABEL_NODE_NETWORK,
    SEALED,
    own_network,
)
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings, unix_socket

log = logging.getLogger(__name__)


def _create_network(api: Any, body: Mapping[str, Any]) -> Any:
    return api.post(
        "/networks/create", headers={"content-type": "application/json"}, data=json.dumps(body)
    )


def make_network(api: Any, spec: ContainerSpec, store: str) -> str:
    """The job's network of its own: a bridge whose traffic to other bridges is
    dropped (``isolate``), internal when sealed; removed with the job
    (`PodmanRuntime._remove`). ``store``: the service's, which its labels name. Its
    bridge's name is answered."""
    name = own_network(spec.name)
    body = {
        "name": name,
        "driver": "bridge",
        "options": {"isolate": "true"},
        "internal": spec.network == SEALED,
        # No name server on the gateway: the host guard keeps no port of the host open
        # (a job resolves through the servers of the machine's resolv.conf).
        "dns_enabled": False,
        "labels": {
            LABEL_NODE_NETWORK: spec.network,
            LABEL_NETWORK_OF: spec.name,
            LABEL_NETWORK_STORE: store,
        },
    }
    response = _create_network(api, body)
    if response.status_code == 409:  # a leftover of a launch of that name: made anew
        _remove_network(api, name)
        response = _create_network(api, body)
    response.raise_for_status()
    return str(response.json().get("network_interface") or "")


def _remove_network(api: Any, name: str) -> bool:
    """Gone, whether it was there or not; whether it was."""
    response = api.delete(f"/networks/{name}", params={"force": True})
    if response.status_code == 404:
        return False
    response.raise_for_status()
    return True


def container_gone(api: Any, name: str) -> bool:
    return bool(api.get(f"/containers/{name}/json").status_code == 404)


def _prune_networks(api: Any, store: Callable[[], str], making: Collection[str]) -> int:
    """Remove the job networks of this store whose container is gone (a daemon or a
    launch that died between the two); how many. Never another store's: every podman
    service of the machine shares the CNI directory; never one of a job in ``making``
    (its network made, its container not yet)."""
    params = {"filters": json.dumps({"label": [LABEL_NETWORK_OF]})}
    response = api.get("/networks/json", params=params)
    response.raise_for_status()
    pruned = 0
    for network in response.json() or []:
        labels = network.get("labels") or {}
        owner = str(labels.get(LABEL_NETWORK_OF) or "")
        if owner in making or labels.get(LABEL_NETWORK_STORE) != store():
            continue
        if not container_gone(api, owner):
            continue
        _remove_network(api, str(network.get("name")))
        log.info("removed the network %s, whose job is gone", network.get("name"))
        pruned += 1
    return pruned


def _bridges(api: Any) -> set[str]:
    """The bridges of every network the engine knows (other services' too: they share
    the network configuration)."""
    response = api.get("/networks/json")
    response.raise_for_status()
    return {str(each.get("network_interface") or "") for each in response.json() or []}


class JobNetworks:
    """Each job's network of its own (`jobnetwork`), made before its container and
    removed after it, with the host guard's rules and the egress rule's jump for its
    bridge (`hostguard`, `egress`). The networks whose job is gone are pruned after a
    launch (`prune`, which the runtime runs once the job started, off its path), at a
    removal and at start (a killed daemon's); never the network of a launch between its
    network and its container (`launching`). ``errors``: the SDK's that a clean-up may
    meet. Blocking: on the engine's pool."""

    def __init__(
        self, api: Callable[[], Any], store: Callable[[], str], settings: NodeSettings,
        errors: tuple[type[Exception], ...],
    ) -> None:  # fmt: skip
        self.api, self.store, self.errors = api, store, errors
        socket = unix_socket(settings.podman_url)
        self.guard = hostguard.BridgeGuard(socket)
        parent = functools.cache(lambda: podman_parent(self.api().get("/info").json()))
        self.egress = EgressRule(
            EgressPolicy.of(settings), address=settings.podman_url, parent=parent,
            socket_path=socket, tool=self.guard.tool,
        )  # fmt: skip
        self._making: set[str] = set()
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def launching(self, container: str) -> Iterator[None]:
        """While a launch makes ``container``'s network and then its container: no prune
        takes that network for a job that is gone."""
        with self._lock:
            self._making.add(container)
        try:
            yield
        finally:
            with self._lock:
                self._making.discard(container)

    def make(self, spec: ContainerSpec) -> Callable[[], None]:
        """The job's network made, its rules being written: what is answered waits until
        they hold (the caller makes the container meanwhile, and waits before its
        start: a job never runs without them; the write took 20 ms of a podman launch's
        240 there, alone)."""
        bridge = make_network(self.api(), spec, self.store())
        begun = self.egress.begin_fresh(self.guard, bridge)

        def held() -> None:
            if begun is not None and begun.done().returncode == 0:
                return  # both in one write (the usual launch); else each its own way
            self.guard.hold(bridge)
            if bridge:
                self.egress.hold(bridge, fresh=True)

        return held

    def forget(self, container: str) -> None:
        """After its container (or its failed create): its network, any other whose job
        is gone, and the rules of the bridges gone with them."""
        removed = self.tidy(_remove_network, self.api(), own_network(container))
        self.prune(sweep=bool(removed))

    def prune(self, *, sweep: bool = True) -> None:
        """This store's job networks whose container is gone removed, then, where one was
        (or ``sweep``), the rules whose bridge is gone. The store is asked (podman's info,
        slow) only where there is a job network to weigh."""
        # The live set, not a copy: a launch that began after the look is in it by the
        # time its network can be listed.
        if self.tidy(_prune_networks, self.api(), self.store, self._making) or sweep:
            self.tidy(self.guard.sweep, lambda: _bridges(self.api()))
            self.tidy(self.egress.sweep, lambda: _bridges(self.api()))

    def tidy(self, fn: Callable[..., object], *args: Any) -> object:
        """A network clean-up that fails is logged, never the verb's failure: what it
        leaves, the next launch, removal or start prunes. What ``fn`` answers, or None."""
        try:
            return fn(*args)
        except self.errors as exc:
            log.warning("job networks not tidied (pruned later): %s", exc)
            return None


class PruneLater:
    """A launch's prune of the networks whose job is gone, run after it in the background
    (``prune``: the runtime's call of `JobNetworks.prune` on its pool): one at a time, and
    one more where a launch asked while one ran (it may have looked before that launch's
    leftover was there)."""

    def __init__(self, prune: Callable[[], Awaitable[None]]) -> None:
        self._prune = prune
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def soon(self) -> None:
        """A prune after this one (if one runs), else now; never awaited."""
        self._again = True
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while self._again:
            self._again = False
            await self._prune()

    async def close(self) -> None:
        """The prune under way given up (the next start prunes what it would have)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
