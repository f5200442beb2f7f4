"""card launches that do not queue: 50 launches fired at once, 1 card each, against the
same 50 with 0 cards, through the API.

The daemon gets ``TUNEPLANE_LOCAL_GPU_COUNT`` cards as labels only (no driver, no device
request: ``TUNEPLANE_LOCAL_GPU_PASSTHROUGH=false``), so the engine does the same work in
both bursts and what differs is the node's card path: the claim, its lock, the label. Each
round fires one burst of each kind, in alternating order, from 50 threads released
together; the wall time runs from the release to the last answer. The containers are
removed between bursts, untimed. Goal: the 1-card burst within 1.15x of the 0-card one.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from harness import (
    Api,
    Daemon,
    Fleet,
    arguments,
    fleet,
    machine,
    median,
    ms,
    profiled,
    remove_container,
    rotated,
)
from launch import launch_body


class Burst:
    """``size`` launches released at the same instant, each on its own connection."""

    def __init__(self, url: str, made: Fleet, size: int) -> None:
        self.made, self.size = made, size
        self.apis = [Api(url) for _ in range(size)]
        self.pool = ThreadPoolExecutor(size)
        self.count = 0

    def fire(self, cards: int) -> tuple[float, list[str]]:
        """Wall time of the burst, and the names it made (removed by the caller)."""
        names = [self._name(cards) for _ in range(self.size)]
        self.made.names += names  # removed at the end even if the burst fails
        gate = threading.Barrier(self.size + 1)

        def one(index: int) -> list[int]:
            gate.wait()
            body = launch_body(names[index], self.made.session, cards)
            answer = self.apis[index].launch(body)
            if answer.get("phase") != "running":
                raise RuntimeError(f"launch of {names[index]}: {answer}")
            return list(answer.get("gpus") or [])

        futures = [self.pool.submit(one, index) for index in range(self.size)]
        gate.wait()
        started = time.monotonic()
        held = [future.result() for future in futures]
        elapsed = time.monotonic() - started
        if cards and len({card for cards_of in held for card in cards_of}) != self.size:
            raise RuntimeError(f"two launches share a card: {held}")
        return elapsed, names

    def _name(self, cards: int) -> str:
        self.count += 1
        return self.made.name(self.count) + f"-g{cards}"

    def close(self) -> None:
        self.pool.shutdown()
        for api in self.apis:
            api.close()


def clear(made: Fleet, names: list[str]) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: remove_container(made.client, name), names))
    made.names = [name for name in made.names if name not in set(names)]


def measure(burst: Burst, made: Fleet, rounds: int) -> dict[int, list[float]]:
    times: dict[int, list[float]] = {1: [], 0: []}
    for cards in (1, 0):  # warm-up: connections, threads, the image
        clear(made, burst.fire(cards)[1])
    for index in range(rounds):
        for cards in rotated([1, 0], index):
            elapsed, names = burst.fire(cards)
            times[cards].append(elapsed)
            clear(made, names)
        one, zero = times[1][-1], times[0][-1]
        print(f"round {index + 1}: 1 card {ms(one)}, 0 cards {ms(zero)}, {one / zero:.2f}x")
    return times


def report(times: dict[int, list[float]], size: int) -> None:
    one, zero = median(times[1]), median(times[0])
    ratios = sorted(a / b for a, b in zip(times[1], times[0], strict=True))
    print(f"\n{size} launches at once, 1 card each: median {ms(one)} (rounds {ms(min(times[1]))} "
          f"to {ms(max(times[1]))})")  # fmt: skip
    print(f"{size} launches at once, 0 cards:     median {ms(zero)} (rounds {ms(min(times[0]))} "
          f"to {ms(max(times[0]))})")  # fmt: skip
    print(f"1 card / 0 cards: {one / zero:.2f}x (ratio of medians); per round "
          f"{ratios[0]:.2f}x to {ratios[-1]:.2f}x")  # fmt: skip
    print(f"goal: <= 1.15x: {'MET' if one / zero <= 1.15 else 'MISSED'}")


def main() -> None:
    parser = arguments(__doc__.splitlines()[0], containers=0, rounds=5)
    parser.add_argument("--size", type=int, default=50, help="launches per burst")
    args = parser.parse_args()
    print(machine())
    env = {
        "TUNEPLANE_LOCAL_GPU_COUNT": str(args.size),
        "TUNEPLANE_LOCAL_GPU_PASSTHROUGH": "false",
    }
    with fleet("burst") as made, Daemon(env=env) as daemon:
        api = Api(daemon.url)
        if args.containers:
            api.wait_tracked(made.create(args.containers))
        burst = Burst(daemon.url, made, args.size)
        try:
            with profiled(daemon, args.profile):
                times = measure(burst, made, args.rounds)
        finally:
            burst.close()
        report(times, args.size)
        api.close()


if __name__ == "__main__":
    main()
