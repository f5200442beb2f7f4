"""The pending-launch table: launches whose container does not exist yet.

A launch whose image is missing returns at once and leaves a record here while its
image is pulled and its container created. Only these records live in memory; a daemon
restarted mid-pull has none, and the console resubmits. A failed record stays for
`FAILED_RECORD_TTL_S`, so the console reads why, then expires.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.jobs.images.pulls import SharedPull
from tuneplane_node.jobs.words.launch import LaunchRequest
from tuneplane_node.jobs.words.views import FAILED_RECORD_TTL_S, PendingView
from tuneplane_node.jobs.words.volumes import VolumeFill
from tuneplane_node.runtime.base import PullProgress
from tuneplane_node.wire.values import FAILED, PULLING


@dataclass
class PendingLaunch:
    request: LaunchRequest
    accepted: float  # monotonic
    phase: str = PULLING
    error: str | None = None
    failed_at: float | None = None
    pull: SharedPull | None = None
    needs_pull: bool = True  # else only its volumes are missing
    fills: list[VolumeFill] = field(default_factory=list)  # its volumes' fills
    volumes_held: Callable[[], None] = lambda: None  # its volumes' hold, let go as it ends
    task: asyncio.Task[None] | None = None

    @property
    def ref(self) -> str:
        return self.request.ref

    @property
    def image(self) -> str:
        return self.request.spec.image

    def fail(self, reason: str, *, at: float) -> None:
        self.phase, self.error, self.failed_at = FAILED, reason, at

    def view(self, now: float) -> PendingView:
        progress, rate, eta = self._progress()
        return PendingView(
            ref=self.ref,
            labels=self.request.spec.labels,
            phase=self.phase,
            image=self.image,
            elapsed_s=round((self.failed_at or now) - self.accepted, 3),
            requested_gpus=self.request.requested_gpus,
            progress=progress,
            error=self.error,
            stop_signal=self.request.spec.stop_signal,
            read_only_root=self.request.spec.read_only_root,
            rate_bytes_per_s=rate,
            eta_s=eta,
        )

    def _progress(self) -> tuple[PullProgress, float | None, float | None]:
        """One progress for the image's pull and the volumes' fills (each fill one more
        "layer"), their rates summed, and the time left at that rate; None while any
        part is unknown."""
        pull = self.pull.progress if self.pull is not None else PullProgress()
        if self.phase != PULLING:
            return pull, None, None
        rate, eta = self.pull.rate_now() if self.pull is not None else (None, None)
        if not self.fills:
            return pull, rate, eta
        done = pull.bytes_done + sum(fill.bytes_done for fill in self.fills)
        total = pull.bytes_total + sum(fill.bytes_total or 0 for fill in self.fills)
        filled = sum(1 for fill in self.fills if fill.task is not None and fill.task.done())
        progress = PullProgress(
            done, total, pull.layers_done + filled, pull.layers_total + len(self.fills)
        )
        rates = [fill.rate.rate(fill.clock.monotonic()) for fill in self.fills]
        if self.pull is not None:
            rates.append(rate)
        if any(each is None for each in rates):
            return progress, None, None
        summed = sum(each for each in rates if each is not None)
        unknown = any(fill.bytes_total is None for fill in self.fills)
        eta = None if unknown or summed <= 0 else max(0.0, (total - done) / summed)
        return progress, summed, eta


class PendingTable:
    """The records by ref; expired failed ones are dropped as they are read.

    ``on_change`` is told the ref of every record added, dropped, or changed in phase
    (`changed`): the change log behind watch."""

    def __init__(
        self,
        *,
        clock: Clock = SYSTEM_CLOCK,
        ttl_s: float = FAILED_RECORD_TTL_S,
        on_change: Callable[[str], None] = lambda ref: None,
    ):
        self.clock = clock
        self.ttl_s = ttl_s
        self.changed = on_change
        self._records: dict[str, PendingLaunch] = {}

    def get(self, ref: str) -> PendingLaunch | None:
        """The record of one ref. Only this ref is checked: observe asks for hundreds."""
        record = self._records.get(ref)
        if record is not None and self._expired(record, self.clock.monotonic()):
            del self._records[ref]
            self.changed(ref)
            return None
        return record

    def add(self, record: PendingLaunch) -> None:
        self._records[record.ref] = record
        self.changed(record.ref)

    def pop(self, ref: str) -> PendingLaunch | None:
        record = self._records.pop(ref, None)
        if record is not None:
            self.changed(ref)
        return record

    def finish(self, record: PendingLaunch) -> None:
        """Drop a record whose container now exists (unless another replaced it)."""
        if self._records.get(record.ref) is record:
            del self._records[record.ref]
            self.changed(record.ref)

    def fail(self, record: PendingLaunch, reason: str) -> None:
        """The launch failed: its record says why until it expires, which is a change too
        (told once its time has passed, even if nobody reads it)."""
        record.fail(reason, at=self.clock.monotonic())
        self.changed(record.ref)
        loop = asyncio.get_running_loop()
        loop.call_later(self.ttl_s + 0.001, lambda: self.get(record.ref))

    def records(self) -> Iterator[PendingLaunch]:
        """Every record, expired ones dropped first."""
        now = self.clock.monotonic()
        for ref in [ref for ref, r in self._records.items() if self._expired(r, now)]:
            del self._records[ref]
            self.changed(ref)
        return iter(list(self._records.values()))

    def __len__(self) -> int:
        return len(self._records)

    def holds_any(self, refs: Iterable[str]) -> bool:
        """Whether any of ``refs`` has a record (an expired one too, until it is read)."""
        return bool(self._records) and not self._records.keys().isdisjoint(refs)

    def _expired(self, record: PendingLaunch, now: float) -> bool:
        return record.failed_at is not None and now - record.failed_at > self.ttl_s
