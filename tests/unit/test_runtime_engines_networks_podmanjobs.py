"""Podman's job networks' prune (`runtime.engines.networks.podmanjobs`): which networks it
takes, and its run after a launch; on the real podman in tests/engines/test_daemon_jobnet.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import requests

from tuneplane_node.runtime.engines.networks.jobnetwork import (
    LABEL_NETWORK_OF,
    LABEL_NETWORK_STORE,
)
from tuneplane_node.runtime.engines.networks.podmanjobs import PruneLater, _prune_networks


def answer(status: int, body: object = None) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    response._content = json.dumps(body).encode()
    return response


class Engine:
    """Podman's API with the job networks of ``owners`` (owner -> its store) and none of
    their containers; the networks it was asked to remove."""

    def __init__(self, owners: dict[str, str]) -> None:
        self.owners = owners
        self.removed: list[str] = []

    def get(self, path: str, params: Any = None) -> requests.Response:
        if path == "/networks/json":
            labels = [{LABEL_NETWORK_OF: o, LABEL_NETWORK_STORE: s} for o, s in self.owners.items()]
            return answer(
                200, [{"name": f"{each[LABEL_NETWORK_OF]}-net", "labels": each} for each in labels]
            )
        return answer(404, {"message": "no such container"})

    def delete(self, path: str, params: Any = None) -> requests.Response:
        self.removed.append(path.removeprefix("/networks/"))
        return answer(204)


def test_a_prune_takes_a_gone_jobs_network_never_one_whose_launch_makes_its_container() -> None:
    engine = Engine({"gone": "/store", "launching": "/store", "elsewhere": "/else"})
    assert _prune_networks(engine, lambda: "/store", {"launching"}) == 1
    assert engine.removed == ["gone-net"]


async def test_a_prune_asked_while_one_runs_runs_once_more_after_it() -> None:
    runs: list[int] = []
    release = asyncio.Event()

    async def prune() -> None:
        runs.append(len(runs))
        await release.wait()

    later = PruneLater(prune)
    later.soon()
    await asyncio.sleep(0)
    later.soon()  # two launches while the first prune runs: one more prune, not two
    later.soon()
    release.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert runs == [0, 1]
    await later.close()


async def test_closing_gives_up_the_prune_under_way() -> None:
    started, finished = asyncio.Event(), asyncio.Event()

    async def prune() -> None:
        started.set()
        await asyncio.Event().wait()  # an engine that does not answer
        finished.set()

    later = PruneLater(prune)
    later.soon()
    await started.wait()
    await later.close()
    assert not finished.is_set()
