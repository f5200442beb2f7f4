"""The check's disk steps: the engine's store, the storage, the mount roots, how the
engine takes mounts, scratch and staging, the state directory."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from tuneplane_node import inventory
from tuneplane_node.checks.findings import FAIL, OK, WARN, Finding
from tuneplane_node.errors import ConfigError, NodeError
from tuneplane_node.settings import DEFAULT_STORAGE, NodeSettings, env_name

if TYPE_CHECKING:
    from tuneplane_node.runtime.base import ContainerRuntime


T = TypeVar("T")


def check_disk(settings: NodeSettings) -> list[Finding]:
    return [asyncio.run(_disk_finding(settings))]


async def _disk_finding(settings: NodeSettings) -> Finding:
    """What bounds a job's disk: project quotas, the monitor, or nothing (a remote store)."""
    from tuneplane_node.runtime import detect_runtime

    limit = f"{env_name('job_disk_limit')}={settings.job_disk_limit}"
    try:
        runtime = await detect_runtime(settings, cache=False)
    except ConfigError:
        return WARN, f"job disk: {limit}; the engine does not answer (see engine)"
    try:
        root = await runtime.data_root()
    except NodeError as exc:
        return WARN, f"job disk: {limit}; the engine's store unknown: {exc.message}"
    finally:
        await runtime.close()
    if root is None or root.space is None:
        where = "no store" if root is None else f"{root.path} is not on this machine"
        return WARN, f"job disk: {limit} is held by nothing ({where}): no job is measured"
    every = f"every {settings.job_disk_check_s:g} s"
    if root.project_quotas:
        return OK, f"job disk: {limit}, held by project quotas on {root.path} (monitor {every})"
    return OK, (
        f"job disk: {limit}, held by the disk monitor {every} ({root.path} has no project "
        "quotas: a job may write past its limit until the next pass)"
    )


def check_storage(settings: NodeSettings) -> list[Finding]:
    mounts = inventory.read_mounts()
    # Unset, the storage root is a default under the working directory: absent is no fault.
    explicit = settings.storage_root is not None
    found = [_directory("storage root", settings.storage, mounts, required=explicit)]
    return found + [_directory("model dir", d, mounts, required=True) for d in settings.model_dirs]


def _directory(what: str, path: Path, mounts: list[inventory.Mount], *, required: bool) -> Finding:
    try:
        resolved = path.expanduser().resolve()
        space = inventory.space(resolved) if resolved.is_dir() else None
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (3.11)
        return FAIL, f"{what}: {path}: {exc}"
    if space is None:
        return (FAIL if required else WARN), f"{what}: {resolved} is not a directory"
    fs_type = inventory.filesystem_type(resolved, mounts)
    shared = ", shared" if fs_type in inventory.SHARED_FILESYSTEMS else ""
    free = f"{space.available / 2**30:.1f} GiB free"
    return OK, f"{what}: {resolved} on {fs_type or 'an unknown filesystem'}{shared}, {free}"


def check_mount_roots(settings: NodeSettings) -> list[Finding]:
    roots = settings.mount_roots
    missing = [root for root in roots if not root.is_dir()]
    listed = ", ".join(str(root) for root in roots) or "none"
    if not missing:
        return [(OK, f"mount roots: {listed}")]
    # The unset storage root's default is no operator's promise: its absence only warns.
    default = settings.storage_root is None and missing == [DEFAULT_STORAGE.resolve()]
    named = ", ".join(str(root) for root in missing)
    return [(WARN if default else FAIL, f"mount roots: {named} missing; mounts from it fail")]


def check_mounts(settings: NodeSettings) -> list[Finding]:
    """How the engine takes host mounts, as a launch would: the start-up's refusal of a
    root holding the engine's own directories, and whether this process can stage."""
    return asyncio.run(_mount_findings(settings))


async def _mount_findings(settings: NodeSettings) -> list[Finding]:
    from tuneplane_node.jobs.mounts.policy import MountPolicy
    from tuneplane_node.runtime.facts import DIRECT, REMOTE

    answer = await _engine_answer(settings, lambda runtime: runtime.mount_support())
    if answer is None:
        return []  # the engine step has said why
    engine, support = answer
    policy = MountPolicy(settings.mount_roots, never_a_root=settings.never_a_root)
    problem = policy.root_holding(support.engine_dirs, engine=engine)
    if problem is not None:
        return [(FAIL, f"mounts: {problem}")]
    if support.mode == REMOTE:
        return [
            (WARN, f"mounts: {engine} is on another machine: host mounts are refused"),
            (WARN, f"scratch: {engine} is on another machine: container.scratch is refused"),
        ]
    if support.mode == DIRECT:
        return [
            (WARN, "mounts: the process runtime mounts nothing; jobs see host paths as given"),
            (WARN, "scratch: the process runtime mounts nothing: container.scratch is refused"),
        ]
    store = next((d for d in support.engine_dirs if d), None)  # the data root first
    return [_staging_finding(settings), _scratch_finding(settings, store)]


def _scratch_finding(settings: NodeSettings, store: str | None = None) -> Finding:
    """Whether a launch's scratch can be made here: the tools it runs, and where (not
    on the engine's store's filesystem, whose pressure it would raise)."""
    from tuneplane_node.jobs.mounts.scratch import missing_tools, scratch_on_store

    missing = missing_tools()
    if missing:
        found = f"{', '.join(missing)} not found"
        return WARN, f"scratch: {found}: launches with container.scratch fail (422)"
    most = f"{env_name('job_scratch_max')}={settings.job_scratch_max}"
    where = f"scratch: sparse ext4 files in {settings.scratch_dir}, up to {most} a job"
    if store is not None and inventory.same_filesystem(settings.scratch_dir, Path(store)):
        return WARN, f"{where}; {scratch_on_store(store)}"
    return OK, where


async def _engine_answer(
    settings: NodeSettings, ask: Callable[[ContainerRuntime], Awaitable[T]]
) -> tuple[str, T] | None:
    """The engine's name and its answer to ``ask``; None when there is no engine or it
    did not answer (the engine step says which)."""
    from tuneplane_node.errors import NodeError
    from tuneplane_node.runtime import detect_runtime

    try:
        runtime = await detect_runtime(settings, cache=False)
    except ConfigError:
        return None
    try:
        return runtime.name, await ask(runtime)
    except NodeError:
        return None
    finally:
        await runtime.close()


def _staging_finding(settings: NodeSettings) -> Finding:
    """Whether this process can stage a mount, tried in a temporary directory: check
    creates nothing of the node's (the privilege is the process's, wherever it mounts)."""
    from tuneplane_node.jobs.mounts.staging import MountStaging

    root = MountStaging(settings.state_dir).root
    with tempfile.TemporaryDirectory(prefix=".tuneplane-check-") as scratch:
        try:
            reason = MountStaging(Path(scratch)).probe()
        except OSError as exc:
            reason = f"cannot make a staging directory: {exc.strerror}"
    if reason is not None:
        return (FAIL, f"mounts: {reason}")
    return (OK, f"mounts: opened without links, bound by descriptor under {root}")


def check_state_dir(settings: NodeSettings) -> list[Finding]:
    directory = settings.state_dir
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent  # the daemon creates the rest
    try:
        with tempfile.TemporaryFile(dir=existing):  # the only honest test: write
            pass
    except OSError as exc:
        return [(FAIL, f"state dir: {directory}: cannot write in {existing}: {exc.strerror}")]
    created = "" if existing == directory else " (created at start)"
    return [(OK, f"state dir: {directory} writable{created}")]
