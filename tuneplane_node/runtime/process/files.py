"""The process runtime's state directory: one directory of records per job.

``<root>/<name>/`` holds::

    spec.json    id, name, created_at and the spec (labels included), written before start
    proc.json    pid and /proc start time of the job and of its log stamper, and started_at
    output.log   stdout and stderr, each line prefixed with an RFC 3339 nanosecond time
    rc           the exit code, written atomically by the job's wrapper as it ends

Every read goes to the files, so a daemon restart loses nothing. Times are given by the
caller: this module keeps no clock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tuneplane_node.clock import parse_rfc3339, rfc3339
from tuneplane_node.durable import create_once, write_atomically
from tuneplane_node.errors import EngineRefused, EngineUnavailable
from tuneplane_node.logformat import job_fields
from tuneplane_node.runtime.base import EXIT_SIGKILL
from tuneplane_node.runtime.labels import job_labels
from tuneplane_node.runtime.process.groups import Proc
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.signals import DEFAULT_STOP_SIGNAL

log = logging.getLogger(__name__)

ENGINE = "process"
SPEC_FILE = "spec.json"
PROC_FILE = "proc.json"
LOG_FILE = "output.log"
DELETE_PASSES, DELETE_PAUSE_S = 3, 0.05
RC_FILE = "rc"
_VALID_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,254}")  # docker's rule: no "/" or ".."


@dataclass(frozen=True)
class Job:
    """What a job's records say: started (``main`` set) once proc.json is written."""

    name: str
    dir: Path
    id: str
    created_at: str | None
    labels: dict[str, str]
    stop_signal: str = DEFAULT_STOP_SIGNAL  # no image, so no STOPSIGNAL: the spec's or this
    started_at: str | None = None
    main: Proc | None = None
    stamper: Proc | None = None


class JobFiles:
    """The jobs' directories under ``root``, read afresh on every call."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def dir(self, name: str) -> Path | None:
        """The job's directory, or None for a name that could point outside the root."""
        return self.root / name if _VALID_NAME.fullmatch(name) else None

    def load(self, name: str) -> Job | None:
        """The job's files; None when there is no job (or it is still being made)."""
        job_dir = self.dir(name)
        if job_dir is None:
            return None
        with unreadable():
            try:
                record = json.loads((job_dir / SPEC_FILE).read_text())
            except FileNotFoundError:
                return None
            spec = record["spec"]
            labels = {str(k): str(v) for k, v in spec.get("labels", {}).items()}
            stop = str(spec.get("stop_signal") or DEFAULT_STOP_SIGNAL)
            job = Job(name, job_dir, str(record["id"]), record.get("created_at"), labels, stop)
            with contextlib.suppress(FileNotFoundError):
                started = json.loads((job_dir / PROC_FILE).read_text())
                job = dataclasses.replace(
                    job,
                    started_at=started["started_at"],
                    main=Proc(**started["main"]),
                    stamper=Proc(**started["stamper"]),
                )
        return job

    def names(self) -> list[str]:
        """Every job's name: its directory's."""
        with unreadable():
            if not self.root.is_dir():
                return []
            return sorted(entry.name for entry in self.root.iterdir() if entry.is_dir())

    def delete(self, name: str, job_dir: Path) -> None:
        """Delete the job's files; already gone (or going, by another remove) is done.
        A file made while the tree was deleted (a process of the job that left its
        group, writing as it ended; seen once in CI) is deleted on a second pass."""
        with refusal(f"remove {name}"):
            for left in reversed(range(DELETE_PASSES)):
                try:
                    shutil.rmtree(job_dir)
                    break
                except FileNotFoundError:
                    return
                except OSError as exc:
                    if exc.errno != errno.ENOTEMPTY or not left:
                        raise
                    time.sleep(DELETE_PAUSE_S)
        log.info("removed job %s", name, extra=job_fields(name))


def write_spec(job_dir: Path, spec: ContainerSpec, *, job_id: str, created_at: str) -> None:
    """spec.json: the job exists (created) from here on."""
    record = {"id": job_id, "name": spec.name, "created_at": created_at, "spec": _record(spec)}
    _write_atomic(job_dir / SPEC_FILE, json.dumps(record, indent=2, default=_jsonable))


def write_started(job_dir: Path, *, started_at: str, main: Proc, stamper: Proc) -> None:
    """proc.json: the job runs, and these are the processes to watch and stop."""
    started = {
        "started_at": started_at,
        "main": dataclasses.asdict(main),
        "stamper": dataclasses.asdict(stamper),
    }
    _write_atomic(job_dir / PROC_FILE, json.dumps(started))


def exit_record(rc_file: Path, started_at: str | None) -> tuple[int | None, str | None]:
    """(exit code, finished_at) of an ended job.

    A job gone without writing its code was killed (SIGKILL to its group, the OOM
    killer, a reboot): it is given 137, once, and the moment it was found dead becomes
    its finish time. ``create_once`` never replaces, so a code the wrapper wrote stays.
    The finish is never before ``started_at``: a file's time is the kernel's coarse
    clock, up to a tick behind the clock that read the start.
    """
    if not rc_file.exists():
        create_once(rc_file, str(EXIT_SIGKILL).encode())
    text = rc_file.read_text().strip()
    finished = datetime.fromtimestamp(rc_file.stat().st_mtime, timezone.utc)
    started = parse_rfc3339(started_at)
    finished_at = started_at if started is not None and finished < started else rfc3339(finished)
    if not text.isdigit():
        log.warning("unreadable exit code %r in %s", text, rc_file)
        return None, finished_at
    return int(text), finished_at


@contextlib.contextmanager
def refusal(action: str) -> Iterator[None]:
    """An OS error while changing a job: the runtime answered, and refused."""
    try:
        yield
    except OSError as exc:
        raise EngineRefused(engine=ENGINE, action=action, reason=str(exc)) from exc


@contextlib.contextmanager
def unreadable() -> Iterator[None]:
    """State that cannot be read is unknown (503), never "the job is gone"."""
    try:
        yield
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EngineUnavailable(engine=ENGINE, reason=f"cannot read job state: {exc!r}") from exc


def _record(spec: ContainerSpec) -> dict[str, Any]:
    record = {field.name: getattr(spec, field.name) for field in dataclasses.fields(spec)}
    return {**record, "labels": job_labels(spec)}


def _jsonable(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _write_atomic(path: Path, text: str) -> None:
    """Readers see the old file or the new one, never half of it."""
    write_atomically(path, text.encode())
