"""Prometheus metrics: ``GET /metrics`` in the text exposition format.

Two kinds of series. Events (HTTP requests, launches, engine calls, pulls) are counted
as they happen, through this module's `Metrics` (the `Telemetry` of the layers below).
States (cards, jobs, the cache, the node state, pulls in flight) are read from the job
service when a scrape comes, so a scrape is never stale and costs nothing in between.

Labels are bounded sets: route templates, never refs; SDK function names; outcomes.
Each app has its own registry: two daemons in one process (tests) never share counts.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterable

from prometheus_client import (
    CollectorRegistry,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client import Counter as CounterMetric

from tuneplane_node import __version__
from tuneplane_node.daemon.access import audit
from tuneplane_node.errors import NodeError
from tuneplane_node.gpu.probe import Occupancy
from tuneplane_node.jobs.disk.monitor import Measured
from tuneplane_node.jobs.node import Node
from tuneplane_node.jobs.observe.stats import JobSample
from tuneplane_node.runtime.base import CacheStatus
from tuneplane_node.telemetry import Telemetry
from tuneplane_node.wire.values import STATES

log = logging.getLogger(__name__)
PREFIX = "tuneplane_node"
CARD_KINDS = ("free", "held", "reserved", "unhealthy", "draining", "external")
CARD_LABELS = ("gpu", "UUID", "modelName")
"""dcgm-exporter's labels of a card (index, UUID, the driver's name of it), so that a
dashboard joins the node's series with DCGM's; "" where the driver does not say."""
JOB_STATUSES = ("running", "created", "paused", "restarting", "exited", "dead")
PENDING_PHASES = ("pulling", "starting", "failed")
MIB = 2**20
LAG_PERIOD_S = 0.5
# Seconds: an API answer is milliseconds, a pull minutes to an hour.
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
ENGINE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
PULL_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # what every Prometheus reads


class Metrics(Telemetry):
    """The node's series, in one registry per daemon."""

    def __init__(self, *, per_job: bool = False) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.worst_lag = 0.0  # since the last scrape
        self.build = Gauge(
            f"{PREFIX}_build_info", "The daemon's version.", ["version"], registry=registry
        )
        self.build.labels(__version__).set(1)
        self._events(registry)
        self.gauges = StateGauges(registry)
        self.per_job = _PerJob(registry) if per_job else None

    def _events(self, registry: CollectorRegistry) -> None:
        self._children: dict[tuple[object, ...], Histogram] = {}
        self.http = Histogram(
            f"{PREFIX}_http_request_duration_seconds",
            "API requests by route template, method and status.",
            ["route", "method", "status"],
            buckets=HTTP_BUCKETS,
            registry=registry,
        )
        self.launches = CounterMetric(
            f"{PREFIX}_launches",
            "Launch requests by outcome: started, running (idempotent), pulling, pending "
            "(idempotent), refused (4xx), failed (5xx).",
            ["outcome"],
            registry=registry,
        )
        self.engine = Histogram(
            f"{PREFIX}_engine_call_duration_seconds",
            "Blocking engine calls by SDK function, queueing for a thread included.",
            ["call"],
            buckets=ENGINE_BUCKETS,
            registry=registry,
        )
        self.engine_errors = CounterMetric(
            f"{PREFIX}_engine_errors", "Engine calls that raised.", ["call"], registry=registry
        )
        self.pull_seconds = Histogram(
            f"{PREFIX}_pull_duration_seconds",
            "Image pulls by outcome: ok, failed, cancelled.",
            ["outcome"],
            buckets=PULL_BUCKETS,
            registry=registry,
        )
        self.auth_failures = CounterMetric(
            f"{PREFIX}_auth_failures",
            "Requests refused for their token, by status: 401 (wrong or missing), 429 (a "
            "peer that kept failing).",
            ["status"],
            registry=registry,
        )
        self.pull_bytes = CounterMetric(
            f"{PREFIX}_pull_bytes", "Bytes downloaded by image pulls.", registry=registry
        )
        self.disk_walks = Histogram(
            f"{PREFIX}_disk_walk_seconds",
            "The disk monitor's walks of one job's writable layer and anonymous volumes.",
            buckets=ENGINE_BUCKETS,
            registry=registry,
        )
        self.gc_runs = CounterMetric(
            f"{PREFIX}_image_gc_runs", "Image GC runs ended.", registry=registry
        )
        self.gc_removed = CounterMetric(
            f"{PREFIX}_image_gc_removed", "Images the image GC removed.", registry=registry
        )
        self.gc_freed = CounterMetric(
            f"{PREFIX}_image_gc_freed_bytes",
            "Bytes of the images the image GC removed, as the engine stated their sizes.",
            registry=registry,
        )
        self.volume_fetched_bytes = CounterMetric(
            f"{PREFIX}_volume_fetched_bytes",
            "Bytes downloaded by volume fills.",
            registry=registry,
        )
        self.volume_served_bytes = CounterMetric(
            f"{PREFIX}_volume_served_bytes",
            "Bytes of volume store entries handed to jobs (bound, not downloaded again).",
            registry=registry,
        )
        self.volume_evictions = CounterMetric(
            f"{PREFIX}_volume_evictions",
            "Entries of the volume store evicted (least recently used, unused, unpinned).",
            registry=registry,
        )
        self.image_pulls = CounterMetric(
            f"{PREFIX}_image_pulls",
            "Image pulls (launches' and prefetches' alike, one per download) by result: "
            "ok, failed, cancelled.",
            ["result"],
            registry=registry,
        )
        self.watch_answers = CounterMetric(
            f"{PREFIX}_watch_answers", "Watch queries answered (GET /node/v1/jobs?index=).",
            registry=registry,
        )  # fmt: skip
        self.watch_full = CounterMetric(
            f"{PREFIX}_watch_full_resyncs",
            "Watch queries answered with every job: a cursor of another process, or too old.",
            registry=registry,
        )

    # --- events (Telemetry) -------------------------------------------------------------

    def engine_call(self, call: str, seconds: float, *, failed: bool) -> None:
        self._child(self.engine, call).observe(seconds)
        if failed:
            self.engine_errors.labels(call).inc()

    def pull_finished(self, outcome: str, seconds: float, bytes_done: int) -> None:
        self.pull_seconds.labels(outcome).observe(seconds)
        self.pull_bytes.inc(bytes_done)
        self.image_pulls.labels(outcome).inc()

    def image_gc_run(self) -> None:
        self.gc_runs.inc()

    def disk_walked(self, seconds: float) -> None:
        self.disk_walks.observe(seconds)

    def image_removed(self, image: str, image_id: str, size_bytes: int, why: str) -> None:
        self.gc_removed.inc()
        self.gc_freed.inc(size_bytes)
        facts = {"image": image, "image_id": image_id, "size_bytes": size_bytes, "why": why}
        audit.node_action("image gc", "removed", **facts)

    def volume_fetched(self, size_bytes: int) -> None:
        self.volume_fetched_bytes.inc(size_bytes)

    def volume_served(self, size_bytes: int) -> None:
        self.volume_served_bytes.inc(size_bytes)

    def volume_evicted(self, digest: str, size_bytes: int) -> None:
        self.volume_evictions.inc()
        audit.node_action("volume gc", "removed", sha256=digest, size_bytes=size_bytes)

    def request(self, route: str, method: str, status: int, seconds: float) -> None:
        self._child(self.http, route, method, str(status)).observe(seconds)

    def _child(self, family: Histogram, *labels: str) -> Histogram:
        """A histogram's labelled series, looked up once per bounded label set (route
        templates, methods, statuses, SDK calls): `labels()` checks and locks on every
        call, and a burst makes hundreds."""
        key = (id(family), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*labels)
        return child

    def auth_failed(self, status: int) -> None:
        self.auth_failures.labels(str(status)).inc()

    def launch(self, outcome: str) -> None:
        self.launches.labels(outcome).inc()

    def watch_answered(self, *, full: bool) -> None:
        self.watch_answers.inc()
        if full:
            self.watch_full.inc()

    # --- a scrape -----------------------------------------------------------------------

    async def scrape(self, node: Node) -> bytes:
        """Read the states now, then write every series."""
        await self._read_states(node)
        self.gauges.lag.set(self.worst_lag)
        self.worst_lag = 0.0
        return generate_latest(self.registry)

    async def _read_states(self, node: Node) -> None:
        status = await node.jobs.status()
        self._node_state(status.node.state)
        self.gauges.notices.clear()
        for standing in status.notices:
            deadline = standing.notice.deadline
            seconds = deadline.timestamp() if deadline is not None else float("nan")
            self.gauges.notices.labels(standing.notice.source, standing.notice.kind).set(seconds)
        self.gauges.gpu_ready.set(_known(status.gpu.ready))
        self.gauges.health_ok.set(float(status.ok))
        self._cache(status.cache)
        store = status.image_store
        self.gauges.store_total.set(_known(store.total_bytes))
        self.gauges.store_free.set(_known(store.free_bytes))
        for name, value in vars(status.conditions).items():
            self.gauges.conditions.labels(name).set(float("nan") if value is None else float(value))
        self.gauges.pulls.set(node.pulls.in_flight())
        self.gauges.watching.set(node.changes.waiting)
        self._cards(status.occupancy)
        try:
            self._counts(await node.health.job_counts(node.pending))
        except NodeError:  # the engine down: how many jobs is unknown, not zero
            self.gauges.jobs.clear()
        if self.per_job is not None:
            self.per_job.update(node.sampler.samples.values())
            self.per_job.disk(node.monitor.measured.values())

    def _cache(self, cache: CacheStatus | None) -> None:
        """No cache (the process runtime) is always in step with itself."""
        self.gauges.synced.set(1 if cache is None or cache.synced else 0)
        ages = [] if cache is None else [cache.last_event_age_s, cache.last_relist_age_s]
        known = [age for age in ages if age is not None]
        self.gauges.cache_age.set(min(known) if known else float("nan"))  # NaN: unknown

    def _node_state(self, current: str) -> None:
        for state in STATES:
            self.gauges.node_state.labels(state).set(1 if state == current else 0)

    def _counts(self, counts: Counter[str]) -> None:
        self.gauges.jobs.clear()
        for status in (*JOB_STATUSES, *PENDING_PHASES, *counts):
            self.gauges.jobs.labels(status).set(counts.get(status, 0))

    def _cards(self, occupancy: Occupancy | None) -> None:
        for gauge in (
            self.gauges.gpus,
            self.gauges.gpu_memory,
            self.gauges.gpu_temperature,
            self.gauges.gpu_busy,
            self.gauges.card_faults,
        ):
            gauge.clear()  # a card gone, or unknown now, is no series (never a stale 0)
        if occupancy is None or not occupancy.known:
            return
        if occupancy.breaker is not None:
            self.gauges.breaker_tripped.set(1 if occupancy.breaker.tripped else 0)
            self.gauges.breaker_kept_in.set(occupancy.breaker.kept_in)
        kinds = Counter(occupancy.card_kind(index) for index in range(occupancy.total))
        for kind in CARD_KINDS:
            self.gauges.gpus.labels(kind).set(kinds.get(kind, 0))
        for card in occupancy.gpus.cards if occupancy.gpus else ():
            labels = (str(card.index), card.uuid or "", card.name or "")
            if card.memory_used_mib is not None:
                self.gauges.gpu_memory.labels(*labels).set(card.memory_used_mib * MIB)
            if card.temperature_c is not None:
                self.gauges.gpu_temperature.labels(*labels).set(card.temperature_c)
            if card.utilization_pct is not None:
                self.gauges.gpu_busy.labels(*labels).set(card.utilization_pct / 100)
            if card.fault is not None:
                self.gauges.card_faults.labels(str(card.index), card.fault.scope).set(1)

    # --- the event loop's lag -----------------------------------------------------------

    async def watch_lag(self) -> None:
        """How late the loop wakes a sleeper: what every request waits on top of its work."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(LAG_PERIOD_S)
            late = loop.time() - start - LAG_PERIOD_S
            self.worst_lag = max(self.worst_lag, late)


def _known(value: int | bool | None) -> float:
    return float("nan") if value is None else value  # NaN: unknown, never a 0


class StateGauges:
    """The node's state as gauges, set at each scrape from what the node reads then."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, about: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(f"{PREFIX}_{name}", about, list(labels), registry=registry)

        self.gpus = gauge("gpus", "Cards by state; they sum to the card count.", ("state",))
        self.gpu_memory = gauge("gpu_memory_used_bytes", "Memory in use per card.", CARD_LABELS)
        self.gpu_temperature = gauge(
            "gpu_temperature_celsius", "Temperature per card.", CARD_LABELS
        )
        self.gpu_busy = gauge(
            "gpu_utilization_ratio", "Busy share of the driver's last sample.", CARD_LABELS
        )
        self.jobs = gauge(
            "jobs", "The node's containers by status, and pending launches by phase.", ("status",)
        )
        self.pulls = gauge("pulls_in_flight", "Image pulls running now.")
        self.watching = gauge("watch_waiting", "Watch queries waiting for a change now.")
        self.synced = gauge("state_cache_synced", "1 while the container-state cache is synced.")
        self.cache_age = gauge(
            "state_cache_age_seconds", "Seconds since the engine last confirmed the cache."
        )
        self.lag = gauge(
            "event_loop_lag_seconds", "Worst event-loop delay since the previous scrape."
        )
        self.node_state = gauge("node_state", "1 for the node's state.", ("state",))
        self.breaker_tripped = gauge(
            "gpu_breaker_tripped",
            "1 while the GPU circuit breaker keeps faulted cards in (past "
            "TUNEPLANE_GPU_BREAKER_PER_HOUR), until `ctl gpus reset-breaker`; 0 not.",
        )
        self.breaker_kept_in = gauge(
            "gpu_breaker_kept_in", "Faulted cards the GPU circuit breaker keeps in now."
        )
        self.card_faults = gauge(
            "gpu_fault", "1 per card with a fault, by its scope (job, card, node).",
            ("gpu", "scope"),
        )  # fmt: skip
        self.notices = gauge(
            "notice_deadline_seconds",
            "A notice the node acts on (the cloud's, the OS's): its deadline, seconds since "
            "the epoch (NaN: the source gave none).",
            ("source", "kind"),
        )
        self.health_ok = gauge(
            "health_ok",
            "1 while health says ok; 0 not (the engine, the cards' occupancy, or a "
            "pressure refusing every launch: health's error says which).",
        )
        self.gpu_ready = gauge(
            "gpu_ready",
            "1: a launch asking for cards can run here; 0: it cannot (health's "
            "gpu_not_ready_reason says why); NaN on a node without cards.",
        )
        self.store_total = gauge(
            "image_store_total_bytes", "Size of the filesystem of the engine's data root."
        )
        self.store_free = gauge(
            "image_store_free_bytes", "Bytes free there (to others than root); NaN: unknown."
        )
        self.conditions = gauge(
            "condition", "1 while the node is under that pressure, 0 not; NaN unknown.",
            ("condition",),
        )  # fmt: skip


