"""A card's fault scoped to the job, the card or the machine (issue 53): the driver's
recovery action first, the operator's XID tables second, the standing faults; and how
long each holds. Through the simulation file, as the daemon's probe reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.clock import FakeClock
from tests.nvmlprobe import settings
from tuneplane_node.gpu.breaker import CardBreaker
from tuneplane_node.gpu.cardreturn import CardReturns
from tuneplane_node.gpu.probe import CardFacts, GpuProcess, GpuSnapshot
from tuneplane_node.gpu.simulation import SimulatedProbe


def write(path: Path, **card: Any) -> None:
    path.write_text(json.dumps({"driver": "580", "cuda": "12.4", "cards": [{"index": 0, **card}]}))


@pytest.fixture
def sim(tmp_path: Path) -> Path:
    return tmp_path / "gpus.json"


def fault(probe: SimulatedProbe) -> tuple[str, str, bool] | None:
    """(scope, cause, out of the pool) of card 0; None: no fault."""
    card = probe.snapshot().cards[0]
    return (
        None if card.fault is None else (card.fault.scope, card.fault.cause, bool(card.unhealthy))
    )


def probe_for(sim: Path, clock: FakeClock, **values: Any) -> SimulatedProbe:
    return SimulatedProbe(sim, settings(gpu_simulation_file=sim, **values), clock=clock)


@pytest.mark.parametrize(
    ("xids", "expected"),
    [([13], ("job", "XID 13", False)), ([94], ("job", "XID 94", False)),
     ([48], ("card", "XID 48", True)), ([109], ("card", "XID 109", True)),
     ([31, 120], ("card", "XID 120", True)), ([79], ("node", "XID 79", True)),
     ([13, 79, 48], ("node", "XID 79", True)), ([999], ("card", "XID 999", True))],
)  # fmt: skip
def test_an_xid_is_scoped_by_the_catalogs_tables(
    sim: Path, clock: FakeClock, xids: list[int], expected: tuple[str, str, bool]
) -> None:
    write(sim, xid=xids)
    assert fault(probe_for(sim, clock)) == expected


def test_the_operators_tables_move_an_xid_and_an_ignored_one_is_nothing(
    sim: Path, clock: FakeClock
) -> None:
    write(sim, xid=[48])
    assert fault(probe_for(sim, clock, gpu_xid_job=[48], gpu_xid_card=[])) == (
        "job", "XID 48", False,
    )  # fmt: skip
    assert fault(probe_for(sim, clock, gpu_xid_ignore=[48])) is None
    assert fault(probe_for(sim, clock, gpu_xid_node=[48])) == ("node", "XID 48", True)


@pytest.mark.parametrize(
    ("action", "xids", "expected"),
    [("NODE_REBOOT", [], ("node", "NODE_REBOOT", True)),
     ("GPU_RESET", [13], ("card", "GPU_RESET", True)),
     ("DRAIN_AND_RESET", [], ("card", "DRAIN_AND_RESET", True)),
     ("DRAIN_P2P", [], ("card", "DRAIN_P2P", True)),
     ("NONE", [48], ("job", "XID 48", False)),  # the driver asks nothing: the job's
     ("NONE", [], None)],
)  # fmt: skip
def test_the_drivers_recovery_action_comes_before_the_tables(
    sim: Path, clock: FakeClock, action: str, xids: list[int], expected: Any
) -> None:
    write(sim, recovery_action=action, xid=xids)
    assert fault(probe_for(sim, clock)) == expected


def test_a_card_fault_holds_until_the_card_is_reset_and_reads_clean(
    sim: Path, clock: FakeClock
) -> None:
    probe = probe_for(sim, clock, gpu_xid_quarantine_s=60)
    write(sim, xid=[48], resets=3)
    assert fault(probe) == ("card", "XID 48", True)
    write(sim, resets=3)
    clock.t += 3600  # time alone never brings back a card whose resets are counted
    assert fault(probe) == ("card", "XID 48", True)
    write(sim, resets=4, ecc_uncorrected=2)  # reset, but not clean
    assert fault(probe) == ("card", "uncorrectable ECC errors: 2", True)
    write(sim, resets=4)
    assert fault(probe) is None


def test_a_recovery_action_holds_until_the_driver_says_none(sim: Path, clock: FakeClock) -> None:
    probe = probe_for(sim, clock)
    write(sim, recovery_action="GPU_RESET", xid=[119])
    assert fault(probe) == ("card", "GPU_RESET, XID 119", True)  # each cause of its scope
    write(sim)  # the driver cannot say now: not a reset
    assert fault(probe) == ("card", "GPU_RESET, XID 119", True)
    write(sim, recovery_action="NONE")
    assert fault(probe) is None


def test_a_job_fault_is_shown_for_the_quarantine_then_goes(sim: Path, clock: FakeClock) -> None:
    probe = probe_for(sim, clock, gpu_xid_quarantine_s=60)
    write(sim, xid=[13])
    assert fault(probe) == ("job", "XID 13", False)
    write(sim)
    clock.t += 59
    assert fault(probe) == ("job", "XID 13", False)
    clock.t += 2
    assert fault(probe) is None


def test_a_lost_card_is_the_machines_fault_while_it_does_not_answer(
    sim: Path, clock: FakeClock
) -> None:
    probe = probe_for(sim, clock)
    write(sim, lost=True)
    assert fault(probe) == ("node", "lost: not answering", True)
    write(sim)
    assert fault(probe) is None


def test_a_bad_recovery_action_in_the_file_is_refused(sim: Path, clock: FakeClock) -> None:
    write(sim, recovery_action="REBOOT_PLEASE")
    snapshot = probe_for(sim, clock).snapshot()
    assert not snapshot.ok and "recovery_action" in (snapshot.error or "")


def test_the_breaker_counts_an_hour_and_decides_each_fault_once(clock: FakeClock) -> None:
    breaker = CardBreaker(2, clock=clock)
    assert [breaker.admits(n, f"GPU {n}") for n in range(4)] == [True, True, False, False]
    assert breaker.admits(2, "GPU 2") is False  # decided once
    assert (breaker.state().taken, breaker.state().kept_in) == (2, 2)
    clock.t += 3600
    assert breaker.admits(9, "GPU 9") is True  # an hour on: the count has room again
    breaker.reset()
    assert breaker.state().kept_in == 0 and breaker.admits(3, "GPU 3") is False  # stays in


def test_a_draining_card_past_its_timeout_says_it_is_stuck(clock: FakeClock) -> None:
    returns = CardReturns(clock=clock, timeout_s=600)
    held = GpuSnapshot("simulation", True, None, None, None, (CardFacts(0),), True, {})
    returns.draining({0: "r1"}, held)
    leftover = (CardFacts(0, memory_used_mib=20480, processes=(GpuProcess(7, 20480),)),)
    left = GpuSnapshot("simulation", True, None, None, None, leftover, True, {})
    assert returns.draining({}, left) == {0: "after run r1: compute process 7 still on it"}
    clock.t += 600
    assert returns.draining({}, left)[0].endswith("; stuck for 600 s")
    clean = GpuSnapshot(
        "simulation", True, None, None, None, (CardFacts(0, memory_used_mib=300),), True, {}
    )
    assert returns.draining({}, clean) == {}
