"""A launch's host paths: its mounts, scratch and volumes, from the vetting to the release.

The launcher's mount room: it asks the engine once how it takes mounts (`MountSupport`),
refuses what the engine cannot be handed, and, when the container is made, opens each
path without following links (`MountPolicy`), makes the scratch (`ScratchSpaces`), opens
the volumes (`VolumeKeeper`) and binds them all at the staging path (`MountStaging`)
whose key the container's label carries; the container gone, it lets them go: when the
node removes it, and when the engine's events say it went behind the node's back (a
``docker rm`` by hand): the staging and scratch (its loop device) no container's label
names, nor a launch still making its container, are released then, not at the next start.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from tuneplane_node import inventory
from tuneplane_node.errors import ConfigError, InvalidField, NodeError
from tuneplane_node.jobs.mounts.policy import MountPolicy
from tuneplane_node.jobs.mounts.scratch import FIELD as SCRATCH
from tuneplane_node.jobs.mounts.scratch import ScratchError, ScratchSpaces, scratch_on_store
from tuneplane_node.jobs.mounts.staging import MountStaging
from tuneplane_node.jobs.volumes.keeper import VolumeKeeper
from tuneplane_node.jobs.volumes.sources import FIELD as VOLUMES
from tuneplane_node.jobs.words.launch import LaunchRequest
from tuneplane_node.runtime.base import ContainerRuntime
from tuneplane_node.runtime.facts import REMOTE, STAGED, MountSupport
from tuneplane_node.runtime.labels import mounts_of, with_staged
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.tasks import BackgroundTasks
from tuneplane_node.wire.values import Mount

log = logging.getLogger(__name__)


def refuse_unstaged(support: MountSupport, runtime: str, field: str) -> None:
    """A 422 for a scratch (or volumes: ``field``) a runtime cannot be handed: the
    process runtime mounts nothing, an engine on another machine takes no path of this
    one."""
    if support.mode != STAGED:
        where = "is on another machine" if support.mode == REMOTE else "mounts nothing"
        what = "scratch space" if field == SCRATCH else "volumes"
        raise InvalidField(field, f"the {runtime} runtime {where}: it takes no {what}")


class LaunchMounts:
    """The mounts, scratch and volumes of the node's launches, on one engine."""

    def __init__(
        self,
        runtime: ContainerRuntime,
        *,
        policy: MountPolicy,
        staging: MountStaging,
        scratch: ScratchSpaces,
        volumes: VolumeKeeper,
    ) -> None:
        self.runtime = runtime
        self.policy = policy
        self.staging = staging
        self.scratch = scratch
        self.volumes = volumes
        self._support: MountSupport | None = None  # the engine's answer, once it gave one
        self._making: set[str] = set()  # keys staged for a container not seen yet
        self._releasing = asyncio.Lock()  # one release or sweep at a time: the same key
        self._dirty = False  # a change came while a sweep ran: one more after it
        self._sweeper: asyncio.Task[None] | None = None
        self._tasks = BackgroundTasks(log)

    async def support(self) -> MountSupport:
        """The engine's word on mounts, asked until it answers; its own directories are
        never mounted from then on."""
        if self._support is None:
            support = await self.runtime.mount_support()
            what = f"the {self.runtime.name} engine's own directory"
            self.policy.forbid((Path(path), what) for path in support.engine_dirs)
            self._support = support
        return self._support

    async def vet(self, plan: LaunchRequest) -> LaunchRequest:
        """The vet step: refuse now what the container could not be made with (a mount
        outside the mount roots or of an engine on another machine, a scratch or
        volumes a runtime cannot be handed); the plan as it was. Opened for good when
        the container is made (`place`)."""
        await self._vet(plan.spec)
        return plan

    async def _vet(self, spec: ContainerSpec) -> None:
        if spec.mounts:
            await self._usable(spec.mounts)
            await asyncio.to_thread(self.policy.vet, spec.mounts)
        if spec.scratch is not None:  # made when the container is
            self.scratch.vet(spec)
            await self._staging_usable(SCRATCH)
        if spec.volumes:  # filled before the container is made, bound when it is
            self.volumes.vet(spec.volumes)
            await self._staging_usable(VOLUMES)

    async def _usable(self, mounts: tuple[Mount, ...]) -> MountSupport:
        """The engine's support, or a 422 for each mount of an engine on another machine."""
        support = await self.support()
        if support.mode == REMOTE:
            reason = (
                f"the {self.runtime.name} engine is on another machine: the node cannot "
                "hand it a host path it opened, so it takes no host mounts"
            )
            refusals = [InvalidField(f"container.mounts[{i}]", reason) for i in range(len(mounts))]
            raise InvalidField.of(refusals)
        return support

    async def _staging_usable(self, field: str) -> None:
        refuse_unstaged(await self.support(), self.runtime.name, field)

    async def place(self, plan: LaunchRequest) -> LaunchRequest:
        """The last place step: the spec with each mount opened and bound at its staging
        path (`MountStaging`), its scratch made and bound there too (`ScratchSpaces`),
        the key of its staging on its label; a runtime that mounts nothing (the process
        runtime) gets the paths as given, opened and refused alike. Last, so nothing can
        fail between the staging and the create, whose failure `release`s them."""
        return replace(plan, spec=await self._staged(plan.spec))

    async def _staged(self, spec: ContainerSpec) -> ContainerSpec:
        if not spec.mounts and spec.scratch is None and not spec.volumes:
            return spec
        if spec.scratch is not None or spec.volumes:  # a staging engine's: host mounts
            await self._staging_usable(SCRATCH if spec.scratch else VOLUMES)
        elif (await self._usable(spec.mounts)).mode != STAGED:
            return replace(spec, mounts=await asyncio.to_thread(self.policy.vet, spec.mounts))
        key = self.staging.new_key(spec.name)
        self._making.add(key)  # before the first bind: no sweep takes it meanwhile
        mounts = await asyncio.to_thread(self._open_and_stage, key, spec)
        # the volumes it binds: eviction's truth
        labels = with_staged(spec.labels, mounts=key, volumes=(v.sha256 for v in spec.volumes))
        return replace(spec, mounts=mounts, labels=labels)

    def _open_and_stage(self, key: str, spec: ContainerSpec) -> tuple[Mount, ...]:
        opened, scratch = self.policy.open(spec.mounts), spec.scratch
        try:
            opened += self.volumes.open(spec.volumes)
            if scratch is not None:
                opened.append(self.scratch.make(key, scratch))
            return self.staging.stage(key, opened)
        except BaseException:
            self.scratch.release_quietly(key)  # after the staging's release: its binds first
            raise
        finally:
            for each in opened:
                each.close()

    async def release(self, labels: Mapping[str, str]) -> None:
        """Unmount a container's staged mounts (its label names them): it is gone."""
        key = mounts_of(labels)
        if not key:
            return
        self._making.discard(key)
        async with self._releasing:
            try:
                await asyncio.to_thread(self.staging.release, key)
                await asyncio.to_thread(self.scratch.release, key)
            except (OSError, ScratchError) as exc:
                log.error("could not remove the staged mounts %s: %s (swept later)", key, exc)

    def watch(self) -> None:
        """From now on, every change the engine's events tell sweeps what a container
        removed behind the node left (a runtime without events: the start's sweep only)."""
        self.runtime.on_change(self._changed)

    def _changed(self, name: str | None) -> None:
        if self._sweeper is not None and not self._sweeper.done():
            self._dirty = True
            return
        self._sweeper = self._tasks.spawn(self._sweep_gone(), name="mounts sweep")

    async def _sweep_gone(self) -> None:
        """Release the staging and scratch of keys no container carries and no launch is
        making: their container is gone. Again while changes came meanwhile."""
        self._dirty = True
        while self._dirty:
            self._dirty = False
            # Listed first: a key made after the list is no candidate (it is added to
            # `_making` before its directory exists, so one listed is kept if making).
            listed = await asyncio.to_thread(self._keys)
            try:
                live = {mounts_of(s.labels) for s in await self.runtime.ps()}
            except NodeError:
                return  # the engine not answering: nothing is known gone
            self._making -= live  # made: its label is the truth now
            for key in sorted(listed - live - self._making):
                log.warning("releasing the mounts of %s: its container is gone", key)
                async with self._releasing:
                    try:
                        await asyncio.to_thread(self.staging.release, key)
                        await asyncio.to_thread(self.scratch.release, key)
                    except (OSError, ScratchError) as exc:
                        log.error("could not remove the mounts of %s: %s", key, exc)

    def _keys(self) -> set[str]:
        return set(self.staging.keys()) | self.scratch.keys()

    async def close(self) -> None:
        await self._tasks.close()

    async def start(self) -> None:
        """At start, before the first launch: the engine's own directories learnt (a mount
        root holding one is a `ConfigError`), the staging a killed daemon left swept (the
        keys no container's label names), and a node that cannot mount said so."""
        try:
            support = await self.support()
            keep = {mounts_of(state.labels) for state in await self.runtime.ps()}
        except NodeError as exc:
            log.warning("staged mounts not swept (the engine did not answer): %s", exc.message)
            return
        self._refuse_roots(support)
        store = next((d for d in support.engine_dirs if d), None)  # the data root first
        scratch = self.scratch.files
        if store is not None and await asyncio.to_thread(_on, scratch, Path(store)):
            log.warning("scratch root %s: %s", scratch, scratch_on_store(store))
        await asyncio.to_thread(self.staging.sweep, keep)
        try:
            await asyncio.to_thread(self.scratch.sweep, keep)
        except (OSError, ScratchError) as exc:
            log.error("could not remove a scratch space no container has: %s", exc)
        if support.mode == STAGED and self.policy.roots:
            reason = await asyncio.to_thread(self.staging.probe)
            if reason is not None:
                log.error("launches with host mounts will be refused: %s", reason)

    def _refuse_roots(self, support: MountSupport) -> None:
        problem = self.policy.root_holding(support.engine_dirs, engine=self.runtime.name)
        if problem is not None:
            raise ConfigError(problem)


def _on(path: Path, filesystem_of: Path) -> bool:
    return inventory.same_filesystem(path, filesystem_of) is True
