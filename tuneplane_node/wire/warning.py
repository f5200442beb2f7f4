"""How a job wants to be warned before a stop the node makes on its own (a card's fault, a
cloud's notice, a drain without a warning of its own, disk pressure): the launch's
``container.warn_signal`` and ``container.warn_s``, in the stop verb's grammar, each a
`Field` of the container's table with its reader. The node writes them on the container
(`LABEL_WARN_SIGNAL`, `LABEL_WARN_S`) and the stopper reads them back from there.
"""

from __future__ import annotations

import math

from tuneplane_node.errors import OUT_OF_RANGE, InvalidField
from tuneplane_node.wire.fields import Field, Given, number, or_empty
from tuneplane_node.wire.readers import SIGNAL, SIGNALS_DOC, empty_as, parse_signal
from tuneplane_node.wire.values import LABEL_WARN_S, LABEL_WARN_SIGNAL
from tuneplane_node.wire.verbs import MAX_GRACE_S

MAX_WARN_S = MAX_GRACE_S


def _warn_signal(given: Given) -> str | None:
    return parse_signal(given.body, given.field)


def _warn_s(given: Given) -> float | None:
    value = empty_as(given.value, None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidField(given.field, "must be a number of seconds")
    if not (isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= MAX_WARN_S:
        why = f"must be from 0 to {MAX_WARN_S:g} seconds"
        raise InvalidField(given.field, why, problem=OUT_OF_RANGE)
    return float(value)


WARN_SIGNAL = Field(
    "warn_signal",
    or_empty(*SIGNAL["anyOf"]),
    f"The signal every stop the node makes on its own (a card's fault, a cloud's notice, "
    f"a drain without a warning of its own, disk pressure) sends first, for the job to "
    f"checkpoint and end by itself: {SIGNALS_DOC}. None: the operator's "
    "`TUNEPLANE_JOB_WARN_SIGNAL` (unset: no warning). Sent only to a job that catches it, "
    f"as the stop verb's `warn_signal`. Written on the container as `{LABEL_WARN_SIGNAL}`.",
    read=_warn_signal,
)
WARN_S = Field(
    "warn_s",
    or_empty(number(least=0, most=MAX_WARN_S)),
    f"Seconds from the warning signal to the stop signal in such a stop, 0 to "
    f"{MAX_WARN_S / 86400:g} days. None: the operator's `TUNEPLANE_JOB_WARN_S`. A notice "
    "whose deadline leaves less time gives less. Written on the container as "
    f"`{LABEL_WARN_S}`.",
    read=_warn_s,
)
