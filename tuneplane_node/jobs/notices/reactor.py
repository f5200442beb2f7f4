"""NoticeReactor: what the node does with the notices that stand.

A notice that ends the jobs (a preemption, a termination, maintenance that reboots or
stops the machine, the OS's shutdown) cordons the node with the notice as its reason
and drains it on the notice's clock: every job gets its warning signal at once (the
job's own, else the node's: the stopper's rule for every stop the node makes on its
own) and its stop ends by the deadline less ``TUNEPLANE_CLOUD_NOTICE_MARGIN_S``; observe
then says ``stop_reason: "preempted: aws"`` (or ``maintenance: gcp``). A more urgent
notice drains again on its clock. A notice that does not end the jobs (a rebalance
recommendation, a live migration) only cordons. A notice withdrawn (GCP's ``NONE``
again, an Azure event gone) undoes what it made and nothing else: a state the operator
set since stays. Each change is told (`changed`) to whoever shows notices: health, the
metrics, the watch.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import datetime

from tuneplane_node.clock import Clock
from tuneplane_node.errors import NodeError
from tuneplane_node.jobs.drain import NodeStateKeeper
from tuneplane_node.jobs.words.notices import Notice, Standing
from tuneplane_node.wire.values import DRAINED, DRAINING, StopPlan

log = logging.getLogger(__name__)


def plan_for(
    deadline: datetime | None, now: datetime, *, margin_s: float, stop_s: float
) -> StopPlan:
    """A drain's stops on a notice's clock: all of them over by the deadline less the
    margin. The warning comes at once and has the budget but the stop's own grace
    (``stop_s`` at most, half the budget at most); a notice without a deadline gets the
    node's stop as any drain would."""
    if deadline is None:
        return StopPlan(grace=stop_s)
    budget = max(0.0, (deadline - now).total_seconds() - margin_s)
    grace = min(stop_s, budget / 2)
    return StopPlan(grace=grace, warn_s=budget - grace)


class NoticeReactor:
    """The notices that stand, and the node's state they make; used on the loop only."""

    def __init__(
        self,
        keeper: NodeStateKeeper,
        *,
        clock: Clock,
        margin_s: float,
        stop_s: float,
        changed: Callable[[], None],
    ) -> None:
        self.keeper = keeper
        self.clock = clock
        self.margin_s = margin_s
        self.stop_s = stop_s
        self.standing: dict[str, Standing] = {}
        self._sorted: tuple[Standing, ...] = ()  # the same object until a notice changes
        self.changed = changed  # told of every change (the change log's feed)

    def drained(self) -> Notice | None:
        """The standing notice whose drain has ended, if the node's state is its."""
        node = self.keeper.node
        standing = self.standing.get(node.notice or "")
        return standing.notice if standing is not None and node.state == DRAINED else None

    def current(self) -> tuple[Standing, ...]:
        """The notices standing now, the most urgent first (one object until they
        change: health's part is made once per object)."""
        return self._sorted

    async def react(self, source: str, notices: Iterable[Notice]) -> None:
        """``source``'s notices standing now: the new ones acted on, the gone ones
        undone. A source's failure never comes here: nothing is withdrawn for it."""
        current = {notice.key: notice for notice in notices}
        ours = {key for key, each in self.standing.items() if each.notice.source == source}
        gone, new = ours - set(current), set(current) - ours
        for key in gone:
            withdrawn = self.standing.pop(key).notice
            log.warning("notice withdrawn: %s", withdrawn.reason)
            await self._guarded(self.keeper.withdrawn(key))
        for key in new:
            self.standing[key] = Standing(current[key], self.clock.now())
            log.warning("notice: %s", current[key].reason)
        if gone or new:
            self._sorted = tuple(sorted(self.standing.values(), key=_urgency))
            await self._act()
            self.changed()

    async def _act(self) -> None:
        """The most urgent notice that ends the jobs drains the node, unless its drain
        (or a more urgent one's) is under way; else the first one cordons it."""
        ending = [each.notice for each in self.current() if each.notice.ends_jobs]
        if ending:
            await self._drain(ending[0])
        elif self.standing:
            first = self.current()[0].notice
            await self._guarded(self.keeper.cordon(first.reason, notice=first.key))

    async def _drain(self, notice: Notice) -> None:
        node = self.keeper.node
        if node.notice == notice.key and node.state in (DRAINING, DRAINED):
            return
        margin = self.margin_s if notice.margin_s is None else notice.margin_s
        plan = plan_for(notice.deadline, self.clock.now(), margin_s=margin, stop_s=self.stop_s)
        log.warning(
            "draining for %s: warnings now, every stop over in %.0f s", notice.reason,
            (plan.grace or 0) + (plan.warn_s or 0),
        )  # fmt: skip
        await self._guarded(
            self.keeper.drain(
                notice.reason, plan, notice=notice.key, stopping_as=notice.stop_reason
            )
        )

    async def _guarded(self, step: Awaitable[object]) -> None:
        """A node-state change whose file could not be written is in force all the
        same: said, not raised (the notice's drain must go on)."""
        try:
            await step
        except NodeError as exc:
            log.error("notice: %s", exc.message)


def _urgency(standing: Standing) -> tuple[bool, float]:
    """Those that end the jobs first, then the earliest deadline (none: last)."""
    deadline = standing.notice.deadline
    return (not standing.notice.ends_jobs, deadline.timestamp() if deadline else float("inf"))
