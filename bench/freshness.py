"""freshness: how long after a job exits by itself does observe show it exited?

Each round launches a job through the API (``sleep 0.5``), polls observe of its one ref
about every 2 ms, and takes the moment the first answer saying ``exited`` arrived. The
engine's ``State.FinishedAt`` (read by an inspect afterwards) is the moment it exited.
Both are this machine's wall clock (dockerd stamps FinishedAt with it). Goal: median
under 50 ms. Other tracked containers (``--containers``) sit idle in the cache meanwhile.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any, NamedTuple

import docker
from harness import (
    IMAGE,
    LABEL_BENCH,
    Api,
    Daemon,
    Fleet,
    arguments,
    fleet,
    machine,
    median,
    ms,
    percentile,
    profiled,
)

JOB_SECONDS = "0.5"
POLL_S = 0.002


def epoch(stamp: str) -> float:
    """An engine RFC 3339 time, nanoseconds kept as far as a float allows, as epoch s."""
    whole, _, rest = stamp.rstrip("Z").partition(".")
    moment = datetime.fromisoformat(whole + "+00:00").timestamp()
    return moment + (float("0." + rest) if rest else 0.0)


def launch_body(name: str, session: str) -> dict[str, Any]:
    container = {
        "name": name,
        "image": IMAGE,
        "command": ["/bin/sleep", JOB_SECONDS],
        "labels": {LABEL_BENCH: session},
    }
    return {"run_id": name, "requested_gpus": 0, "container": container}


def first_exited(api: Api, name: str, *, timeout: float = 30) -> tuple[float, int]:
    """Wall time the first observe saying exited came back, and how many polls it took."""
    deadline, polls = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        sent = time.perf_counter()
        state = api.observe([name])[name]
        polls += 1
        if state["status"] == "exited":
            return time.time(), polls
        time.sleep(max(0.0, POLL_S - (time.perf_counter() - sent)))
    raise RuntimeError(f"{name} never showed exited")


class DieWatcher:
    """The bench's own event stream: when each ``die`` reached a client, and its stamp.

    It splits the delay into the engine's part (FinishedAt -> die delivered) and the
    daemon's (die delivered -> observe says exited).
    """

    def __init__(self, client: docker.DockerClient, session: str, *, inspect: bool = True):
        filters = {"type": "container", "event": "die", "label": f"{LABEL_BENCH}={session}"}
        self.client = client
        self.inspect = inspect
        self.stream = client.api.events(decode=True, filters=filters)
        # name -> (die received, its timeNano, an inspect sent right then returned)
        self.seen: dict[str, tuple[float, float, float]] = {}
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for event in self.stream:
                name = event.get("Actor", {}).get("Attributes", {}).get("name", "")
                received, stamped = time.time(), event.get("timeNano", 0) / 1e9
                # What the daemon does next: how soon can an inspect after a die answer?
                # (Not while the bench times an answer in this process: the inspect's
                # Python holds the GIL the answer's reader needs.)
                if self.inspect:
                    self.client.api.inspect_container(name)
                self.seen[name] = (received, stamped, time.time())
        except Exception:  # closed at the end of the run
            return

    def close(self) -> None:
        self.stream.close()


class Sample(NamedTuple):
    """One job, each moment as seconds after its FinishedAt."""

    observed: float  # the first observe saying exited came back
    delivered: float  # the bench's own event stream received the die
    stamped: float  # the engine's timeNano on that die event
    inspected: float  # an inspect the bench sent on receiving the die returned
    polls: int


def one_job(api: Api, made: Fleet, watcher: DieWatcher, index: int) -> Sample:
    name = made.name(10_000 + index)
    made.names.append(name)  # removed at the end even if this round fails
    api.launch(launch_body(name, made.session))
    seen, polls = first_exited(api, name)
    finished = epoch(made.client.api.inspect_container(name)["State"]["FinishedAt"])
    api.remove(name)
    delivered, stamped, inspected = watcher.seen.get(name, (float("nan"),) * 3)
    return Sample(
        seen - finished, delivered - finished, stamped - finished, inspected - finished, polls
    )


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], containers=300, rounds=10)
    args = parser.parse_args()
    print(machine())
    with fleet("fresh") as made, Daemon() as daemon:
        api = Api(daemon.url)
        if args.containers:
            api.wait_tracked(made.create(args.containers))
        print(f"daemon cache: {api.health()['state_cache']}")
        watcher = DieWatcher(made.client, made.session)
        samples = []
        with profiled(daemon, args.profile):
            for index in range(args.rounds):
                sample = one_job(api, made, watcher, index)
                samples.append(sample)
                print(
                    f"round {index + 1}: after FinishedAt, die stamped {ms(sample.stamped)},"
                    f" delivered {ms(sample.delivered)}, inspect after it {ms(sample.inspected)},"
                    f" observe exited {ms(sample.observed)}",
                    flush=True,
                )
        watcher.close()
        report(samples)
        api.close()


def report(samples: list[Sample]) -> None:
    observed = [s.observed for s in samples]
    stamped = median([s.stamped for s in samples])
    delivered = median([s.delivered for s in samples])
    inspected = median([s.inspected for s in samples])
    daemon = median([s.observed - s.delivered for s in samples])
    print(f"\nFinishedAt -> engine stamps the die event (timeNano): median {ms(stamped)}")
    print(f"FinishedAt -> die delivered to the bench's own event stream: median {ms(delivered)}")
    print(f"FinishedAt -> an inspect sent on that die returns: median {ms(inspected)}")
    print(f"die delivered -> first observe showing exited (the daemon's part): {ms(daemon)}")
    print(
        f"FinishedAt -> first observe showing exited: median {ms(median(observed))}, "
        f"p90 {ms(percentile(observed, 90))}, min {ms(min(observed))}, max {ms(max(observed))} "
        f"({len(samples)} jobs, {median([s.polls for s in samples]):.0f} polls per job, "
        f"one every ~{ms(POLL_S)})"
    )
    met = median(observed) < 0.050
    print(f"goal: median < 50 ms: {'MET' if met else 'MISSED'}")


if __name__ == "__main__":
    main()
