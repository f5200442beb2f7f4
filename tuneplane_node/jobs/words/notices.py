"""Notice: the machine will go away (or may), as a cloud or the OS said it.

A notice is the same notice however often it is read (its ``key``); whether it ends the
jobs (a termination, a preemption, maintenance that reboots or stops the machine) or
only asks the node to take no new ones (a rebalance recommendation, a live migration);
its deadline where the source gives one. Pure data: the sources make them
(`clouds`, `logind`), the reactor acts on them (`reactor`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from tuneplane_node.clock import rfc3339

PREEMPT = "preempt"  # a spot or preemptible machine is taken back
TERMINATE = "terminate"  # the machine is terminated, stopped or retired
MAINTENANCE = "maintenance"  # the host is maintained: the machine reboots, or migrates
REBALANCE = "rebalance"  # the cloud advises the machine may be taken back soon
SHUTDOWN = "shutdown"  # the operating system is shutting down
KINDS = (PREEMPT, TERMINATE, MAINTENANCE, REBALANCE, SHUTDOWN)


@dataclass(frozen=True)
class Notice:
    """``source``: ``aws``, ``gcp``, ``azure`` or ``logind``; ``detail``: the source's own
    words (``spot instance-action terminate``), for a person."""

    source: str
    kind: str
    key: str
    ends_jobs: bool
    deadline: datetime | None = None
    detail: str = ""
    margin_s: float | None = None  # before the deadline every stop ends (None: the node's)

    @property
    def reason(self) -> str:
        """The cordon's reason: ``preempt: aws spot``, ``maintenance: gcp 2026-12-06T10:00Z``."""
        when = f" {rfc3339(self.deadline)}" if self.deadline is not None else ""
        return f"{self.kind}: {self.source} {self.detail}{when}".strip()

    @property
    def stop_reason(self) -> str:
        """What observe says of a job this notice's drain stopped: ``preempted: aws``."""
        word = "maintenance" if self.kind == MAINTENANCE else "preempted"
        if self.kind == SHUTDOWN:
            word = "shutdown"
        return f"{word}: {self.source}"


@dataclass(frozen=True)
class Standing:
    """A notice the node acts on, and when it first heard it."""

    notice: Notice
    since: datetime
