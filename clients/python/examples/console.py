"""A small console on the client: launch a job, follow it to its end, and read its
answers as a type checker sees them. It passes ``mypy --strict`` (the repository's
mypy configuration is strict and checks this file: ``.venv/bin/mypy``).

Run: ``python console.py http://127.0.0.1:8470 <token> <image>``.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime, timezone

from tuneplane_node.client import (
    Container,
    GpuNotReady,
    JobState,
    JobStatus,
    NoCapacity,
    NodeClient,
    Retry,
    RunConflict,
)


def age(when: datetime | None) -> str:
    """How long ago, in whole seconds; "" when the node did not say."""
    if when is None:
        return ""
    return f"{(datetime.now(timezone.utc) - when).total_seconds():.0f}s"


def run(url: str, token: str, image: str, run_id: str = "console-example") -> int:
    # Launches are retried too: the node answers a launch of the same spec idempotent.
    with NodeClient(url, token=token, retry=Retry(attempts=4, launch=True)) as node:
        try:
            launched = node.launch(run_id, Container(image=image, command=["true"]))
        except (NoCapacity, GpuNotReady) as busy:
            print(f"not here: {busy.code}: {busy.detail}")
            return 2
        except RunConflict as conflict:
            print(f"that run exists with another spec: {conflict.detail}")
            return 3
        print(f"{launched.ref}: {launched.phase}")
        state: JobState = node.observe([launched.ref])[launched.ref]
        while state.status not in (JobStatus.EXITED, JobStatus.DEAD):
            time.sleep(0.5)
            state = node.observe([launched.ref])[launched.ref]
        print(f"exit {state.exit_code}, started {age(state.started_at)} ago")
        node.remove(launched.ref)
        return 0 if state.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(run(*sys.argv[1:4]))
