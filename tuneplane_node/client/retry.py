"""When a call is asked again: a `Retry` policy, its backoff, and which failures and
verbs it covers.

Only a failure that says nothing was done is retried: no answer (`Unreachable`), the
engine did not answer (`EngineUnavailable`, 503), or every slot taken
(`TooManyRequests`, 429, but not too many failed tokens: asking again would prolong
that). Only a verb that is safe to ask twice is: the reads, and cordon and uncordon
(the same state again). A launch is retried only where the console opts in
(``Retry(launch=True)``): the node answers a launch of the same run and the same spec
``idempotent`` (and ``relaunch=False`` keeps an exited job as it is), so a retry never
runs a second job. Stop, signal, remove, reap, drain, prefetch and image GC are never
retried: a console decides those again itself.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tuneplane_node.client.errors import (
    EngineUnavailable,
    NodeError,
    TooManyAuthFailures,
    TooManyRequests,
    Unreachable,
)

SAFE_PATHS = frozenset(
    {
        "/healthz",
        "/node/v1/health",
        "/node/v1/inventory",
        "/node/v1/observe",
        "/node/v1/jobs",
        "/node/v1/stats",
        "/node/v1/logs",
        "/node/v1/images",
        "/node/v1/cordon",
        "/node/v1/uncordon",
    }
)
"""The verbs asked again after a failure that says nothing was done."""
LAUNCH_PATH = "/node/v1/launch"


@dataclass(frozen=True)
class Retry:
    """How often a safe call is asked again, and how long between: ``first_s``, then
    ``factor`` times longer each time up to ``most_s``, each with up to ``jitter`` of it
    at random (so a fleet of consoles does not ask in step). ``attempts``: asks in all,
    1 for none. ``launch``: retry launches too (off unless the console opts in).

    Example: ``NodeClient(url, token=token, retry=Retry(attempts=5, launch=True))``."""

    attempts: int = 3
    first_s: float = 0.2
    factor: float = 2.0
    most_s: float = 5.0
    jitter: float = 0.1
    launch: bool = False

    def delays(self) -> Iterator[float]:
        """The waits before the second ask, the third, ...: ``attempts - 1`` of them."""
        delay = self.first_s
        for _ in range(max(self.attempts - 1, 0)):
            yield min(delay, self.most_s) * (1 + random.uniform(0, self.jitter))
            delay *= self.factor

    def covers(self, path: str, error: NodeError) -> bool:
        """Whether a call to ``path`` that failed with ``error`` may be asked again."""
        if path not in SAFE_PATHS and not (self.launch and path == LAUNCH_PATH):
            return False
        if isinstance(error, TooManyAuthFailures):
            return False
        return isinstance(error, (Unreachable, EngineUnavailable, TooManyRequests))


NO_RETRY = Retry(attempts=1)
"""Every call asked once (0.3.15's client)."""


class Tunable(Protocol):
    timeout: float
    retry: Retry


C = TypeVar("C", bound=Tunable)


def tuned(client: C, *, timeout: float | None, retry: Retry | None) -> C:
    """A shallow copy of ``client`` (its connections shared) with another timeout or
    retry policy; None keeps the client's own."""
    other = copy.copy(client)
    other.timeout = client.timeout if timeout is None else timeout
    other.retry = client.retry if retry is None else retry
    return other
