"""The container runtimes and the choice between them.

`detect_runtime` never falls back to the process runtime on its own: jobs started under
one runtime are invisible to another, so guessing would orphan them.
"""

from __future__ import annotations

import logging
import os

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import ConfigError
from tuneplane_node.runtime.base import ContainerRuntime, EngineFeed
from tuneplane_node.runtime.cache import CachedRuntime
from tuneplane_node.settings import NodeSettings
from tuneplane_node.telemetry import NO_TELEMETRY, Telemetry

log = logging.getLogger(__name__)


def make_runtime(
    settings: NodeSettings,
    kind: str,
    *,
    cache: bool = True,
    telemetry: Telemetry = NO_TELEMETRY,
    clock: Clock = SYSTEM_CLOCK,
) -> ContainerRuntime:
    """The runtime of that kind, built without asking its engine anything.

    With ``cache``, engine runtimes come behind the state cache: ``start()`` it before
    serving. One-shot commands (check, inventory) ask the engine directly.
    """
    if kind in ("docker", "podman"):
        engine = _engine(settings, kind, telemetry=telemetry, clock=clock)
        return cached(engine, settings, clock=clock) if cache else engine
    if kind == "process":
        from tuneplane_node.runtime.process.runtime import ProcessRuntime

        log.warning("process runtime: jobs run as bare processes; development machines only")
        return ProcessRuntime(settings, telemetry=telemetry, clock=clock)
    raise ConfigError(f"TUNEPLANE_LOCAL_RUNTIME: unknown runtime {kind!r}")


def _engine(settings: NodeSettings, kind: str, *, telemetry: Telemetry, clock: Clock) -> EngineFeed:
    if kind == "docker":
        from tuneplane_node.runtime.engines.docker import DockerRuntime

        return DockerRuntime(settings, telemetry=telemetry, clock=clock)
    from tuneplane_node.runtime.engines.podman import PodmanRuntime

    return PodmanRuntime(settings, telemetry=telemetry, clock=clock)


def cached(
    feed: EngineFeed, settings: NodeSettings, *, clock: Clock = SYSTEM_CLOCK
) -> CachedRuntime:
    return CachedRuntime(
        feed,
        relist_s=settings.state_relist_s,
        sync_timeout=settings.local_api_timeout,
        clock=clock,
    )


async def detect_runtime(
    settings: NodeSettings,
    *,
    cache: bool = True,
    telemetry: Telemetry = NO_TELEMETRY,
    clock: Clock = SYSTEM_CLOCK,
) -> ContainerRuntime:
    """The configured runtime; ``auto`` takes docker, then podman, whichever answers.

    An explicitly chosen engine is returned even while it is down: the daemon then answers
    503 until it comes back, which is true, instead of refusing to start. Under ``auto``,
    a docker address the operator gave is the engine: if it does not answer, that is an
    error naming it, never a silent move to podman (jobs on docker would all read gone).
    """
    if settings.local_runtime != "auto":
        return make_runtime(
            settings, settings.local_runtime, cache=cache, telemetry=telemetry, clock=clock
        )
    docker_address = settings.docker_host or os.environ.get("DOCKER_HOST")  # one given
    candidates = [("docker", settings.engine_address("docker"))]
    if not docker_address:
        candidates.append(("podman", settings.podman_url))
    tried = []
    for kind, address in candidates:
        engine = _engine(settings, kind, telemetry=telemetry, clock=clock)
        health = await engine.health()  # the engine itself: a cache would not be synced yet
        if health.ok:
            log.info("runtime: %s %s at %s", kind, health.version, address)
            return cached(engine, settings, clock=clock) if cache else engine
        await engine.close()
        tried.append(f"{kind} at {address}: {health.error}")
    if docker_address:
        variable = "TUNEPLANE_DOCKER_HOST" if settings.docker_host else "DOCKER_HOST"
        raise ConfigError(
            f"{variable}={docker_address}: docker did not answer ({health.error}); the node "
            "does not fall back to podman when a docker address is given"
        )
    raise ConfigError(
        "no container engine answered (" + "; ".join(tried) + "). Start docker or podman, "
        "set TUNEPLANE_DOCKER_HOST / TUNEPLANE_PODMAN_URL, or on a development machine set "
        "TUNEPLANE_LOCAL_RUNTIME=process explicitly"
    )
