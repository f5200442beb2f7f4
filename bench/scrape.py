"""scrape: what one Prometheus scrape of ``GET /metrics`` costs the daemon, with 300 jobs.

The daemon's own CPU time (utime + stime from /proc) over a run of sequential scrapes,
per scrape, against the same figure for ``GET /node/v1/health`` measured in the same
rounds (methods alternated). Wall-clock medians are printed beside. Goal: a scrape with
300 jobs costs under 5 ms of the daemon's time.
"""

from __future__ import annotations

import time

import requests
from harness import TOKEN, Api, Daemon, arguments, fleet, machine, median, ms, rotated

SCRAPES_PER_ROUND = 50


def scrape(session: requests.Session, url: str) -> str:
    answer = session.get(url + "/metrics")
    answer.raise_for_status()
    return answer.text


def measure(daemon: Daemon, call: object, count: int) -> tuple[float, float]:
    """(daemon CPU seconds per call, median wall seconds per call)."""
    walls = []
    cpu = daemon.cpu_seconds()
    for _ in range(count):
        started = time.perf_counter()
        call()  # type: ignore[operator]
        walls.append(time.perf_counter() - started)
    return (daemon.cpu_seconds() - cpu) / count, median(walls)


def main() -> None:
    args = arguments(__doc__.splitlines()[0], containers=300, rounds=5).parse_args()
    print(machine())
    with fleet("scrape") as made, Daemon() as daemon:
        api = Api(daemon.url)
        names = made.create(args.containers)
        api.wait_tracked(names)
        scraper = requests.Session()
        scraper.headers["Authorization"] = f"Bearer {TOKEN}"
        text = scrape(scraper, daemon.url)
        methods = {"metrics": lambda: scrape(scraper, daemon.url), "health": api.health}
        figures: dict[str, list[tuple[float, float]]] = {name: [] for name in methods}
        for round_index in range(args.rounds):
            for name in rotated(list(methods), round_index):
                figures[name].append(measure(daemon, methods[name], SCRAPES_PER_ROUND))
        api.close()
    report(figures, text)


def report(figures: dict[str, list[tuple[float, float]]], text: str) -> None:
    jobs = [line for line in text.splitlines() if line.startswith("tuneplane_node_jobs{")]
    print(f"\nexposition: {len(text)} bytes, {len(text.splitlines())} lines; {', '.join(jobs)}")
    for name, rounds in figures.items():
        cpu = [c for c, _ in rounds]
        wall = [w for _, w in rounds]
        print(
            f"{name:8} daemon CPU per call: median {ms(median(cpu))} (rounds {min(cpu) * 1e3:.2f}"
            f" to {max(cpu) * 1e3:.2f} ms); wall median {ms(median(wall))}"
        )
    ratio = median([c for c, _ in figures["metrics"]]) / median([c for c, _ in figures["health"]])
    worst = max(c for c, _ in figures["metrics"])
    print(f"metrics / health, daemon CPU: {ratio:.2f}x")
    print(f"goal: < 5 ms of daemon time per scrape: {'MET' if worst < 0.005 else 'MISSED'}")


if __name__ == "__main__":
    main()
