"""The views observe answers for a container with the service's facts beside it: kept
while those facts hold, so an observe of 300 running jobs (each with its disk's figures)
makes no 300 new views (a frozen dataclass costs microseconds to make)."""

from __future__ import annotations

from tuneplane_node.jobs.observe.results import DiskFigures, StoppedView, Stopping
from tuneplane_node.runtime.base import ContainerState

MAX_KEPT = 4096
"""Views kept at most; past it they are all dropped (old states go, memory stays bounded)."""


class StoppedViews:
    """`StoppedView`s by their state object (the state cache hands out the same one until
    the engine changes it): the same view while its state, reason, stop under way and
    disk figures are the same objects or values. Used on the event loop only."""

    def __init__(self) -> None:
        self._kept: dict[int, StoppedView] = {}  # id(state) -> its view: it keeps it alive

    def of(
        self,
        state: ContainerState,
        reason: str | None,
        stopping: Stopping | None,
        disk: DiskFigures | None,
    ) -> StoppedView:
        kept = self._kept.get(id(state))
        if (
            kept is not None
            and kept.state is state
            and kept.stop_reason == reason
            and kept.stopping is stopping
            and (kept.disk is disk or kept.disk == disk)
        ):
            return kept
        if len(self._kept) >= MAX_KEPT:
            self._kept.clear()
        view = self._kept[id(state)] = StoppedView(state, reason, stopping, disk)
        return view
