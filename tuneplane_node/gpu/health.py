"""The health verdict: fault readings of a card turned into its fault, scoped.

Both real probes (NVML and the simulation file) judge through one `HealthTracker`, so a
fault means the same whichever source read it. The scope of a fault (`probe.SCOPES`):

- the driver's **recovery action** first, where it gives one (NVML's
  ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``, driver 565+): ``GPU_RESET``, ``DRAIN_P2P``,
  ``DRAIN_AND_RESET``, ``BUS_RESET``, ``RECOVER_IMEX_DOMAIN`` take the card out;
  ``NODE_REBOOT``, ``SYSTEM_REBOOT`` the machine; ``NONE`` with an XID tells the job only
  (the driver asks for nothing);
- else the **XID tables** (`XidTable`, the operator's ``TUNEPLANE_GPU_XID_*``);
- the **standing faults** (uncorrectable ECC, pages pending retirement, a failed row
  remap) take the card out while they read so; a card that does not answer has fallen
  off the bus, as XID 79: the machine, while it does not.

An event's card or node fault holds until the card is reset (its reset count grew, or the recovery
action it asked reads ``NONE`` again; where the driver tells neither,
``TUNEPLANE_GPU_XID_QUARANTINE_S`` after the last fault) and a probe then reads it clean.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass, replace

from tuneplane_node.clock import SYSTEM_CLOCK, Clock, rfc3339
from tuneplane_node.gpu.probe import CARD, JOB, NODE, SCOPES, CardFacts, CardFault
from tuneplane_node.settings import NodeSettings

log = logging.getLogger(__name__)

LOST = "lost: not answering"
NONE = "NONE"
ACTION_SCOPES = {
    "GPU_RESET": CARD, "DRAIN_P2P": CARD, "DRAIN_AND_RESET": CARD, "BUS_RESET": CARD,
    "RECOVER_IMEX_DOMAIN": CARD, "NODE_REBOOT": NODE, "SYSTEM_REBOOT": NODE,
}  # fmt: skip
"""The driver's recovery actions (NVML's ``nvmlGpuRecoveryAction_t`` names) by scope."""
ACTIONS = (NONE, *ACTION_SCOPES)


@dataclass(frozen=True)
class CardFaults:
    """Fault signals read from one card in one probe, before any judgement.

    ``xids`` are the XID events seen since the previous probe; ``recovery_action`` the
    driver's (an `ACTIONS` word; None: the driver cannot say); ``resets`` how many times
    the card was reset, where the source can say (the simulation file)."""

    ecc_uncorrected: int | None = None
    retired_pages_pending: bool = False
    row_remap_failure: bool = False
    lost: bool = False
    xids: tuple[int, ...] = ()
    recovery_action: str | None = None
    resets: int | None = None


@dataclass(frozen=True)
class XidTable:
    """The operator's XID codes by scope; an XID in none of them (and not ignored) takes
    the card out, as every critical XID did before scopes."""

    job: frozenset[int]
    card: frozenset[int]
    node: frozenset[int]
    ignore: frozenset[int] = frozenset()

    @classmethod
    def from_settings(cls, settings: NodeSettings) -> XidTable:
        return cls(
            job=frozenset(settings.gpu_xid_job),
            card=frozenset(settings.gpu_xid_card),
            node=frozenset(settings.gpu_xid_node),
            ignore=frozenset(settings.gpu_xid_ignore),
        )

    def scope_of(self, xid: int) -> str | None:
        """The widest table holding it wins; None: ignored."""
        if xid in self.ignore:
            return None
        if xid in self.node:
            return NODE
        return JOB if xid in self.job and xid not in self.card else CARD


def classify(faults: CardFaults, table: XidTable) -> tuple[str, str] | None:
    """(scope, cause) of one reading's events, the recovery action and the XIDs: their
    widest scope and every cause of that scope; None: no event in it."""
    found: list[tuple[str, str]] = []
    action = faults.recovery_action
    if action in ACTION_SCOPES:
        found.append((ACTION_SCOPES[action], action))
    for xid in sorted(set(faults.xids)):
        scope = table.scope_of(xid)
        if scope is not None:  # the driver's NONE: the job's fault, whatever the table says
            found.append((JOB if action == NONE else scope, f"XID {xid}"))
    if not found:
        return None
    widest = max(SCOPES.index(scope) for scope, _ in found)
    causes = dict.fromkeys(cause for scope, cause in found if SCOPES.index(scope) == widest)
    return SCOPES[widest], ", ".join(causes)


@dataclass
class _Held:
    """A fault the tracker holds: what it is, and what a reset must change."""

    fault: CardFault
    resets: int | None  # the card's reset count when it faulted
    action: str | None  # the recovery action the driver asked then
    last: float  # monotonic time of its last reading


class HealthTracker:
    """Turns fault readings into each card's fault, holding card and node faults until the
    card is reset and reads clean, and job faults for ``quarantine_s`` after the last one.
    Thread-safe: two snapshots may run at once."""

    def __init__(
        self,
        *,
        enabled: bool,
        table: XidTable,
        quarantine_s: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._enabled = enabled
        self._table = table
        self._quarantine_s = quarantine_s
        self._clock = clock
        self._lock = threading.Lock()
        self._held: dict[int, _Held] = {}  # the events' faults, held until their end
        self._since: dict[int, str] = {}  # when a card's standing faults began

    @classmethod
    def from_settings(cls, settings: NodeSettings, *, clock: Clock = SYSTEM_CLOCK) -> HealthTracker:
        return cls(
            enabled=settings.local_check_gpu_health,
            table=XidTable.from_settings(settings),
            quarantine_s=settings.gpu_xid_quarantine_s,
            clock=clock,
        )

    def judge(self, card: CardFacts, faults: CardFaults) -> CardFacts:
        """The card with its ``fault`` (the widest that holds) and, where a fault takes
        it out, ``unhealthy`` (its reasons)."""
        if not self._enabled:
            return replace(card, unhealthy=None, fault=None)
        standing = standing_faults(faults)
        with self._lock:
            held = self._hold(card.index, classify(faults, self._table), faults, standing)
            stands = self._standing(card.index, standing, lost=faults.lost)
        reasons = list(standing)
        if held is not None and held.fault.scope != JOB:
            reasons.append(f"{held.fault.cause} at {held.fault.since}")
        faults_now = [f for f in (stands, held.fault if held else None) if f is not None]
        fault = max(faults_now, key=lambda f: SCOPES.index(f.scope), default=None)
        return replace(card, unhealthy="; ".join(reasons) or None, fault=fault)

    def _standing(self, index: int, reasons: list[str], *, lost: bool) -> CardFault | None:
        """The standing faults as one fault, since they first read so."""
        if not reasons:
            self._since.pop(index, None)
            return None
        since = self._since.setdefault(index, rfc3339(self._clock.now().replace(microsecond=0)))
        return CardFault(NODE if lost else CARD, "; ".join(reasons), since)

    def _hold(
        self,
        index: int,
        found: tuple[str, str] | None,
        faults: CardFaults,
        standing: list[str],
    ) -> _Held | None:
        now = self._clock.monotonic()
        held = self._held.get(index)
        clean = found is None and not standing
        if held is not None and clean and self._over(held, faults, now):
            log.warning("GPU %d: %s fault over (%s): back in", index, held.fault.scope, _how(held))
            del self._held[index]
            held = None
        if found is None:
            return held
        scope, cause = found
        if held is None or SCOPES.index(scope) > SCOPES.index(held.fault.scope):
            since = rfc3339(self._clock.now().replace(microsecond=0))
            held = _Held(CardFault(scope, cause, since), faults.resets, faults.recovery_action, now)
            self._held[index] = held
            log.warning("GPU %d: %s fault: %s", index, scope, cause)
        held.last = now
        return held

    def _over(self, held: _Held, faults: CardFaults, now: float) -> bool:
        """Whether a reading with no fault ends the held one: a job fault after its
        quarantine; a card or node fault once the card was reset."""
        if held.fault.scope == JOB:
            return now - held.last >= self._quarantine_s
        if held.resets is not None and faults.resets is not None:
            return faults.resets > held.resets
        if held.action is not None and held.action != NONE:
            return faults.recovery_action == NONE
        return now - held.last >= self._quarantine_s


def _how(held: _Held) -> str:
    if held.resets is not None:
        return "reset, then a clean probe"
    if held.action not in (None, NONE):
        return "the driver's recovery action done"
    return "quarantine over, no new fault"


def standing_faults(faults: CardFaults) -> list[str]:
    """Reasons that hold exactly as long as the driver keeps reporting them."""
    if faults.lost:
        return [LOST]
    reasons = []
    if faults.ecc_uncorrected:
        reasons.append(f"uncorrectable ECC errors: {faults.ecc_uncorrected}")
    if faults.retired_pages_pending:
        reasons.append("retired pages pending (reset required)")
    if faults.row_remap_failure:
        reasons.append("row remapping failed")
    return reasons


def scoped(cards: Iterable[CardFacts], scope: str) -> list[CardFacts]:
    """The cards whose fault has that scope."""
    return [card for card in cards if card.fault is not None and card.fault.scope == scope]
