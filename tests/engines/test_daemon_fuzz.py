"""An HTTP fuzzer over every verb, against the daemon on a real Docker engine.

Valid requests of each verb are mutated (fields dropped, added, or replaced by hostile
values; bodies truncated or replaced by junk; headers wrong) by a seeded generator.
Whatever comes: no answer is a 5xx, nothing reaches the log as a traceback, and no
request that was refused started a container. The figures are printed (run with ``-s``)
and recorded in docs/reliability.md. ``TUNEPLANE_FUZZ_REQUESTS`` and ``TUNEPLANE_FUZZ_SEED``
change the size and the seed.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import random
import time
from typing import Any

import pytest

from tests.conftest import MakeNode
from tests.support.console import HEADERS, Console
from tests.support.engines import own_docker_host
from tests.support.images import IMAGE, REGISTRY
from tests.support.runtimes import TrackingRuntime
from tuneplane_node.runtime.engines.docker import DockerRuntime
from tuneplane_node.wire.values import LABEL_RUN_ID

pytestmark = [pytest.mark.engine, pytest.mark.own_engines]  # docker-own
REQUESTS = int(os.environ.get("TUNEPLANE_FUZZ_REQUESTS", "10000"))
SEED = int(os.environ.get("TUNEPLANE_FUZZ_SEED", "20261130"))
CONCURRENCY = 8
HOSTILE: list[Any] = [
    None, "", " ", 0, -1, 1.5, 10**401, -(10**30), True, [], {}, [[[[]]]], "x" * 5000,
    "\x00", "\u202e\u0000", "../../etc/passwd", "/", "/etc", "--help", "a b", "UPPER/Case:1",
    "f" * 64, "deadbeef0123", "container:foo", "host", "none", "bridge", "0", "1e308",
    "NaN", "nan", "inf", ["/bin/true"], {"a": "b"}, [1, 2, 3], ["/", "/host", False],
    [["/", "/host", False]], {"NVIDIA_VISIBLE_DEVICES": "all"}, {"tuneplane.gpus": "0"},
    "16g", "1k", "-5", 2**63, 1e308, "²", "🚀", "tuneplane-x", float("inf"), float("nan"),
]  # fmt: skip
# Spellings an engine would read as an image id or prefix, or match by suffix (issue 32).
IMAGE_SPELLINGS = [
    f"sha256:{'0' * 64}", "0" * 64, "d0", "0123456789ab", "sha256:latest",
    "index.docker.io/tuneplane-test/busybox:1", "registry-1.docker.io/library/busybox",
    "busybox:1", "tuneplane-test/busybox@sha256:" + "a" * 64,
]  # fmt: skip


class Fuzzer:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.n = 0

    def request(self) -> tuple[str, str, dict[str, Any], str | None]:
        """(method, path, options for the client, the run id if it is a launch)."""
        self.n += 1
        verb = self.rng.choice(
            ["launch"] * 8 + ["observe"] * 3 + ["stop"] * 2 + ["remove"] * 2 + ["logs"] * 2
            + ["reap", "health", "inventory", "junk"]
        )  # fmt: skip
        run_id = f"fuzz-{SEED}-{self.n}"
        if verb == "launch":
            return "POST", "/node/v1/launch", self._body(self._launch(run_id)), run_id
        if verb == "observe":
            refs = [f"tuneplane-fuzz-{SEED}-{self.rng.randrange(self.n)}" for _ in range(3)]
            return "POST", "/node/v1/observe", self._body({"refs": refs}), None
        if verb in ("stop", "remove"):
            body = {"ref": self._ref(), **({"timeout": 0} if verb == "stop" else {})}
            return "POST", f"/node/v1/{verb}", self._body(body), None
        if verb == "logs":
            params = {"ref": self._ref(), "tail": self.rng.choice(["10", "0", "x", "²", "100001"])}
            query = {key: str(value) for key, value in self._mutated(params).items()}
            return "GET", "/node/v1/logs", {"params": query, "headers": self._headers()}, None
        if verb == "reap":
            return "POST", "/node/v1/reap", self._body({"max_age_s": 3600}), None
        if verb == "junk":
            path = self.rng.choice(
                ["/node/v1/exec", "/node/v1/launch/../health", "/", "/node/v2/x"]
            )
            return self.rng.choice(["GET", "POST", "PUT", "DELETE"]), path, self._body({}), None
        return "GET", f"/node/v1/{verb}", {"headers": self._headers()}, None

    def _ref(self) -> Any:
        """A ref of the node's shape, or a hostile value of any JSON type."""
        return self.rng.choice(
            [f"tuneplane-fuzz-{SEED}-{self.rng.randrange(self.n)}", self.rng.choice(HOSTILE)]
        )

    def _launch(self, run_id: str) -> dict[str, Any]:
        others = [f"{REGISTRY}/fuzz/none:{self.n}", self.rng.choice(IMAGE_SPELLINGS)]
        image = self.rng.choice([IMAGE] * 6 + others)
        container = {"name": "", "image": image, "command": ["/bin/true"], "env": {}, "gpus": [],
                     "mounts": [], "labels": {}, "workdir": "", "shm_size": "", "cpu_limit": "",
                     "memory_limit": "", "network": "", "user": ""}  # fmt: skip
        return {
            "run_id": run_id,
            "requested_gpus": self.rng.choice([0, 0, 1, 5]),
            "container": container,
        }

    def _mutated(self, body: dict[str, Any]) -> dict[str, Any]:
        body = json.loads(json.dumps(body))
        for _ in range(self.rng.choice([0, 1, 1, 2, 3])):
            target = body
            if (
                "container" in body
                and self.rng.random() < 0.7
                and isinstance(body["container"], dict)
            ):
                target = body["container"]
            action = self.rng.random()
            key = self.rng.choice(list(target) or ["x"])
            if action < 0.15:
                target.pop(key, None)
            elif action < 0.25:
                target[self.rng.choice(["comand", "privileged", "devices", "", "\x00"])] = True
            elif key not in ("run_id",):
                target[key] = self.rng.choice(HOSTILE)
        return body

    def _body(self, body: dict[str, Any]) -> dict[str, Any]:
        roll = self.rng.random()
        if roll < 0.85:
            data = json.dumps(self._mutated(body)).encode()  # may hold Infinity and NaN
        elif roll < 0.9:
            data = json.dumps(body).encode()[: self.rng.randrange(1, 40)]  # cut short
        elif roll < 0.95:
            data = bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(64)))
        else:
            data = b"[" * 50_000 + b"]" * 50_000
        return {"data": data, "headers": self._headers()}

    def _headers(self) -> dict[str, str]:
        roll = self.rng.random()
        if roll < 0.93:
            return dict(HEADERS)
        if roll < 0.96:
            return {**HEADERS, "Authorization": "Bearer wrong"}
        return {**HEADERS, "X-TunePlane-Node-Protocol": self.rng.choice(["2", "", "1.0", "x"])}


