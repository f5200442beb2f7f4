"""Which free cards a multi-GPU job gets: the best-connected set, then the lowest indices.

Collective traffic between a job's cards runs at the speed of its slowest pair, so a
set is as good as its worst link: all-NVLink beats all-under-one-PCIe-switch beats
all-on-one-NUMA-node beats anything.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable, Mapping, Sequence

log = logging.getLogger(__name__)

# Rank of a link kind; a pair with no entry meets across the system (rank 0).
RANK = {"nvlink": 3, "pcie_switch": 2, "numa": 1}
# Past this many candidate sets (16 choose 8 = 12870), search greedily instead.
MAX_EXHAUSTIVE = 12870

_Joined = Callable[[int, int], bool]


def choose_cards(free: Sequence[int], n: int, links: Mapping[tuple[int, int], str]) -> list[int]:
    """``n`` cards from ``free``, best-connected first; among equals the lowest indices.

    Raises ValueError when fewer than ``n`` cards are free.
    """
    cards = sorted(set(free))
    if n <= 0:
        return []
    if n > len(cards):
        raise ValueError(f"asked for {n} cards, only {len(cards)} free: {cards}")
    if n == 1:
        return cards[:1]
    ranks = _ranks(links)
    for tier in sorted(set(RANK.values()), reverse=True):
        group = _first_joined(cards, n, ranks, tier)
        if group is not None:
            return group
    return cards[:n]


def _ranks(links: Mapping[tuple[int, int], str]) -> dict[tuple[int, int], int]:
    ranks: dict[tuple[int, int], int] = {}
    for (a, b), kind in links.items():
        ranks[(min(a, b), max(a, b))] = RANK.get(kind, 0)
    return ranks


def _first_joined(
    cards: list[int], n: int, ranks: Mapping[tuple[int, int], int], tier: int
) -> list[int] | None:
    """The lexicographically first set of ``n`` cards whose every pair is at ``tier`` or better."""

    def joined(a: int, b: int) -> bool:
        return ranks.get((min(a, b), max(a, b)), 0) >= tier

    if math.comb(len(cards), n) > MAX_EXHAUSTIVE:
        log.debug("%d of %d cards: too many sets to try, choosing greedily", n, len(cards))
        return _greedy(cards, n, joined)
    for group in itertools.combinations(cards, n):
        if all(joined(a, b) for a, b in itertools.combinations(group, 2)):
            return list(group)
    return None


def _greedy(cards: list[int], n: int, joined: _Joined) -> list[int] | None:
    """From each starting card, add the lowest cards joined to all chosen so far."""
    for pos, start in enumerate(cards):
        group = [start]
        for card in cards[pos + 1 :]:
            if all(joined(card, other) for other in group):
                group.append(card)
                if len(group) == n:
                    return group
    return None
