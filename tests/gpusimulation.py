"""The GPU simulation file a daemon's probe reads, edited live, and launches that ask for
cards: what tests/http/test_gpu_api.py and tests/engines/test_gpu_api_engines.py share."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.console import Console
from tests.support.images import IMAGE
from tests.support.jobs import unique
from tuneplane_node.wire.values import container_name

Make = Callable[..., Awaitable[Console]]

DRIVER = "580.159.03"
CUDA = "13.0"
H100 = "NVIDIA H100 80GB HBM3"
ENGINE_LIVE = {"running", "created", "paused", "restarting"}


# --- the simulated machine ------------------------------------------------------------


def card(index: int) -> dict[str, Any]:
    return {
        "index": index,
        "name": H100,
        "uuid": f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        "pci_bus_id": f"00000000:{0x17 + index:02X}:00.0",
        "memory_total_mib": 81559,
        "memory_used_mib": 0,
        "temperature_c": 40,
        "ecc_uncorrected": 0,
        "retired_pages_pending": False,
        "xid": [],
        "lost": False,
        "processes": [],
    }


class Simulation:
    """The simulation file the daemon's probe reads on every request; edit it live."""

    def __init__(self, path: Path, *, cards: int = 4, links: list[list[Any]] | None = None):
        self.path = path
        self.data: dict[str, Any] = {
            "driver": DRIVER,
            "cuda": CUDA,
            "cards": [card(index) for index in range(cards)],
            "links": links or [],
        }
        self.write()

    def set(self, index: int, **facts: Any) -> None:
        self.data["cards"][index].update(facts)
        self.write()

    def write(self) -> None:
        # Replaced whole, so the daemon never reads half a file.
        partial = self.path.with_suffix(".partial")
        with partial.open("w", encoding="utf-8") as file:
            json.dump(self.data, file)
        os.replace(partial, self.path)


@pytest.fixture
def sim(tmp_path: Path) -> Simulation:
    return Simulation(tmp_path / "gpus.json")


async def simulated_node(make: Make, sim: Simulation, **overrides: Any) -> Console:
    """A node (over the fake, or an engine) whose cards are the simulation file's."""
    options: dict[str, Any] = {"gpu_simulation_file": sim.path, "local_gpu_count": None}
    return await make(**{**options, **overrides})


async def try_launch(node: Console, gpus: int, run_id: str | None = None) -> tuple[int, Any]:
    """A launch that may be refused: (status, body), asserting nothing."""
    run_id = run_id or unique("gpu")
    body = {
        "run_id": run_id,
        "requested_gpus": gpus,
        "container": {
            "name": container_name(run_id),
            "image": IMAGE,
            "command": ["/bin/sleep", "300"],
        },
    }
    return await node.call("POST", "/node/v1/launch", json=body)


def run_id_of(ref: str) -> str:
    return ref.removeprefix("tuneplane-")


# --- racing for cards -----------------------------------------------------------------


async def race(node: Console, *, launches: int, gpus: int) -> dict[str, list[int]]:
    """Start launches all at once; the cards each successful run was answered with."""
    run_ids = [unique("race") for _ in range(launches)]
    answers = await asyncio.gather(*(try_launch(node, gpus, run_id) for run_id in run_ids))
    statuses = sorted(status for status, _ in answers)
    assert set(statuses) <= {200, 409}, answers
    for status, body in answers:
        if status == 409:
            assert "not enough GPUs" in body["detail"], body
        else:
            assert body["phase"] == "running" and len(body["gpus"]) == gpus, body
    return {
        run_id: body["gpus"]
        for run_id, (status, body) in zip(run_ids, answers, strict=True)
        if status == 200
    }