class _PerJob:
    """Each running job's latest sample, labelled by ``run_id`` (and ``gpu`` per card):
    as many series as jobs run, which is why `TUNEPLANE_METRICS_PER_JOB` is off by
    default. A figure unknown is no series, never a 0."""

    def __init__(self, registry: CollectorRegistry) -> None:
        def gauge(name: str, about: str, labels: tuple[str, ...] = ("run_id",)) -> Gauge:
            return Gauge(f"{PREFIX}_job_{name}", about, list(labels), registry=registry)

        card = ("run_id", "gpu")
        self.job = {
            "cpu_ratio": gauge("cpu_ratio", "Cores in use over the last sample period."),
            "memory_bytes": gauge("memory_bytes", "Working set (charged less inactive files)."),
            "memory_limit_bytes": gauge("memory_limit_bytes", "Memory limit; none: unlimited."),
            "pids": gauge("pids", "Processes and threads."),
        }
        self.disks = {
            "used_bytes": gauge(
                "disk_used_bytes", "Written to the engine's disk (layer, volumes)."
            ),
            "limit_bytes": gauge("disk_limit_bytes", "Its disk limit; none: unlimited."),
        }
        self.cards = {
            "utilization_ratio": gauge("gpu_utilization_ratio", "Busy share per card.", card),
            "memory_used_bytes": gauge("gpu_memory_used_bytes", "Memory in use per card.", card),
            "power_watts": gauge("gpu_power_watts", "Power drawn per card.", card),
            "temperature_celsius": gauge("gpu_temperature_celsius", "Temperature per card.", card),
        }

    def disk(self, measured: Iterable[Measured]) -> None:
        for gauge in self.disks.values():
            gauge.clear()
        for seen in measured:
            for name, gauge in self.disks.items():
                if (value := getattr(seen.figures, name)) is not None:
                    gauge.labels(seen.run_id or "").set(value)

    def update(self, samples: Iterable[JobSample]) -> None:
        for gauge in (*self.job.values(), *self.cards.values()):
            gauge.clear()  # a job gone is no series
        for sample in samples:
            run_id = sample.run_id or ""
            for name, gauge in self.job.items():
                if (value := getattr(sample, name)) is not None:
                    gauge.labels(run_id).set(value)
            for card in sample.gpus:
                for name, gauge in self.cards.items():
                    if (value := getattr(card, name)) is not None:
                        gauge.labels(run_id, str(card.index)).set(value)
