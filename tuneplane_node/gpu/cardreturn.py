"""A card goes back to the pool only clean.

Crashed jobs have left tens of gigabytes of a card's memory held, by a process that
outlived its container or by the driver, for hours after the container was gone. So when
the container holding a card is gone, the card is ``draining`` until the driver shows no
compute process on it and its used memory back at its baseline (`BASELINE_MARGIN_MIB`
over the least the card used while free and idle, as the node saw it); a draining card
is given to no launch. Past ``TUNEPLANE_GPU_DRAIN_TIMEOUT_S`` it stays draining, and its
reason says it is stuck. Where the driver cannot list processes, the card is free at once
(as before: the node cannot tell). A restart forgets which cards drain: a process left
on one is then an outside process, and the card is kept from launches so.
Used on the event loop only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tuneplane_node.clock import Clock
from tuneplane_node.gpu.probe import CardFacts, GpuSnapshot

log = logging.getLogger(__name__)
BASELINE_MARGIN_MIB = 512
"""Used memory over a card's idle baseline that still counts as clean (the driver's own
allocations move by some hundreds of MiB)."""


@dataclass
class _Draining:
    since: float  # monotonic
    run_id: str


class CardReturns:
    """Which cards drain, from one occupancy to the next."""

    def __init__(self, *, clock: Clock, timeout_s: float) -> None:
        self.clock = clock
        self.timeout_s = timeout_s
        self._held: Mapping[int, str] = {}  # the last occupancy's cards held, to their run
        self._draining: dict[int, _Draining] = {}
        self._baseline: dict[int, int] = {}  # the least used MiB seen on a free, idle card

    def handed(self, cards: Iterable[int], run_id: str) -> None:
        """These cards went to a run (its claim is over): held, as far as the next
        occupancy knows, though none was built while the run held them."""
        self._held = {**self._held, **dict.fromkeys(cards, run_id)}

    def draining(self, by_job: Mapping[int, str], gpus: GpuSnapshot) -> dict[int, str]:
        """The cards draining now (index to why), given the cards held now and the
        driver's reading; learns each free card's baseline."""
        cards = {card.index: card for card in gpus.cards}
        for index, run_id in self._held.items():
            if index not in by_job and index not in self._draining:
                self._draining[index] = _Draining(self.clock.monotonic(), run_id)
        self._held = dict(by_job)
        for index in list(self._draining):
            if index in by_job:  # handed out again: a launch of its own run, after a restart
                del self._draining[index]
        answer: dict[int, str] = {}
        for index, drain in list(self._draining.items()):
            why = self._unclean(cards.get(index), gpus)
            if why is None:
                log.info("GPU %d: clean after run %s: free", index, drain.run_id)
                del self._draining[index]
                continue
            waited = self.clock.monotonic() - drain.since
            stuck = f"; stuck for {waited:.0f} s" if waited >= self.timeout_s else ""
            answer[index] = f"after run {drain.run_id}: {why}{stuck}"
        self._learn(cards, by_job, gpus)
        return answer

    def _unclean(self, card: CardFacts | None, gpus: GpuSnapshot) -> str | None:
        """Why the card is not clean yet; None: clean, or the driver cannot tell."""
        if card is None or not (gpus.ok and gpus.processes_ok):
            return None
        if card.processes:
            pids = ", ".join(str(p.pid) for p in card.processes)
            return f"compute process {pids} still on it"
        used, base = card.memory_used_mib, self._baseline.get(card.index, 0)
        if used is not None and used > base + BASELINE_MARGIN_MIB:
            return f"{used} MiB of its memory used, its baseline {base} MiB"
        return None

    def _learn(
        self, cards: Mapping[int, CardFacts], by_job: Mapping[int, str], gpus: GpuSnapshot
    ) -> None:
        if not (gpus.ok and gpus.processes_ok):
            return
        for index, card in cards.items():
            idle = index not in by_job and index not in self._draining and not card.processes
            if idle and card.memory_used_mib is not None:
                known = self._baseline.get(index)
                self._baseline[index] = min(card.memory_used_mib, known or card.memory_used_mib)