@pytest.mark.timeout(1800)  # minutes on a quiet machine, several times that on a loaded one
async def test_ten_thousand_hostile_requests_get_no_5xx_and_start_nothing_refused(
    make_node: MakeNode, own_docker: TrackingRuntime, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    node = await make_node(
        feed=own_docker, docker_host=own_docker_host(), local_gpu_count=2, local_stop_timeout=0
    )
    fuzzer = Fuzzer(random.Random(SEED))
    statuses: collections.Counter[int] = collections.Counter()
    refused: set[str] = set()
    accepted: set[str] = set()
    failures: list[str] = []
    started = time.monotonic()

    async def one(method: str, path: str, options: dict[str, Any], run_id: str | None) -> None:
        status, text = await call(node, method, path, options)
        statuses[status] += 1
        if status >= 500:
            failures.append(f"{status} {method} {path} {options}: {text[:300]}")
        if run_id is not None:
            (accepted if status == 200 else refused).add(run_id)

    pending: set[asyncio.Task[None]] = set()
    for _ in range(REQUESTS):
        if len(pending) >= CONCURRENCY:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        pending.add(asyncio.create_task(one(*fuzzer.request())))
    await asyncio.gather(*pending)
    elapsed = time.monotonic() - started

    docker = own_docker.inner
    assert isinstance(docker, DockerRuntime)
    labelled = await docker.pool.call(
        docker.api.containers, all=True, filters={"label": LABEL_RUN_ID}
    )
    own_docker.made.extend(entry["Names"][0].lstrip("/") for entry in labelled)
    started_by_refused = [e for e in labelled if e["Labels"][LABEL_RUN_ID] in refused]
    tracebacks = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    print(
        f"\nfuzz: {REQUESTS} requests (seed {SEED}) in {elapsed:.1f} s; statuses "
        f"{dict(sorted(statuses.items()))}; {len(accepted)} launches accepted, "
        f"{len(refused)} refused, {len(started_by_refused)} containers of refused launches"
    )
    assert failures == [], failures[:5]
    assert tracebacks == [], [r.getMessage() for r in tracebacks[:5]]
    assert started_by_refused == []
    assert sum(statuses.values()) == REQUESTS


async def call(node: Console, method: str, path: str, options: dict[str, Any]) -> tuple[int, str]:
    async with node.client.request(method, path, **options) as response:
        return response.status, await response.text()
