"""The node's answers as an operator reads them: rich tables, and a pull's progress bar.

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


def _known(value: object, suffix: str = "") -> str:
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


def _size(value: object) -> str:
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
    runtime = answer.get("runtime") or {}
    table.add_row("engine", f"{runtime.get('name', '?')} {_known(runtime.get('version'))}")
    table.add_row("protocol", str(answer.get("protocol")))
    table.add_row(
        "cards",
        f"{_known(answer.get('gpus_total'))} total, {_known(answer.get('gpus_free'))} free, "
        f"{_known(answer.get('gpus_reserved'))} reserved",
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
        return f"{_known(store.get('path'))}: figures unknown"
    ratio = store.get("used_ratio")
    used = f"{ratio * 100:.1f}% used" if isinstance(ratio, (int, float)) else UNKNOWN
    flag = ", [red]PRESSURE[/]" if store.get("pressure") else ""
    free, total = _size(store.get("free_bytes")), _size(store.get("total_bytes"))
    return f"{store.get('path')}: {free} free of {total} ({used}{flag})"


def show_image_gc(console: Console, answer: Mapping[str, Any]) -> None:
    """What a GC run removed, one line each, then the store after it."""
    removed = answer.get("removed") or []
    table = Table(title=f"Images removed ({answer.get('scope')} scope)", title_justify="left")
    for column in ("image", "id", "size", "why"):
        table.add_column(column)
    for image in removed:
        short = str(image.get("id", "")).removeprefix("sha256:")[:12]
        table.add_row(
            image.get("image", ""), short, _size(image.get("size_bytes")), image.get("why", "")
        )
    if removed:
        console.print(table)
    freed = _size(answer.get("freed_bytes"))
    console.print(f"removed {len(removed)} image(s), {freed} freed")
    if isinstance(answer.get("image_store"), Mapping):
        console.print(f"image store: {image_store(answer['image_store'])}")


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
            _known(card.get("name")),
            f"{_known(used, ' MiB')} / {_known(total, ' MiB')}",
            _known(card.get("temperature_c"), " °C"),
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
    table.add_row("node id", _known(answer.get("node_id")))
    table.add_row("hostname", _known(answer.get("hostname")))
    if isinstance(answer.get("node_state"), Mapping):
        table.add_row("node", node_state(answer["node_state"], now))
    table.add_row("agent", _known(answer.get("agent_version")))
    table.add_row("engine", _known(answer.get("runtime")))
    cards = f"{_known(answer.get('accelerator_count'))} x {_known(answer.get('accelerator_name'))}"
    table.add_row("accelerators", f"{cards} (series {_known(answer.get('accelerator_series'))})")
    driver = f"{_known(answer.get('driver'))}, CUDA {_known(answer.get('cuda_version'))}"
    table.add_row("driver", driver)
    table.add_row("CPUs", _known(answer.get("cpu_count")))
    table.add_row("memory", _size(answer.get("memory_bytes")))
    local = answer.get("local_disk") or {}
    free, total = _size(local.get("free_bytes")), _size(local.get("total_bytes"))
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
            _known(entry.get("fs_type")),
            "yes" if entry.get("shared") else "no",
            _size(entry.get("free_bytes")),
            _size(entry.get("total_bytes")),
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
            f"{_size(job.get('memory_bytes'))} / {_limit(job.get('memory_limit_bytes'))}",
            _known(job.get("pids")),
            "\n".join(_card(card) for card in job.get("gpus") or []),
            f"{age(job.get('sampled_at'), now)} ago" if job.get("sampled_at") else UNKNOWN,
        )
    return table


def _limit(value: object) -> str:
    return "no limit" if value is None else _size(value)


def _card(card: Mapping[str, Any]) -> str:
    """``0: 87% 37.3 GiB/79.6 GiB 312 W 65 °C``, unknown parts left out."""
    parts = [f"{card.get('index')}:"]
    busy = card.get("utilization_ratio")
    parts.append(UNKNOWN if busy is None else f"{busy:.0%}")
    used, total = card.get("memory_used_bytes"), card.get("memory_total_bytes")
    if used is not None:
        parts.append(f"{_size(used)}/{_size(total)}")
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


# --- images ---------------------------------------------------------------------------


def show_images(console: Console, answer: Mapping[str, Any]) -> None:
    answer, now = as_text(answer), datetime.now(timezone.utc)
    console.print(images_table(answer.get("images", []), now))
    if answer.get("pulls"):
        console.print(image_pulls_table(answer["pulls"], now))


def images_table(images: list[Mapping[str, Any]], now: datetime) -> Table:
    table = Table(title="Images", title_justify="left")
    for column in ("image", "id", "size", "pulled", "used", "in use by", "private"):
        table.add_column(column)
    for image in images:
        table.add_row(
            image.get("image", ""),
            str(image.get("id", "")).removeprefix("sha256:")[:12],
            _size(image.get("size_bytes")),
            age(image.get("pulled_at"), now) or "-",
            age(image.get("last_used_at"), now) or "-",
            ", ".join(image.get("in_use_by", [])),
            "yes" if image.get("private") else "",
        )
    return table


def image_pulls_table(pulls: list[Mapping[str, Any]], now: datetime) -> Table:
    table = Table(title="Pulls", title_justify="left")
    for column in ("image", "phase", "bytes", "layers", "rate", "ETA", "age", "waiting", "error"):
        table.add_column(column)
    for pull in pulls:
        done, total = pull.get("bytes_done", 0), pull.get("bytes_total", 0)
        table.add_row(
            pull.get("image", ""),
            pull.get("phase", ""),
            f"{iec(done)} / {iec(total)}" if total else iec(done),
            f"{pull.get('layers_done', 0)}/{pull.get('layers_total', 0)}",
            rate(pull.get("rate_bytes_per_s")),
            eta(pull.get("eta_s")),
            age(pull.get("started_at"), now),
            ", ".join(pull.get("waiting", [])),
            pull.get("error") or "",
        )
    return table


# --- volumes ------------------------------------------------------------------------------


def volume_store(store: Mapping[str, Any]) -> str:
    """``/var/lib/tuneplane/volumes: 12.0 GiB free of 100.0 GiB, 40.0 GiB of entries
    (evicts at 85%, to 80%)``."""
    thresholds = f"(evicts at {store.get('high_percent')}%, to {store.get('low_percent')}%)"
    if store.get("total_bytes") is None:
        return f"{_known(store.get('path'))}: figures unknown {thresholds}"
    free, total = _size(store.get("free_bytes")), _size(store.get("total_bytes"))
    used = _size(store.get("used_bytes"))
    return f"{store.get('path')}: {free} free of {total}, {used} of entries {thresholds}"


def show_volumes(console: Console, answer: Mapping[str, Any]) -> None:
    answer, now = as_text(answer), datetime.now(timezone.utc)
    table = Table(title="Volumes", title_justify="left")
    for column in ("sha256", "size", "used", "in use by", "pinned for"):
        table.add_column(column)
    for entry in answer.get("entries", []):
        users = entry.get("in_use_by")
        table.add_row(
            str(entry.get("sha256", ""))[:12],
            _size(entry.get("size_bytes")),
            age(entry.get("last_used_at"), now) or "-",
            UNKNOWN if users is None else ", ".join(users),
            _left(entry.get("pin_expires_at"), now),
        )
    console.print(table)
    if answer.get("fills"):
        console.print(volume_fills_table(answer["fills"], now))
    if isinstance(answer.get("volume_store"), Mapping):
        console.print(f"volume store: {volume_store(answer['volume_store'])}")


def volume_fills_table(fills: list[Mapping[str, Any]], now: datetime) -> Table:
    table = Table(title="Fills", title_justify="left")
    for column in ("sha256", "source", "phase", "bytes", "rate", "ETA", "age", "waiting", "error"):
        table.add_column(column)
    for fill in fills:
        done, total = fill.get("bytes_done", 0), fill.get("bytes_total")
        table.add_row(
            str(fill.get("sha256", ""))[:12],
            fill.get("source", ""),
            fill.get("phase", ""),
            f"{iec(done)} / {iec(total)}" if total else iec(done),
            rate(fill.get("rate_bytes_per_s")),
            eta(fill.get("eta_s")),
            age(fill.get("started_at"), now),
            str(fill.get("waiting", 0)),
            fill.get("error") or "",
        )
    return table


def show_volume_pull(console: Console, answer: Mapping[str, Any]) -> None:
    answer = as_text(answer)
    digest, phase = str(answer.get("sha256", ""))[:12], answer.get("phase", "")
    fill = answer.get("fill")
    if isinstance(fill, Mapping) and fill.get("bytes_total"):
        console.print(f"{digest}: [cyan]{phase}[/] ({iec(fill['bytes_total'])})")
    else:
        size = _size(answer.get("size_bytes"))
        shown = f"[green]{phase}[/] ({size})" if phase == "present" else f"[cyan]{phase}[/]"
        console.print(f"{digest}: {shown}")


def show_volume_gc(console: Console, answer: Mapping[str, Any]) -> None:
    """What an eviction run removed, one line each, then the store after it."""
    removed, now = answer.get("removed") or [], datetime.now(timezone.utc)
    table = Table(title="Volumes evicted", title_justify="left")
    for column in ("sha256", "size", "last used"):
        table.add_column(column)
    for entry in removed:
        table.add_row(
            str(entry.get("sha256", ""))[:12],
            _size(entry.get("size_bytes")),
            age(entry.get("last_used_at"), now) or "-",
        )
    if removed:
        console.print(table)
    console.print(f"evicted {len(removed)} volume(s), {_size(answer.get('freed_bytes'))} freed")
    if isinstance(answer.get("volume_store"), Mapping):
        console.print(f"volume store: {volume_store(answer['volume_store'])}")


def _left(stamp: str | None, now: datetime) -> str:
    """How long until ``stamp`` (an RFC 3339 time), ``-`` when none or past."""
    since = age_s(stamp, now) if stamp else None
    return "-" if since is None or since >= 0 else seconds(-since)
