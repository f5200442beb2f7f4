"""FaultReactor: what the node does with its cards' faults, looked at every
``TUNEPLANE_GPU_FAULT_POLL_S``.

Each card's fault is scoped by the probe (`gpu.health`) and counted by the breaker
(`gpu.breaker`); here each new one is acted on once:

- ``job``: shown on the job holding the card (observe's and stats' ``gpu_fault``), nothing
  stopped, the card kept;
- ``card``: the card is out (the allocator's), and the job on it is warned and stopped
  (`Stopper.stop_by_node`: its own warning, else the operator's), observe's
  ``stop_reason`` saying ``gpu_fault: <card uuid> <XID or action>``;
- ``node``: the node is cordoned with that reason and drained, every job warned (a drain
  already under way, a notice's on its clock or the operator's, goes on as it is).

A fault the breaker keeps in is reported, not acted on. Every such event reaches the
change log behind the watch (`changed`, `node_changed`), so a console waiting on
``jobs?watch`` hears it at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Mapping, Sequence

from tuneplane_node.clock import Clock
from tuneplane_node.errors import NodeError
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.gpu.probe import CARD, JOB, NODE, CardFacts, Occupancy
from tuneplane_node.jobs.drain import NodeStateKeeper
from tuneplane_node.jobs.ours import Listing
from tuneplane_node.jobs.stopper import Stopper
from tuneplane_node.logformat import job_fields
from tuneplane_node.runtime.base import RUNNING, ContainerState
from tuneplane_node.tasks import BackgroundTasks, periodically
from tuneplane_node.wire.values import DRAINED, DRAINING, StopPlan

log = logging.getLogger(__name__)
GPU_FAULT = "gpu_fault"


def fault_words(card: CardFacts) -> str:
    """``<card uuid> <cause>``: what a stop reason and a job's note say of the fault."""
    assert card.fault is not None
    return f"{card.uuid or f'gpu {card.index}'} {card.fault.cause}"


class FaultReactor:
    """The cards' faults acted on once each; the jobs' faults kept for observe and
    stats. Used on the loop only."""

    def __init__(
        self,
        allocator: GpuAllocator,
        runtime: Listing,
        *,
        stopper: Stopper,
        keeper: NodeStateKeeper,
        clock: Clock,
        period_s: float,
        changed: Callable[[str], None],
        node_changed: Callable[[], None],
    ) -> None:
        self.allocator = allocator
        self.runtime = runtime
        self.stopper = stopper
        self.keeper = keeper
        self.clock = clock
        self.period_s = period_s
        self.job_faults: Mapping[str, str] = {}  # container name -> its card's job fault
        self.changed = changed  # a job reads differently (the change log's feed)
        self.node_changed = node_changed  # the node does
        self._acted: set[Hashable] = set()
        self._tasks = BackgroundTasks(log)  # the card faults' stops

    async def run(self) -> None:
        """A look now, then every period, as long as the node runs."""
        await periodically(
            self.check, period_s=self.period_s, clock=self.clock, logger=log, what="GPU faults"
        )

    async def check(self) -> None:
        """One look: every new fault acted on, the jobs' faults noted."""
        occupancy = await self.allocator.occupancy()
        gpus = occupancy.gpus
        if gpus is None or not gpus.ok:
            return
        running = [s for s in await self.runtime.ps() if s.ours and s.status in RUNNING]
        on_card = {card.index: [s for s in running if card.index in s.gpus] for card in gpus.cards}
        faulted = [card for card in gpus.cards if card.fault is not None]
        keys = set()
        for card in faulted:
            assert card.fault is not None
            key = (card.index, card.fault.scope, card.fault.since)
            keys.add(key)
            if key not in self._acted:
                self._acted.add(key)
                await self._act(card, on_card[card.index], occupancy)
        self._acted &= keys
        self._note(
            {
                state.name: f"{fault_words(card)} since {card.fault.since}"
                for card in faulted
                if card.fault is not None and card.fault.scope == JOB
                for state in on_card[card.index]
            }
        )

    async def _act(
        self, card: CardFacts, jobs: Sequence[ContainerState], occupancy: Occupancy
    ) -> None:
        assert card.fault is not None
        scope, words = card.fault.scope, fault_words(card)
        if card.index in occupancy.kept_in:
            log.error("GPU %d: %s fault %s kept in by the breaker", card.index, scope, words)
        elif scope == CARD:
            for job in jobs:
                log.warning(
                    "GPU %d: card fault %s: warning and stopping %s", card.index, words,
                    job.name, extra=job_fields(job.name, job.run_id),
                )  # fmt: skip
            if jobs:
                self._tasks.spawn(self._stop(jobs, f"{GPU_FAULT}: {words}"), name="gpu fault stop")
        elif scope == NODE and self.keeper.node.state in (DRAINING, DRAINED):
            # A drain under way (a notice's on its clock, the operator's) goes on as it is.
            log.error("GPU %d: node fault %s: the node drains already", card.index, words)
        elif scope == NODE:
            why = f"{GPU_FAULT}: {words}"
            log.error("GPU %d: node fault %s: cordoning and draining the node", card.index, words)
            try:
                await self.keeper.drain(why, StopPlan(), stopping_as=why)
            except NodeError as exc:  # in force all the same: the drain goes on
                log.error("GPU faults: %s", exc.message)
        self.node_changed()

    async def _stop(self, jobs: Sequence[ContainerState], reason: str) -> None:
        for error in await self.stopper.stop_by_node(jobs, reason):
            log.warning("GPU faults: a stop failed: %s", error)

    def _note(self, faults: dict[str, str]) -> None:
        """The jobs' faults now; each job whose fault came or went reads differently."""
        if faults == self.job_faults:
            return
        moved = set(faults) ^ set(self.job_faults)
        moved |= {ref for ref in faults if self.job_faults.get(ref) != faults[ref]}
        self.job_faults = faults
        for ref in moved:
            self.changed(ref)

    async def close(self) -> None:
        await self._tasks.close()
