"""Reading a container's figures from cgroup files (v1 and v2 trees made in a temporary
directory), the engines' one-shot stats document, and a card's power in the simulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.fakes.clock import FakeClock
from tuneplane_node.fabrics import READ_CHUNK
from tuneplane_node.gpu.simulation import SimulatedProbe
from tuneplane_node.runtime import cgroups
from tuneplane_node.runtime.engines.dockerformat import usage_from_stats
from tuneplane_node.runtime.facts import Usage
from tuneplane_node.settings import NodeSettings

ID = "b2302a1ff99df4ea7bc46602d9d0a9c7c1ab32babd1a7a11cac371a3dd561289"
MIB = 2**20


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def proc_of(tmp_path: Path, lines: str) -> Path:
    write(tmp_path / "proc", {"42/cgroup": lines})
    return tmp_path / "proc"


def test_cgroup_v2(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    where = f"system.slice/docker-{ID}.scope"
    write(root, {"cgroup.controllers": "cpu memory pids"})
    write(
        root / where,
        {
            "cpu.stat": "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n",
            "memory.current": str(300 * MIB),
            "memory.stat": f"anon {200 * MIB}\nfile {100 * MIB}\ninactive_file {80 * MIB}\n",
            "memory.max": "max\n",
            "pids.current": "7\n",
        },
    )
    proc = proc_of(tmp_path, f"0::/{where}\n")
    dirs = cgroups.locate(42, must_hold=ID, root=root, proc=proc)
    assert dirs is not None
    assert cgroups.read(dirs) == Usage(2.5, 220 * MIB, None, 7)
    write(root / where, {"memory.max": str(512 * MIB)})
    usage = cgroups.read(dirs)
    assert usage is not None and usage.memory_limit_bytes == 512 * MIB


def test_cgroup_v1(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    where = f"docker/{ID}"
    write(root / "cpuacct" / where, {"cpuacct.usage": "1063362112\n"})
    write(
        root / "memory" / where,
        {
            "memory.usage_in_bytes": str(210 * MIB),
            "memory.stat": f"cache {10 * MIB}\ntotal_inactive_file {10 * MIB}\n",
            "memory.limit_in_bytes": "9223372036854771712\n",  # LONG_MAX, page-rounded
        },
    )
    write(root / "pids" / where, {"pids.current": "1\n"})
    lines = "".join(f"{i}:{c}:/{where}\n" for i, c in enumerate(["cpu", "cpuacct", "memory"]))
    proc = proc_of(tmp_path, lines + f"8:pids:/{where}\n0::/{where}\n")
    dirs = cgroups.locate(42, must_hold=ID, root=root, proc=proc)
    assert dirs is not None and not dirs.unified
    assert cgroups.read(dirs) == Usage(1.063362112, 200 * MIB, None, 1)


def test_a_long_stat_file_is_read_to_its_end(tmp_path: Path) -> None:
    """A memory.stat longer than one read (a kernel with many counters): the key
    after the first read's bytes still counts."""
    root = tmp_path / "cgroup"
    where = f"system.slice/docker-{ID}.scope"
    write(root, {"cgroup.controllers": "cpu memory pids"})
    padding = "".join(f"counter_{i} {i}\n" for i in range(READ_CHUNK // 8))
    assert len(padding) > 2 * READ_CHUNK
    write(
        root / where,
        {
            "cpu.stat": "usage_usec 1000000\n",
            "memory.current": str(300 * MIB),
            "memory.stat": f"{padding}inactive_file {100 * MIB}\n",
            "memory.max": "max\n",
            "pids.current": "3\n",
        },
    )
    dirs = cgroups.locate(42, must_hold=ID, root=root, proc=proc_of(tmp_path, f"0::/{where}\n"))
    assert dirs is not None
    assert cgroups.read(dirs) == Usage(1.0, 200 * MIB, None, 3)


def test_a_cgroup_without_the_container_id_is_not_that_container(tmp_path: Path) -> None:
    """A remote engine's pid is some process of this machine: never read as the job."""
    root = tmp_path / "cgroup"
    write(root, {"cgroup.controllers": ""})
    write(root / "user.slice", {"cpu.stat": "usage_usec 1\n"})
    proc = proc_of(tmp_path, "0::/user.slice\n")
    assert cgroups.locate(42, must_hold=ID, root=root, proc=proc) is None
    assert cgroups.locate(43, must_hold=ID, root=root, proc=proc) is None  # no such pid


def test_a_cgroup_gone_reads_none(tmp_path: Path) -> None:
    gone = cgroups.CgroupDirs(True, tmp_path / "x", tmp_path / "x", tmp_path / "x")
    assert cgroups.read(gone) is None


@pytest.mark.parametrize(("limit", "expected"), [(8 * MIB, 8 * MIB), (64 * 2**30, None), (0, None)])
def test_the_engines_one_shot_stats(limit: int, expected: int | None) -> None:
    doc = {
        "cpu_stats": {"cpu_usage": {"total_usage": 4_000_000_000}},
        "memory_stats": {"usage": 12 * MIB, "limit": limit, "stats": {"inactive_file": 2 * MIB}},
        "pids_stats": {"current": 3},
    }
    usage = usage_from_stats(doc, machine_memory=64 * 2**30)
    assert usage == Usage(4.0, 10 * MIB, expected, 3, source="engine")
    assert usage_from_stats({}, machine_memory=None) == Usage(source="engine")


def test_the_simulation_file_gives_a_cards_power(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    card = {"index": 0, "utilization_pct": 87, "memory_used_mib": 1, "temperature_c": 50}
    path.write_text(
        json.dumps({"cards": [{**card, "power_w": 312.5}, {"index": 1, "power_w": 90}]})
    )
    probe = SimulatedProbe(path, NodeSettings.model_validate({}), clock=FakeClock())
    read = probe.snapshot().cards
    assert (read[0].power_w, read[0].utilization_pct, read[1].power_w) == (312.5, 87, 90.0)
    path.write_text(json.dumps({"cards": [{"index": 0, "power_w": "hot"}]}))
    assert "cards[0].power_w" in (probe.snapshot().error or "")
