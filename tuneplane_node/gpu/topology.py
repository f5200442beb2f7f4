"""Which free cards a job gets: the best-connected set, packed, then the lowest indices.

Collective traffic between a job's cards runs at the speed of its slowest pair, so a
set is as good as its worst link: all-NVLink beats all-under-one-PCIe-switch beats
all-on-one-NUMA-node beats anything. Among sets as good, one on a single NUMA node goes
to the node with the fewest usable cards that still hold it (best fit): small jobs fill
the socket already in use, and a later large job still finds a whole socket free.
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


def choose_cards(
    free: Sequence[int],
    n: int,
    links: Mapping[tuple[int, int], str],
    *,
    nodes: Mapping[int, int] | None = None,
) -> list[int]:
    """``n`` cards from ``free``, best-connected first, then packed by NUMA node
    (``nodes``: card to node, where known); among equals the lowest indices.

    Raises ValueError when fewer than ``n`` cards are free.
    """
    cards = sorted(set(free))
    if n <= 0:
        return []
    if n > len(cards):
        raise ValueError(f"asked for {n} cards, only {len(cards)} free: {cards}")
    places = [*_best_fit(cards, n, nodes or {}), cards]
    if n == 1:
        return places[0][:1]
    ranks = _ranks(links, nodes or {})
    for tier in sorted(set(RANK.values()), reverse=True):
        for place in places:
            group = _first_joined(place, n, ranks, tier)
            if group is not None:
                return group
    return cards[:n]


def _best_fit(cards: list[int], n: int, nodes: Mapping[int, int]) -> list[list[int]]:
    """The free cards of each NUMA node that holds ``n`` of them, fewest first (ties: the
    node with the lowest card). Cards of no known node are in none."""
    by_node: dict[int, list[int]] = {}
    for card in cards:
        if card in nodes:
            by_node.setdefault(nodes[card], []).append(card)
    fitting = [group for group in by_node.values() if len(group) >= n]
    return sorted(fitting, key=lambda group: (len(group), group[0]))


def _ranks(
    links: Mapping[tuple[int, int], str], nodes: Mapping[int, int]
) -> dict[tuple[int, int], int]:
    """Each pair's rank; two cards on one known NUMA node are at least a ``numa`` pair."""
    ranks: dict[tuple[int, int], int] = {}
    for (a, b), kind in links.items():
        ranks[(min(a, b), max(a, b))] = RANK.get(kind, 0)
    for a, b in itertools.combinations(sorted(nodes), 2):
        if nodes[a] == nodes[b]:
            ranks[(a, b)] = max(ranks.get((a, b), 0), RANK["numa"])
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
