"""The views observe answers for a container with the service's facts beside it: kept
while those facts hold, so an observe of 300 running jobs (each with its disk's figures)
makes no 300 new views (a frozen dataclass costs microseconds to make)."""

from __future__ import annotations

from tuneplane_node.jobs.observe.watch import ChangeFeed
from tuneplane_node.jobs.words.launch import Stopping
from tuneplane_node.jobs.words.views import DiskFigures, StoppedView
from tuneplane_node.runtime.base import ContainerState

View = ContainerState | StoppedView
Facts = tuple[object, object, object, str | None]
"""What observe's view of a container is made of beside it: the node state, the disk
monitor's measures, the stop under way, its card's job fault."""
Answered = tuple[ContainerState, str, object, object, object, "str | None", View]
"""A kept answer: the state, the ref, the four facts, the view (flat: observe checks 300
of them per call, and a nested tuple's compare through `all` was a third of its time)."""
MAX_KEPT = 4096
"""Views kept at most; past it they are all dropped (old states go, memory stays bounded)."""


class StoppedViews:
    """`StoppedView`s by their state object (the state cache hands out the same one until
    the engine changes it): the same view while its state, reason, stop under way and
    disk figures are the same objects or values. Used on the event loop only."""

    def __init__(self) -> None:
        self._kept: dict[int, StoppedView] = {}  # id(state) -> its view: it keeps it alive
        self._answered: dict[int, Answered] = {}  # id(state) -> its kept answer

    def answered(self, state: ContainerState, ref: str, facts: Facts) -> View | None:
        """The view observe made of this state object for ``ref`` while the facts it was
        made of are the same: the node state and the disk monitor's measures are
        replaced, never changed, a stop under way is one object per phase, and a card's
        job fault is its text. None: make it again, and keep it (`answer`). Observe of
        300 refs made each view again through four calls per ref."""
        kept = self._answered.get(id(state))
        if (
            kept is not None
            and kept[0] is state
            and kept[2] is facts[0]
            and kept[3] is facts[1]
            and kept[4] is facts[2]
            and kept[5] == facts[3]
            and kept[1] == ref
        ):
            return kept[6]
        return None

    def answer(self, state: ContainerState, ref: str, facts: Facts, view: View) -> View:
        if len(self._answered) >= MAX_KEPT:
            self._answered.clear()
        self._answered[id(state)] = (state, ref, *facts, view)
        return view

    def of(
        self,
        state: ContainerState,
        reason: str | None,
        stopping: Stopping | None,
        disk: DiskFigures | None,
        fault: str | None = None,
    ) -> StoppedView:
        kept = self._kept.get(id(state))
        if (
            kept is not None
            and kept.state is state
            and kept.stop_reason == reason
            and kept.stopping is stopping
            and (kept.disk is disk or kept.disk == disk)
            and kept.gpu_fault == fault
        ):
            return kept
        if len(self._kept) >= MAX_KEPT:
            self._kept.clear()
        view = self._kept[id(state)] = StoppedView(state, reason, stopping, disk, fault)
        return view


class ChangeCount:
    """How often the node's sources said a job may read differently: an ear of the
    `ChangeFeed` (a stop's phase, a pending launch's, a card's job fault, the node's
    notices), listening from its making. One part of `Observed`. Used on the loop only."""

    def __init__(self, feed: ChangeFeed) -> None:
        self.count = 0
        feed.listen(self)

    def changed(self, ref: str) -> None:
        self.count += 1

    def progressed(self, ref: str) -> None:
        """A pending launch's pull: an answer holding a pending launch is never kept."""

    def node_changed(self) -> None:
        self.count += 1


class Observed:
    """What every observe answer of containers is made of now, besides the refs: the
    state cache's generation (it moves with every container the engine changes), the
    sources' changes (`ChangeCount`: a card's job fault is one), the node state (stop
    reasons, what a job stopped for its disk had written) and the disk monitor's
    measures, these two replaced, never changed, when they move, and told to no feed.
    While all are the same, an answer for the same refs is the same bytes
    (`daemon.render.ObserveAnswers`)."""

    __slots__ = ("generation", "measured", "node", "told")

    def __init__(self, generation: int, told: int, node: object, measured: object) -> None:
        self.generation, self.told, self.node, self.measured = generation, told, node, measured

    def same(self, other: Observed) -> bool:
        return (
            self.generation == other.generation
            and self.told == other.told
            and self.node is other.node
            and self.measured is other.measured
        )
