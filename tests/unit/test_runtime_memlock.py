"""The engine's own hard locked-memory limit, found by its socket's peer credentials and
read from /proc; and what the node does with it: a job given RDMA devices whose memlock
the engine cannot give is a 409 naming memlock, health's GPU readiness says why."""

from __future__ import annotations

import os
import resource
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.conftest import IMAGE, fake_settings
from tests.fakes.clock import FakeClock
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tests.support.nodes import fake_node_of
from tests.unit.test_jobs_rules_confinement_rdma import rdma_dir
from tuneplane_node.errors import MemlockUnavailable
from tuneplane_node.jobs import Node
from tuneplane_node.runtime.memlock import EngineMemlock, engine_memlock, process_memlock
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.wire.values import LABEL_RUN_ID, Launch

MIB = 2**20
LIMITS = """Limit                     Soft Limit           Hard Limit           Units
Max processes             63704                63704                processes
Max locked memory         {soft:<20} {hard:<20} bytes
Max address space         unlimited            unlimited            bytes
"""


def proc_with(tmp_path: Path, pid: int, *, hard: str, soft: str = "65536") -> Path:
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "limits").write_text(LIMITS.format(soft=soft, hard=hard))
    return tmp_path


@pytest.mark.parametrize(("hard", "read"), [("8388608", 8 * MIB), ("unlimited", None)])
def test_a_processes_hard_memlock_is_read_from_its_limits(
    tmp_path: Path, hard: str, read: int | None
) -> None:
    found = process_memlock(42, proc=proc_with(tmp_path, 42, hard=hard))
    assert (found.known, found.hard, found.source) == (True, read, "pid 42")


def test_a_process_gone_or_unreadable_is_unknown_not_a_limit(tmp_path: Path) -> None:
    found = process_memlock(43, proc=tmp_path)
    assert not found.known and found.source.startswith("pid 43: ")
    assert found.refusal(None) is None  # unknown refuses nothing: the engine will say


@pytest.mark.parametrize(
    ("hard", "wanted", "refused"),
    [
        (8 * MIB, None, "its hard limit is 8388608 bytes (pid 7), below unlimited"),
        (8 * MIB, 16 * MIB, "its hard limit is 8388608 bytes (pid 7), below 16777216 bytes"),
        (8 * MIB, 4 * MIB, None),
        (8 * MIB, 8 * MIB, None),
        (None, None, None),  # the engine's own is unlimited
    ],
)
def test_a_memlock_above_the_engines_hard_limit_is_refused_naming_it(
    hard: int | None, wanted: int | None, refused: str | None
) -> None:
    assert EngineMemlock(True, hard, "pid 7").refusal(wanted) == refused


@pytest.fixture
def listening(tmp_path: Path) -> Iterator[str]:
    """A unix socket this test process listens on, standing for an engine's."""
    path = str(tmp_path / "engine.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(path)
        sock.listen()
        yield path


def test_the_engine_is_the_process_listening_on_its_socket(listening: str) -> None:
    found = engine_memlock(f"unix://{listening}")
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    assert found.known and found.source == f"pid {os.getpid()}"
    assert found.hard == (None if hard == resource.RLIM_INFINITY else hard)


@pytest.mark.parametrize("address", ["tcp://10.0.0.1:2375", "unix:///nonexistent/engine.sock"])
def test_an_engine_not_reachable_here_is_unknown(address: str) -> None:
    assert not engine_memlock(address).known


# --- the node's rule -------------------------------------------------------------------------


def card_launch(run_id: str, gpus: int) -> Launch:
    spec = ContainerSpec(name=f"tuneplane-{run_id}", image=IMAGE, labels={LABEL_RUN_ID: run_id})
    return Launch(run_id, gpus, spec)


@pytest.fixture
async def rdma_service(
    fake: FakeRuntime, probe: FakeProbe, clock: FakeClock, tmp_path: Path
) -> AsyncIterator[Node]:
    settings = fake_settings(tmp_path, rdma_device_dir=rdma_dir(tmp_path))
    node = fake_node_of(fake, settings, probe=probe, clock=clock)
    await node.start()
    yield node
    await node.close()


def refusing(node: Node) -> None:
    """As `start` finds a stock engine under systemd: 8 MiB hard."""
    assert node.rules.engine_limits("docker", EngineMemlock(True, 8 * MIB, "pid 7")) is not None


async def test_a_card_job_the_engine_cannot_lock_memory_for_is_a_409_naming_memlock(
    rdma_service: Node, fake: FakeRuntime
) -> None:
    refusing(rdma_service)
    with pytest.raises(MemlockUnavailable) as refused:
        await rdma_service.jobs.launch(card_launch("r1", 1))

    assert (refused.value.status, refused.value.code) == (409, "memlock_unavailable")
    assert "hard limit is 8388608 bytes" in refused.value.message
    assert "LimitMEMLOCK=infinity" in refused.value.message
    assert "TUNEPLANE_RDMA_MEMLOCK" in refused.value.message
    assert fake.containers == {}  # nothing made, and no card held: all 4 refused alike
    with pytest.raises(MemlockUnavailable):
        await rdma_service.jobs.launch(card_launch("r2", 4))
    await rdma_service.jobs.launch(card_launch("r3", 0))  # no card under auto: no RDMA, runs
    assert "tuneplane-r3" in fake.containers


async def test_health_says_why_card_jobs_cannot_start(rdma_service: Node) -> None:
    assert (await rdma_service.jobs.status()).gpu.ready is not False
    refusing(rdma_service)
    gpu = (await rdma_service.jobs.status()).gpu
    assert gpu.ready is False and gpu.reason is not None
    assert "cannot lock their memory" in gpu.reason and "LimitMEMLOCK=infinity" in gpu.reason


async def test_a_size_the_engine_allows_is_applied(
    fake: FakeRuntime, probe: FakeProbe, clock: FakeClock, tmp_path: Path
) -> None:
    settings = fake_settings(tmp_path, rdma_device_dir=rdma_dir(tmp_path), rdma_memlock="4m")
    node = fake_node_of(fake, settings, probe=probe, clock=clock)
    try:
        assert node.rules.engine_limits("docker", EngineMemlock(True, 8 * MIB, "pid 7")) is None
        await node.jobs.launch(card_launch("r1", 1))
        assert fake.containers["tuneplane-r1"].spec.rdma_memlock == 4 * MIB
        assert (await node.jobs.status()).gpu.ready is not False
    finally:
        await node.close()
