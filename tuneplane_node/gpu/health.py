"""The health verdict: fault readings of a card turned into its ``unhealthy`` reasons.

Both real probes (NVML and the simulation file) judge through one `HealthTracker`, so a
fault means the same whichever source read it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from tuneplane_node.clock import SYSTEM_CLOCK, Clock, rfc3339
from tuneplane_node.gpu.probe import CardFacts
from tuneplane_node.settings import NodeSettings

log = logging.getLogger(__name__)

LOST = "lost: not answering"


@dataclass(frozen=True)
class CardFaults:
    """Fault signals read from one card in one probe, before any quarantine logic.

    ``xids`` are the XID events seen since the previous probe.
    """

    ecc_uncorrected: int | None = None
    retired_pages_pending: bool = False
    row_remap_failure: bool = False
    lost: bool = False
    xids: tuple[int, ...] = ()


class HealthTracker:
    """Turns fault readings into a verdict per card, remembering XID quarantines.

    Standing faults (ECC, pending retirement, remap failure, lost) count only while they
    read so. A critical XID is an event, not a state: the card stays out for
    ``quarantine_s`` after the last one. Thread-safe: two snapshots may run at once.
    """

    def __init__(
        self,
        *,
        enabled: bool,
        ignore_xids: Iterable[int],
        quarantine_s: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._enabled = enabled
        self._ignore = frozenset(ignore_xids)
        self._quarantine_s = quarantine_s
        self._clock = clock
        self._lock = threading.Lock()
        self._quarantined: dict[int, tuple[float, str]] = {}  # index -> (until, reason)

    @classmethod
    def from_settings(cls, settings: NodeSettings, *, clock: Clock = SYSTEM_CLOCK) -> HealthTracker:
        return cls(
            enabled=settings.local_check_gpu_health,
            ignore_xids=settings.gpu_xid_ignore,
            quarantine_s=settings.gpu_xid_quarantine_s,
            clock=clock,
        )

    def judge(self, card: CardFacts, faults: CardFaults) -> CardFacts:
        """The card with ``unhealthy`` set to the reasons that hold now (None: healthy)."""
        if not self._enabled:
            return replace(card, unhealthy=None)
        reasons = standing_faults(faults)
        xid = self._xid_verdict(card.index, faults.xids)
        if xid is not None:
            reasons.append(xid)
        return replace(card, unhealthy="; ".join(reasons) or None)

    def _xid_verdict(self, index: int, xids: Sequence[int]) -> str | None:
        critical = sorted({x for x in xids if x not in self._ignore})
        now = self._clock.monotonic()
        with self._lock:
            if critical:
                codes = ", ".join(str(x) for x in critical)
                reason = f"XID {codes} at {rfc3339(self._clock.now().replace(microsecond=0))}"
                self._quarantined[index] = (now + self._quarantine_s, reason)
                log.warning("GPU %d: %s, quarantined for %gs", index, reason, self._quarantine_s)
                return reason
            until, reason = self._quarantined.get(index, (0.0, ""))
            if now < until:
                return reason
            if self._quarantined.pop(index, None) is not None:
                log.info("GPU %d: XID quarantine over, no new fault", index)
            return None


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
