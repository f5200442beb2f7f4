from __future__ import annotations

import itertools
import time

import pytest

from tuneplane_node.gpu.topology import choose_cards


def clique(cards: list[int], kind: str) -> dict[tuple[int, int], str]:
    return {pair: kind for pair in itertools.combinations(cards, 2)}


def test_nvlink_pair_wins_over_lower_indices() -> None:
    assert choose_cards([0, 1, 2, 3], 2, {(2, 3): "nvlink"}) == [2, 3]


def test_pcie_switch_group_when_no_nvlink_set_is_big_enough() -> None:
    links = {(0, 1): "nvlink", **clique([4, 5, 6], "pcie_switch")}
    assert choose_cards(range(8), 3, links) == [4, 5, 6]


def test_nvlink_counts_as_better_than_pcie_switch() -> None:
    links = {(0, 1): "nvlink", (0, 2): "pcie_switch", (1, 2): "pcie_switch"}
    links |= clique([5, 6, 7], "pcie_switch")
    assert choose_cards(range(8), 3, links) == [0, 1, 2]


def test_numa_group_beats_scattered_cards() -> None:
    links = {(0, 1): "pcie_switch", **clique([2, 3, 4, 5], "numa")}
    assert choose_cards(range(8), 4, links) == [2, 3, 4, 5]


def test_weakest_pair_decides() -> None:
    # 0-1-2 is nvlink except 0-2 (across the system): the set is only as good as 0-2.
    links = {(0, 1): "nvlink", (1, 2): "nvlink", **clique([3, 4, 5], "numa")}
    assert choose_cards(range(6), 3, links) == [3, 4, 5]


def test_no_links_gives_lowest_free_indices() -> None:
    assert choose_cards([7, 3, 5, 1], 2, {}) == [1, 3]


def test_only_free_cards_are_chosen() -> None:
    # 2-3 is an nvlink pair but 3 is taken.
    assert choose_cards([0, 1, 2, 4], 2, {(2, 3): "nvlink", (0, 4): "pcie_switch"}) == [0, 4]


def test_pair_given_high_first_counts() -> None:
    assert choose_cards([0, 1, 2, 3], 2, {(3, 2): "nvlink"}) == [2, 3]


def test_one_card_is_the_lowest() -> None:
    assert choose_cards([4, 2, 3], 1, {(3, 4): "nvlink"}) == [2]


def test_all_free_cards() -> None:
    assert choose_cards([3, 1, 2, 0], 4, {(0, 1): "nvlink"}) == [0, 1, 2, 3]


def test_zero_cards() -> None:
    assert choose_cards([0, 1], 0, {}) == []


def test_too_many_cards_is_an_error() -> None:
    with pytest.raises(ValueError, match="asked for 3 cards, only 2 free"):
        choose_cards([0, 1], 3, {})


def test_sixteen_cards_search_every_set() -> None:
    links = clique(list(range(8, 16)), "nvlink") | clique(list(range(8)), "pcie_switch")
    assert choose_cards(range(16), 8, links) == list(range(8, 16))


def test_many_cards_stay_fast_and_still_find_a_group() -> None:
    links = clique(list(range(16, 24)), "nvlink")
    started = time.monotonic()
    assert choose_cards(range(32), 8, links) == list(range(16, 24))
    assert time.monotonic() - started < 2


# --- packing by NUMA node -------------------------------------------------------------

SOCKETS = {card: card // 4 for card in range(8)}  # two sockets of four cards


def test_one_card_goes_to_the_socket_already_in_use() -> None:
    # Card 4 is held: a one-card job fills socket 1, not socket 0's lowest card.
    assert choose_cards([0, 1, 2, 3, 5, 6, 7], 1, {}, nodes=SOCKETS) == [5]


def test_cards_on_one_node_are_a_numa_pair_without_a_listed_link() -> None:
    # Without the nodes, the lowest four (across both sockets); with them, one socket.
    assert choose_cards([1, 2, 3, 4, 5, 6, 7], 4, {}) == [1, 2, 3, 4]
    assert choose_cards([1, 2, 3, 4, 5, 6, 7], 4, {}, nodes=SOCKETS) == [4, 5, 6, 7]


def test_a_two_card_job_fills_the_fuller_socket() -> None:
    assert choose_cards([0, 1, 2, 3, 6, 7], 2, {}, nodes=SOCKETS) == [6, 7]


def test_a_better_link_still_wins_over_packing() -> None:
    links = {(0, 1): "nvlink"}  # socket 0 is empty, socket 1 holds a job on card 4
    assert choose_cards([0, 1, 2, 3, 5, 6, 7], 2, links, nodes=SOCKETS) == [0, 1]


def test_packing_among_nvlinked_cards_keeps_a_socket_whole() -> None:
    everything = clique(list(range(8)), "nvlink")  # an NVSwitch board: all joined
    assert choose_cards([0, 1, 2, 3, 5, 6, 7], 3, everything, nodes=SOCKETS) == [5, 6, 7]


def test_cards_of_unknown_node_are_chosen_as_before() -> None:
    assert choose_cards([0, 1, 2, 3, 5, 6, 7], 1, {}, nodes={}) == [0]
