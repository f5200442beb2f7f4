"""A GPU probe answering what the test set: the fast tests' cards."""

from __future__ import annotations

from types import MappingProxyType

from tuneplane_node.gpu.probe import CardFacts, GpuProcess, GpuSnapshot


class FakeProbe:
    """A GPU probe answering what the test set: cards, faults, processes, links."""

    source = "simulation"
    blocking = False
    reading_ttl_s = 0.0

    def __init__(self, cards: int = 4) -> None:
        self.cards = {index: CardFacts(index, name="NVIDIA H100") for index in range(cards)}
        self.links: dict[tuple[int, int], str] = {}
        self.ok = True
        self.reads = 0

    def set(self, index: int, *, unhealthy: str | None = None, pids: tuple[int, ...] = ()) -> None:
        processes = tuple(GpuProcess(pid, 100) for pid in pids)
        self.cards[index] = CardFacts(
            index, name="NVIDIA H100", unhealthy=unhealthy, processes=processes
        )

    def snapshot(self) -> GpuSnapshot:
        self.reads += 1
        if not self.ok:
            return GpuSnapshot.failed(self.source, "the test says no")
        return GpuSnapshot(
            source=self.source,
            ok=True,
            error=None,
            driver="580.159.03",
            cuda="13.0",
            cards=tuple(self.cards[index] for index in sorted(self.cards)),
            processes_ok=True,
            links=MappingProxyType(dict(self.links)),
        )

    def close(self) -> None:
        return None
