"""The contract's words and times as Python types: each status and phase a `str` enum
(a member equals its word: ``JobStatus.RUNNING == "running"``), each RFC 3339 time a
timezone-aware `datetime`.

Tolerant as the answers are: a word this client does not know (a newer node's) stays
the plain ``str`` the node sent, and a time it cannot read is None (the answer's
``raw`` keeps the text). `tests/unit/test_client_contract.py` holds every enum to the
contract's word list.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime
from enum import Enum
from typing import TypeVar

E = TypeVar("E", bound=Enum)


class Word(str, Enum):
    """A word of the contract: compares, hashes and formats as the string itself."""

    def __str__(self) -> str:
        return str(self.value)


class JobStatus(Word):
    """A container's status, in docker's words; a pending launch is created, or dead
    once failed."""

    CREATED = "created"
    RUNNING = "running"
    PAUSED = "paused"
    RESTARTING = "restarting"
    REMOVING = "removing"
    STOPPING = "stopping"
    EXITED = "exited"
    DEAD = "dead"


class PendingPhase(Word):
    """Where a pending launch is."""

    PULLING = "pulling"
    STARTING = "starting"
    FAILED = "failed"


class LaunchPhase(Word):
    """What a launch did: runs, or pends; ``exited`` only for ``relaunch=False``."""

    RUNNING = "running"
    EXITED = "exited"
    PULLING = "pulling"
    STARTING = "starting"
    FAILED = "failed"


class StopPhase(Word):
    """Which signal of a stop under way went out."""

    WARNED = "warned"
    SIGNALLED = "signalled"


class FaultScope(Word):
    """What a card's fault reaches: the job on it (told), the card (out until reset), the
    machine (cordoned, drained)."""

    JOB = "job"
    CARD = "card"
    NODE = "node"


class NodeStateName(Word):
    """Whether the node takes launches (ready) or not."""

    READY = "ready"
    CORDONED = "cordoned"
    DRAINING = "draining"
    DRAINED = "drained"


class PrefetchPhase(Word):
    """A prefetch: pulling, or present already."""

    PULLING = "pulling"
    PRESENT = "present"


class PullPhase(Word):
    """A pull: under way, or failed."""

    PULLING = "pulling"
    FAILED = "failed"


class VolumePhase(Word):
    """A volume store entry: present; a fill: filling, or failed."""

    PRESENT = "present"
    FILLING = "filling"
    FAILED = "failed"


def word(kind: type[E]) -> Callable[[object], E]:
    """The reader of one enum's words: its member, or the node's own string if the word
    is newer than this client (typed as the enum: compare it with strings or members)."""

    def read(value: object) -> E:
        try:
            return kind(value)
        except ValueError:
            return value  # type: ignore[return-value]  # a newer node's word, as sent

    return read


_FRACTION = re.compile(r"(\.\d{1,6})\d*")


def moment(value: object) -> datetime | None:
    """An RFC 3339 time (``2026-01-02T03:04:05.123456789Z``) as an aware `datetime`;
    None when it is no such text. Nanoseconds are cut to microseconds, ``Z`` read as UTC
    (Python 3.10's ``fromisoformat`` takes neither)."""
    if not isinstance(value, str):
        return None
    # 3.10 takes 3 or 6 digits only: cut to microseconds, then pad to six
    text = _FRACTION.sub(lambda found: found[1].ljust(7, "0"), value.strip(), count=1)
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return when if when.tzinfo is not None else None
