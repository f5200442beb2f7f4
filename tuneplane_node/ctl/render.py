"""The node's answers as an operator reads them: rich tables, and a pull's progress bar
(the image and volume stores' tables are in `stores`).

Every function takes the answer's JSON as the API gives it; a field a node does not
send (an older node, a field still to come) is shown as unknown, never as zero. The
answer's text is the engine's, a registry's or a job's: each entry point shows it as
text (`as_text`), never as rich markup nor as terminal controls.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from tuneplane_node.printable import printable

UNKNOWN = "[dim]unknown[/]"
STATUS_STYLES = {"running": "green", "created": "cyan", "exited": "yellow", "dead": "red"}
NODE_STATE_STYLES = {"ready": "green", "cordoned": "yellow", "draining": "yellow"}


def as_text(answer: Any) -> Any:
    """The answer with every string in it (keys too) as text: controls escaped, then
    rich's markup (``[link=...]`` was a live hyperlink). Once per answer: a second pass
    would show the first one's backslashes."""
    if isinstance(answer, str):
        return escape(printable(answer))
    if isinstance(answer, Mapping):
        return {as_text(key): as_text(value) for key, value in answer.items()}
    if isinstance(answer, (list, tuple)):
        return [as_text(value) for value in answer]
    return answer


def _facts(title: str | None = None) -> Table:
    """A two-column table of name and value."""
    table = Table(title=title, show_header=False, box=None, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    return table


def known(value: object, suffix: str = "") -> str:
    return UNKNOWN if value is None else f"{value}{suffix}"


IEC_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB")


def iec(size: int) -> str:
    """``9.5 MiB``: powers of 1024, the units the node's settings, health and docs use
    (one system everywhere: never a GB beside a GiB)."""
    if size < 1024:
        return f"{size} byte" if size == 1 else f"{size} bytes"
    value = float(size)
    for unit in IEC_UNITS:
        value /= 1024
        if value < 1024 or unit == IEC_UNITS[-1]:
            break
    return f"{value:.1f} {unit}"


def known_size(value: object) -> str:
    return iec(value) if isinstance(value, int) else UNKNOWN


def age(moment: str | None, now: datetime) -> str:
    """``5s``, ``3m``, ``2h``, ``4d`` since an RFC 3339 time; "" when there is none."""
    if not moment:
        return ""
    since = age_s(moment, now)
    return "?" if since is None else seconds(since)


def age_s(moment: str, now: datetime) -> float | None:
    """Seconds since an RFC 3339 time (negative: to come); None when it is not one."""
    try:  # the wire's times are UTC with Z; 3.10's fromisoformat takes neither Z nor ns
        then = datetime.fromisoformat(moment.rstrip("Z")[:26]).replace(tzinfo=timezone.utc)
    except ValueError:
        return None
    return (now - then).total_seconds()


def seconds(value: float) -> str:
    value = max(0.0, value)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if value >= size:
            return f"{int(value // size)}{unit}"
    return f"{int(value)}s"


# --- node state -----------------------------------------------------------------------


def node_state(state: Mapping[str, Any], now: datetime) -> str:
    """``cordoned: kernel upgrade (since 5m)``."""
    name = str(state.get("state") or "unknown")
    text = f"[{NODE_STATE_STYLES.get(name, 'red')}]{name}[/]"
    if state.get("reason"):
        text += f": {state['reason']}"
    since = age(state.get("since"), now)
    return f"{text} (since {since})" if since else text


def show_node_state(console: Console, answer: Mapping[str, Any]) -> None:
    console.print(f"node {node_state(as_text(answer), datetime.now(timezone.utc))}")


def show_breaker(console: Console, answer: Mapping[str, Any]) -> None:
    state = "tripped" if answer.get("tripped") else "closed"
    console.print(
        f"gpu breaker {state}: {answer.get('taken')} of {answer.get('limit')} card(s) taken "
        f"out this hour, {answer.get('kept_in')} kept in"
    )


# --- health ---------------------------------------------------------------------------


def show_health(console: Console, answer: Mapping[str, Any]) -> None:
    answer = as_text(answer)
    console.print(_health_facts(answer, datetime.now(timezone.utc)))
    if answer.get("gpu_detail"):
        console.print(_cards(answer["gpu_detail"], title="Cards", states=True))
    if answer.get("pending_pulls"):
        console.print(_pulls(answer["pending_pulls"]))
    notes = [line for line in answer.get("explain") or [] if not line.startswith("gpu ")]
    for line in notes:
        console.print(f"[dim]{line}[/]")


def _health_facts(answer: Mapping[str, Any], now: datetime) -> Table:
    table = _facts()
    ok = answer.get("ok")
    table.add_row("health", "[green]ok[/]" if ok else f"[red]NOT OK[/]: {answer.get('error', '')}")
    table.add_row("card jobs", card_jobs(answer))
    if isinstance(answer.get("node_state"), Mapping):
        table.add_row("node", node_state(answer["node_state"], now))
    for notice in answer.get("notices") or []:
        table.add_row("[red]notice[/]", notice_line(notice))
    runtime = answer.get("runtime") or {}
    table.add_row("engine", f"{runtime.get('name', '?')} {known(runtime.get('version'))}")
    table.add_row("protocol", str(answer.get("protocol")))
    table.add_row(
        "cards",
        f"{known(answer.get('gpus_total'))} total, {known(answer.get('gpus_free'))} free, "
        f"{known(answer.get('gpus_reserved'))} reserved",
    )
    probe = answer.get("gpu_probe") or {}
    if probe:
        table.add_row("gpu probe", f"{probe.get('source')}: {probe.get('error') or 'ok'}")
    cache = answer.get("state_cache")
    if cache:
        synced = "synced" if cache.get("synced") else "[red]not synced[/]"
        table.add_row("state cache", f"{synced}, {cache.get('containers')} containers")
    disk = answer.get("disk")
    if disk:
        table.add_row("disk", f"{disk['path']}: {disk['free_gib']} GiB free")
    if isinstance(answer.get("image_store"), Mapping):
        table.add_row("image store", image_store(answer["image_store"]))
    if isinstance(answer.get("conditions"), Mapping):
        table.add_row("conditions", conditions(answer["conditions"]))
    if isinstance(rule := answer.get("job_disk"), Mapping):
        held = rule.get("held_by") or "nothing known yet"
        table.add_row("job disk", f"limit {rule.get('limit')}, held by {held}")
    return table


def notice_line(notice: Mapping[str, Any]) -> str:
    """``preempt: aws spot terminate, by 2026-12-06T10:02:00Z (drains)``."""
    by = f", by {notice['deadline']}" if notice.get("deadline") else ""
    acts = "drains" if notice.get("ends_jobs") else "cordons"
    return f"{notice.get('kind')}: {notice.get('source')} {notice.get('detail', '')}{by} ({acts})"


def conditions(shown: Mapping[str, Any]) -> str:
    """``disk_pressure: [red]yes[/], pid_pressure: no, memory_pressure: unknown``."""
    words = {True: "[red]yes[/]", False: "no", None: UNKNOWN}
    return ", ".join(f"{name}: {words.get(value, UNKNOWN)}" for name, value in shown.items())


def card_jobs(answer: Mapping[str, Any]) -> str:
    """Whether a launch asking for cards can run: health's ``gpu_ready`` and its reason."""
    ready = answer.get("gpu_ready")
    if ready is True:
        return "[green]can run[/]"
    if ready is False:
        return f"[red]CANNOT RUN[/]: {answer.get('gpu_not_ready_reason') or UNKNOWN}"
    return "none: the node has no cards" if answer.get("gpus_total") == 0 else UNKNOWN


def image_store(store: Mapping[str, Any]) -> str:
    """``/var/lib/docker: 12.0 GiB free of 100.0 GiB (88.0% used, PRESSURE)``."""
    if store.get("total_bytes") is None:
        return f"{known(store.get('path'))}: figures unknown"
    ratio = store.get("used_ratio")
    used = f"{ratio * 100:.1f}% used" if isinstance(ratio, (int, float)) else UNKNOWN
    flag = ", [red]PRESSURE[/]" if store.get("pressure") else ""
    free, total = known_size(store.get("free_bytes")), known_size(store.get("total_bytes"))
    return f"{store.get('path')}: {free} free of {total} ({used}{flag})"


def _cards(cards: list[Mapping[str, Any]], *, title: str, states: bool) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("card", "name", "memory used / total", "temp"):
        table.add_column(column)
    if states:
        table.add_column("state")
    for card in cards:
        used, total = card.get("memory_used_mib"), card.get("memory_total_mib")
        row = [
            str(card.get("index")),
            known(card.get("name")),
            f"{known(used, ' MiB')} / {known(total, ' MiB')}",
            known(card.get("temperature_c"), " °C"),
        ]
        if states:
            state = str(card.get("state", ""))
            row.append(f"[green]{state}[/]" if state == "free" else state)
        table.add_row(*row)
    return table


def _pulls(pulls: Mapping[str, Mapping[str, Any]]) -> Table:
    table = Table(title="Pending launches", title_justify="left")
    for column in ("ref", "image", "phase", "error"):
        table.add_column(column)
    for ref, pull in pulls.items():
        table.add_row(ref, pull.get("image", ""), pull.get("phase", ""), pull.get("error") or "")
    return table


# --- inventory ------------------------------------------------------------------------


def show_inventory(console: Console, answer: Mapping[str, Any]) -> None:
    answer = as_text(answer)
    console.print(_inventory_facts(answer, datetime.now(timezone.utc)))
    if answer.get("gpus"):
        console.print(_cards(answer["gpus"], title="Cards", states=False))
    if answer.get("storage"):
        console.print(_storage(answer["storage"]))
    if answer.get("fabrics"):
        console.print(_fabrics(answer["fabrics"]))


def _inventory_facts(answer: Mapping[str, Any], now: datetime) -> Table:
    table = _facts()
    table.add_row("node id", known(answer.get("node_id")))
    table.add_row("hostname", known(answer.get("hostname")))
    if isinstance(answer.get("node_state"), Mapping):
        table.add_row("node", node_state(answer["node_state"], now))
    table.add_row("agent", known(answer.get("agent_version")))
    table.add_row("engine", known(answer.get("runtime")))
    cards = f"{known(answer.get('accelerator_count'))} x {known(answer.get('accelerator_name'))}"
    table.add_row("accelerators", f"{cards} (series {known(answer.get('accelerator_series'))})")
    driver = f"{known(answer.get('driver'))}, CUDA {known(answer.get('cuda_version'))}"
    table.add_row("driver", driver)
    table.add_row("CPUs", known(answer.get("cpu_count")))
    table.add_row("memory", known_size(answer.get("memory_bytes")))
    local = answer.get("local_disk") or {}
    free, total = known_size(local.get("free_bytes")), known_size(local.get("total_bytes"))
    table.add_row("local disk", f"{free} free of {total}" if local else UNKNOWN)
    if isinstance(answer.get("image_store"), Mapping):
        table.add_row("image store", image_store(answer["image_store"]))
    return table


def _storage(entries: list[Mapping[str, Any]]) -> Table:
    table = Table(title="Storage", title_justify="left")
    for column in ("paths", "filesystem", "shared", "free", "total"):
        table.add_column(column)
    for entry in entries:
        table.add_row(
            "\n".join(entry.get("paths", [])),
            known(entry.get("fs_type")),
            "yes" if entry.get("shared") else "no",
            known_size(entry.get("free_bytes")),
            known_size(entry.get("total_bytes")),
        )
    return table


def _fabrics(fabrics: list[Mapping[str, Any]]) -> Table:
    table = Table(title="Fabrics", title_justify="left")
    for column in ("fabric", "HCAs", "rate"):
        table.add_column(column)
    for fabric in fabrics:
        rate = fabric.get("rate_gbps")
        table.add_row(
            str(fabric.get("fabric")),
            ", ".join(fabric.get("hcas", [])),
            f"{rate:g} Gb/s" if rate is not None else "[red]no active port[/]",
        )
    return table


# --- jobs -----------------------------------------------------------------------------


def show_states(console: Console, states: Mapping[str, Mapping[str, Any]]) -> None:
    console.print(states_table(states))


def states_table(states: Mapping[str, Mapping[str, Any]], title: str = "Jobs") -> Table:
    """One row per job: observe's, the list's and the watch's; the API's text as text."""
    states, now = as_text(states), datetime.now(timezone.utc)
    table = Table(title=title, title_justify="left")
    for column in ("ref", "status", "age", "run", "cards", "detail"):
        table.add_column(column)
    for ref, state in states.items():
        labels = state.get("labels") or {}
        table.add_row(
            ref,
            status(state),
            _job_age(state, now),
            labels.get("tuneplane.run-id", ""),
            labels.get("tuneplane.gpus", ""),
            _job_detail(state),
        )
    return table


def status(state: Mapping[str, Any]) -> str:
    """``running``, ``exited (137)``, ``pulling 45%``, ``absent``, styled; of a state
    already `as_text`."""
    if not state.get("exists"):
        return "[dim]absent[/]"
    phase = state.get("pending_phase")
    if phase == "pulling":
        done, total = state.get("pending_bytes_done", 0), state.get("pending_bytes_total", 0)
        return f"[cyan]pulling {100 * done // total}%[/]" if total else "[cyan]pulling[/]"
    if phase is not None:
        return f"[{'red' if phase == 'failed' else 'cyan'}]{phase}[/]"
    name = str(state.get("status"))
    code = state.get("exit_code")
    text = f"{name} ({code})" if code is not None else name
    return f"[{STATUS_STYLES.get(name, 'white')}]{text}[/]"


def _job_age(state: Mapping[str, Any], now: datetime) -> str:
    if state.get("pending_phase") is not None:
        return seconds(float(state.get("pending_elapsed_s") or 0))
    return age(state.get("created_at"), now)


def _job_detail(state: Mapping[str, Any]) -> str:
    if state.get("pending_error"):
        return str(state["pending_error"])
    if state.get("pending_image"):
        return str(state["pending_image"])
    if state.get("oom_killed"):
        return "[red]killed: out of memory[/]"
    if state.get("finished_at"):
        return f"finished {age(state['finished_at'], datetime.now(timezone.utc))} ago"
    return ""


# --- stats ----------------------------------------------------------------------------


def stats_table(stats: Mapping[str, Mapping[str, Any]]) -> Table:
    """One row per job: what it uses, and each card it holds; a job that does not run
    says its status instead."""
    table = Table(title="Stats", title_justify="left")
    for column in ("ref", "status", "CPU", "memory / limit", "pids", "cards", "sampled"):
        table.add_column(column)
    stats, now = as_text(stats), datetime.now(timezone.utc)
    for ref, job in stats.items():
        if "cpu_ratio" not in job:
            said = status(job) if job.get("exists") else "[dim]absent[/]"
            table.add_row(ref, said, "", "", "", "", "")
            continue
        cpu = job.get("cpu_ratio")
        table.add_row(
            ref,
            status(job),
            UNKNOWN if cpu is None else f"{cpu:.2f} cores",
            f"{known_size(job.get('memory_bytes'))} / {_limit(job.get('memory_limit_bytes'))}",
            known(job.get("pids")),
            "\n".join(_card(card) for card in job.get("gpus") or []),
            f"{age(job.get('sampled_at'), now)} ago" if job.get("sampled_at") else UNKNOWN,
        )
    return table


def _limit(value: object) -> str:
    return "no limit" if value is None else known_size(value)


def _card(card: Mapping[str, Any]) -> str:
    """``0: 87% 37.3 GiB/79.6 GiB 312 W 65 °C``, unknown parts left out."""
    parts = [f"{card.get('index')}:"]
    busy = card.get("utilization_ratio")
    parts.append(UNKNOWN if busy is None else f"{busy:.0%}")
    used, total = card.get("memory_used_bytes"), card.get("memory_total_bytes")
    if used is not None:
        parts.append(f"{known_size(used)}/{known_size(total)}")
    if card.get("power_watts") is not None:
        parts.append(f"{card['power_watts']:.0f} W")
    if card.get("temperature_celsius") is not None:
        parts.append(f"{card['temperature_celsius']} °C")
    return " ".join(parts)


# --- a launch's pull ------------------------------------------------------------------


class PullProgress:
    """A bar of a pull's bytes, with the node's rate and time left, and its layers, while a
    launch is pending or a prefetch runs; on a console that is not a terminal, one line
    per phase instead. ``update`` takes observe's state of the launch (``pending_*``
    keys) or, with ``prefix=""``, a pull of ``GET /node/v1/images``."""

    def __init__(self, console: Console, image: str, *, shown: bool = True) -> None:
        self.console = console
        self.image = as_text(image)
        self.shown = shown
        self.live = shown and console.is_terminal
        self.phase = ""
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(binary_units=True),
            TextColumn("{task.fields[rate]}"),
            TextColumn("ETA {task.fields[eta]}"),
            TextColumn("{task.fields[layers]} layers"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.task = self.progress.add_task(
            f"pulling {self.image}", total=None, layers="0/0", rate="?/s", eta="?"
        )

    def __enter__(self) -> PullProgress:
        if self.live:
            self.progress.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.progress.stop()

    def update(self, state: Mapping[str, Any], *, prefix: str = "pending_") -> None:
        state = as_text(state)

        def field(name: str, default: Any = 0) -> Any:
            return state.get(prefix + name, default)

        phase = str(field("phase", ""))
        self.progress.update(
            self.task,
            description=f"{phase} {self.image}",
            completed=field("bytes_done"),
            total=field("bytes_total") or None,
            layers=f"{field('layers_done')}/{field('layers_total')}",
            rate=rate(field("rate_bytes_per_s", None)),
            eta=eta(field("eta_s", None)),
        )
        if phase != self.phase and self.shown and not self.live:
            self.console.print(f"{phase} {self.image}")
        self.phase = phase


def rate(value: object) -> str:
    """The node's download rate, ``11.7 MiB/s``; ``?/s`` while it does not know it."""
    return f"{iec(int(value))}/s" if isinstance(value, (int, float)) else "?/s"


def eta(value: object) -> str:
    return seconds(float(value)) if isinstance(value, (int, float)) else "?"
