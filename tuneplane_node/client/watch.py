"""The watch's rule, kept apart from I/O so the sync and the async client follow it
alike: the cursor, which answers are handed on, and how long to wait before asking again.

A watch first lists every job (``full``), then asks the blocking query from the index
of the last answer. An answer with nothing in it (the wait ran out) moves the cursor and
is not handed on. The node's 503 (its engine is not answering: it knows nothing, so it
says nothing), 429 (every watch slot taken) and no answer at all (the daemon restarting)
are waited out with a growing, jittered pause, the cursor kept: the first answer of a
restarted daemon is ``full``. Any other error ends the watch. It never asks twice in a
row without waiting for something: an empty answer that came early (a daemon stopping
answers every waiting query at once) counts as a failure too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tuneplane_node.client import calls
from tuneplane_node.client.answers import Jobs
from tuneplane_node.client.errors import EngineUnavailable, NodeError, TooManyRequests, Unreachable

DEFAULT_WAIT_S = 60.0
MAX_WAIT_S = 300.0  # the node's bound on ``wait``
RETRIED = (EngineUnavailable, TooManyRequests, Unreachable)


@dataclass
class Backoff:
    """Pauses of ``first`` seconds doubling to ``most``, each 50 to 100 % of that (so a
    fleet's consoles do not ask again together); `reset` after an answer."""

    first: float = 0.5
    most: float = 30.0
    failures: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next(self) -> float:
        pause = min(self.most, self.first * 2**self.failures)
        self.failures = min(self.failures + 1, 32)
        return float(pause * self.rng.uniform(0.5, 1.0))

    def reset(self) -> None:
        self.failures = 0


@dataclass
class Watch:
    wait: float = DEFAULT_WAIT_S
    index: str = ""  # "": list first
    backoff: Backoff = field(default_factory=Backoff)

    def __post_init__(self) -> None:
        if not 0 < self.wait <= MAX_WAIT_S:
            raise ValueError(f"wait must be more than 0 and at most {MAX_WAIT_S:g} seconds")

    def call(self) -> calls.Call[Jobs]:
        return calls.jobs(self.index, self.wait)

    def answered(self, answer: Jobs, *, elapsed: float) -> Jobs | float:
        """The answer to hand on, or the pause before the next query (nothing to hand)."""
        asked = bool(self.index)
        self.index = answer.index
        if not asked or answer.full or answer.jobs or answer.removed:
            self.backoff.reset()
            return answer
        if elapsed < min(1.0, self.wait / 2):
            return self.backoff.next()  # answered empty at once: never a busy loop
        self.backoff.reset()
        return 0.0

    def failed(self, error: NodeError) -> float:
        """The pause before asking again; the error itself when it is no passing one."""
        if not isinstance(error, RETRIED):
            raise error
        return self.backoff.next()
