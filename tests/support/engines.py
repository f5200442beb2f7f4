"""Where the test engines are (contrib/dev/engines.sh starts them), which lane's tests
each belongs to, and a node's settings on one of them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tuneplane_node.settings import NodeSettings

RUN_DIR = Path("/run/tuneplane-dev")
# The developer's engines (a daemon from the README runs there): no test touches them.
DEV_DOCKER_SOCK = RUN_DIR / "docker.sock"
DEV_PODMAN_SOCK = Path("/run/podman/podman.sock")
# The suite's own Docker engine and podman service, where the engine tests and their
# daemons run (issue 36: a README daemon's card jobs and engine lock failed tests).
TESTS_DOCKER_SOCK = RUN_DIR / "docker-tests.sock"
TESTS_PODMAN_SOCK = RUN_DIR / "podman-tests.sock"
# A Docker engine of the tests' own, for what acts on every container of the node (reap):
# the shared engine holds other people's jobs. A restart goes to a `ThrowawayDocker`.
OWN_DOCKER_SOCK = Path("/run/tuneplane-dev/docker-own.sock")
DEV_ROOT = Path(os.environ.get("TUNEPLANE_DEV_ROOT", "/var/lib/tuneplane-dev"))  # engines.sh's
# A Docker engine whose data root is a small tmpfs of its own, which a test fills up.
FULL_DOCKER_SOCK = Path("/run/tuneplane-dev/docker-full.sock")
FULL_DOCKER_ROOT = Path("/var/lib/tuneplane-dev/docker-full")


LANE = "TUNEPLANE_TEST_LANE"
"""CI runs the engine tests in three processes at once (.ci/run): ``own``, those marked
``own_engines``, whose engines no test of another lane uses (throwaway ones, and the
suite's single-purpose engines: docker-own, docker-full); ``docker`` and ``podman``, the
other engine tests, each lane on one of the two engines most tests share (docker-tests,
podman-tests), as a test's name, parameters or ``podman`` marker say (``-k podman``).
``shared`` is both of those halves in one process. Unset: every test, one at a time
(the README's test command). An engine of another lane asked for fails the test: it
would meet that lane's jobs there, their cards and containers."""

SHARED_HALVES = ("docker", "podman")


def lane_engine(address: str, lane: str) -> str:
    """``address``, an engine of ``lane``'s tests (``own``, ``docker``, ``podman``); the
    test fails in another lane."""
    running = os.environ.get(LANE)
    if running and running != lane and not (running == "shared" and lane in SHARED_HALVES):
        pytest.fail(
            f"{address} is an engine of the {lane!r} lane's tests, and this run is the "
            f"{running!r} lane's ({LANE}): mark the test own_engines, or not, or name "
            "its engine (its name or a parameter saying podman), to match"
        )
    return address


def docker_host() -> str:
    """The engine tests' Docker engine: the suite's own, never the developer's."""
    return lane_engine(suite_docker(), "docker")


def suite_docker() -> str:
    return os.environ.get("TUNEPLANE_TEST_DOCKER_HOST") or f"unix://{TESTS_DOCKER_SOCK}"


def own_docker_host() -> str:
    return lane_engine(suite_own_docker(), "own")


def suite_own_docker() -> str:
    return os.environ.get("TUNEPLANE_TEST_OWN_DOCKER_HOST") or f"unix://{OWN_DOCKER_SOCK}"


def full_docker_host() -> str:
    return lane_engine(f"unix://{FULL_DOCKER_SOCK}", "own")


def swept(host: str | None) -> bool:
    """Whether a node on this engine may sweep its wreckage: the suite's own engines
    only (its own, and throwaway ones), never one that holds other people's nodes."""
    throwaway = f"unix://{RUN_DIR}/throwaway-"
    return host is not None and (host.startswith(throwaway) or host == suite_own_docker())


def podman_url() -> str:
    """The engine tests' podman service: its own store and socket, never the developer's."""
    return lane_engine(suite_podman(), "podman")


def suite_podman() -> str:
    return os.environ.get("TUNEPLANE_TEST_PODMAN_URL") or f"unix://{TESTS_PODMAN_SOCK}"


def engine_addresses(engine: str) -> dict[str, str]:
    """A daemon's settings for the suite's ``engine``: its address asked for as its
    lane's, the other's given unasked (the node never calls it)."""
    return {
        "TUNEPLANE_LOCAL_RUNTIME": engine,
        "TUNEPLANE_DOCKER_HOST": docker_host() if engine == "docker" else suite_docker(),
        "TUNEPLANE_PODMAN_URL": podman_url() if engine == "podman" else suite_podman(),
    }


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def engine_missing(what: str, why: str) -> None:
    """Fail under CI (a missing engine is a broken build), skip visibly elsewhere."""
    message = f"{what} not reachable ({why}); run `sudo contrib/dev/engines.sh` first"
    if under_ci():
        pytest.fail(message)
    pytest.skip(message)


# The node's own files for engine tests (podman's seccomp profile): never the real home.
ENGINE_STATE_DIR = Path(tempfile.gettempdir()) / "tuneplane-tests-state"


def engine_settings(engine: str, **overrides: object) -> NodeSettings:
    base: dict[str, object] = {
        "local_runtime": engine,
        "node_state_dir": ENGINE_STATE_DIR,
        "local_api_timeout": 30,
        "runtime_threads": 8,
        # The development engines run --bridge=none --iptables=false: docker's isolation
        # would hold nothing there. The network tests ask for theirs (test_daemon_jobnet).
        "job_network": "bridge",
        # They run in the machine's network namespace, whose firewall no test touches: a
        # host-network job's egress rule would land in its OUTPUT chain. The egress tests
        # ask for it, on engines in namespaces of their own (test_daemon_egress).
        "job_egress_rule": False,
    }
    base.update(overrides)
    # The suite's engines where the test names none; the one the node uses is asked
    # for as the lane's (`lane_engine`; the other is never called).
    if "docker_host" not in base:
        base["docker_host"] = docker_host() if engine == "docker" else suite_docker()
    if "podman_url" not in base:
        base["podman_url"] = podman_url() if engine == "podman" else suite_podman()
    return NodeSettings(**base)  # type: ignore[arg-type]
