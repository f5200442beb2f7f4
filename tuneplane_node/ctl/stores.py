"""The node's stores as an operator reads them: its images and pulls, an image GC run,
the volume store's entries and fills, a volume prefetch and an eviction run. As every
table of ctl (`render`): the answer's JSON as the API gives it, shown as text, a
figure the node does not send shown as unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from rich.console import Console
from rich.table import Table

from tuneplane_node.ctl.render import (
    UNKNOWN,
    age,
    age_s,
    as_text,
    eta,
    iec,
    image_store,
    known,
    known_size,
    rate,
    seconds,
)

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
            known_size(image.get("size_bytes")),
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


def show_image_gc(console: Console, answer: Mapping[str, Any]) -> None:
    """What a GC run removed, one line each, then the store after it."""
    removed = answer.get("removed") or []
    table = Table(title=f"Images removed ({answer.get('scope')} scope)", title_justify="left")
    for column in ("image", "id", "size", "why"):
        table.add_column(column)
    for image in removed:
        short = str(image.get("id", "")).removeprefix("sha256:")[:12]
        table.add_row(
            image.get("image", ""), short, known_size(image.get("size_bytes")), image.get("why", "")
        )
    if removed:
        console.print(table)
    freed = known_size(answer.get("freed_bytes"))
    console.print(f"removed {len(removed)} image(s), {freed} freed")
    if isinstance(answer.get("image_store"), Mapping):
        console.print(f"image store: {image_store(answer['image_store'])}")


# --- volumes ------------------------------------------------------------------------------


def volume_store(store: Mapping[str, Any]) -> str:
    """``/var/lib/tuneplane/volumes: 12.0 GiB free of 100.0 GiB, 40.0 GiB of entries
    (evicts at 85%, to 80%)``."""
    thresholds = f"(evicts at {store.get('high_percent')}%, to {store.get('low_percent')}%)"
    if store.get("total_bytes") is None:
        return f"{known(store.get('path'))}: figures unknown {thresholds}"
    free, total = known_size(store.get("free_bytes")), known_size(store.get("total_bytes"))
    used = known_size(store.get("used_bytes"))
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
            known_size(entry.get("size_bytes")),
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
        size = known_size(answer.get("size_bytes"))
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
            known_size(entry.get("size_bytes")),
            age(entry.get("last_used_at"), now) or "-",
        )
    if removed:
        console.print(table)
    console.print(
        f"evicted {len(removed)} volume(s), {known_size(answer.get('freed_bytes'))} freed"
    )
    if isinstance(answer.get("volume_store"), Mapping):
        console.print(f"volume store: {volume_store(answer['volume_store'])}")


def _left(stamp: str | None, now: datetime) -> str:
    """How long until ``stamp`` (an RFC 3339 time), ``-`` when none or past."""
    since = age_s(stamp, now) if stamp else None
    return "-" if since is None or since >= 0 else seconds(-since)
