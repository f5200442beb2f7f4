"""A test node: its directories, its services over a test's runtime, and the promises it
keeps, checked against the engine's truth."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from tests.support.console import Console
from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.daemon.state import NODE
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.gpu.probe import GpuProbe
from tuneplane_node.jobs import Node, PendingView
from tuneplane_node.jobs.node import build_node
from tuneplane_node.runtime.base import ContainerRuntime
from tuneplane_node.runtime.cache import CachedRuntime
from tuneplane_node.settings import NodeSettings
from tuneplane_node.wire.values import FAILED


def state_dir(tmp_path: Path) -> Path:
    """A test node's state directory."""
    return tmp_path / "state"


def storage_root(tmp_path: Path) -> Path:
    """A test node's storage root (made): a directory of its own, beside the node's state
    and the test's token, TLS and auth files, which a mount root may not hold."""
    root = tmp_path / "storage"
    root.mkdir(exist_ok=True)
    return root


def node_cache(node: Console) -> CachedRuntime:
    """The state cache a daemon on an engine sits on (`make_node`'s, as in production)."""
    runtime = node.app[NODE].runtime
    assert isinstance(runtime, CachedRuntime), runtime
    return runtime


def fake_node_of(
    runtime: ContainerRuntime,
    settings: NodeSettings,
    *,
    probe: GpuProbe | None = None,
    allocator: GpuAllocator | None = None,
    clock: Clock = SYSTEM_CLOCK,
    port_held: bool = False,
) -> Node:
    """The node's services over a test's runtime and cards, made as production makes
    them (`build_node`); the test starts and closes it."""
    if allocator is None:
        allocator = GpuAllocator(runtime, settings, probe=probe)
    return build_node(
        settings, runtime=runtime, allocator=allocator, clock=clock, port_held=port_held
    )


ENGINE_LIVE = frozenset({"running", "created", "restarting", "paused"})  # holds its cards


async def check_promises(
    node: Node,
    truth: Mapping[str, tuple[str, tuple[int, ...]]],
    *,
    cards: int,
    wrecks_allowed: Collection[str] = (),
) -> None:
    """The six promises of `test_jobs_service_model.py`. ``truth``: every container of the node
    on the engine, by name, as (its status, the cards on its label); ``wrecks_allowed``:
    created, never-started containers no sweep was due to take yet."""
    live = {name: held for name, (status, held) in truth.items() if status in ENGINE_LIVE}
    labelled = [card for held in live.values() for card in held]
    assert len(labelled) == len(set(labelled)), f"a card on two jobs: {live}"
    occupancy = await node.allocator.occupancy()
    assert set(occupancy.by_job) == set(labelled), (dict(occupancy.by_job), labelled)
    pending = {r.ref: r for r in node.pending.records() if r.phase != FAILED}
    claimed = {ref for ref, claim in occupancy.claims.items() if claim}
    wanted = {ref for ref, r in pending.items() if r.request.requested_gpus}
    assert claimed == wanted, (claimed, wanted)
    # Every card is in exactly one place: available, held, reserved, or kept back
    # (unhealthy, or used outside the node) while nobody holds or claims it.
    held, reserved, available = set(labelled), set(occupancy.reserved), set(occupancy.available)
    kept = (set(occupancy.unhealthy) | set(occupancy.external)) - held - reserved
    places = [available, held, reserved, kept]
    assert sum(map(len, places)) == cards and set().union(*places) == set(range(cards)), places
    assert not set(pending) & set(truth), "a ref both pending and a container"
    wrecks = {n for n, (status, _) in truth.items() if status == "created" and n not in pending}
    stray = wrecks - set(wrecks_allowed)
    assert not stray, f"created, never started, no launch making them: {stray}"
    views = await node.jobs.observe([*truth, *pending])
    for ref, view in views.items():
        assert view.exists, f"{ref} exists, observe says not"
        assert isinstance(view, PendingView) == (ref in pending)
