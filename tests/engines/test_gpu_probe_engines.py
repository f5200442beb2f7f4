"""The NVML probe on a real driver: the test of tests/unit/test_gpu_probe.py that needs
the hardware."""

from __future__ import annotations

import pytest

from tests.nvmlprobe import nvml_library_loads, settings
from tuneplane_node.gpu import numa
from tuneplane_node.gpu.factory import make_probe


@pytest.mark.engine  # real hardware: outside the fast suite, like an engine
@pytest.mark.skipif(not nvml_library_loads(), reason="needs an NVIDIA driver")
def test_driver_gives_an_nvml_probe_that_lists_cards() -> None:
    probe = make_probe(settings())
    try:
        snap = probe.snapshot()
        assert (snap.ok, snap.source) == (True, "nvml"), snap.error
        assert snap.driver and snap.cards
        assert all(c.memory_total_mib for c in snap.cards)
        # A card's place, where the driver gives one, is on this machine (issue 23).
        machine = numa.node_cpus()
        for card in snap.cards:
            assert card.numa_node is None or card.numa_node in machine, card
            assert set(card.cpus) <= set(numa.online_cpus() or card.cpus), card
    finally:
        probe.close()
