"""How far a job is kept from the host, by the operator's rules: a user namespace of its
own (`TUNEPLANE_JOB_USERNS`) and a sandboxed OCI runtime (`TUNEPLANE_JOB_SANDBOX`).

A launch may ask for more (``container.isolation: "sandbox"``), never less: no field of
it turns a boundary off. What the engine cannot give is said, never given silently less:
a sandbox it lacks is a 409 (`SandboxUnavailable`); a writable mount its runtime cannot
id-map is the operator's to rule (`TUNEPLANE_JOB_USERNS_WRITABLE`): by default the job
keeps its own namespace and the mount is handed to its range (``chown``), or it is a 409
(``refuse``, or ``always``'s), or the job keeps the host's namespace (``host``, the label
and observe say why).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from tuneplane_node.errors import SandboxUnavailable, UsernsUnavailable
from tuneplane_node.jobs.words.launch import LaunchRequest
from tuneplane_node.logformat import job_fields
from tuneplane_node.runtime.base import ContainerRuntime
from tuneplane_node.runtime.facts import IsolationSupport, maps_users
from tuneplane_node.runtime.labels import run_id_of
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings, env_name
from tuneplane_node.wire.values import SANDBOX

log = logging.getLogger(__name__)
USERNS = env_name("job_userns")
USERNS_CARDS = env_name("job_userns_cards")
WRITABLE = env_name("job_userns_writable")
CHOWNED = "its writable mounts are handed to its range before it starts (the runtime cannot id-map)"
"""The note of a job whose writable mounts the node hands to its own namespace's root
(`runtime.engines.handover`)."""
JOB_SANDBOX = env_name("job_sandbox")
NVPROXY = "--nvproxy"
RUNSC_NETWORK = "--network=host"
"""gVisor's host networking, inside whatever namespace the engine gave the container: its
own network stack refuses the engine's namespaces (even docker's ``none``)."""


def registration(runtime: str) -> str:
    """How an operator registers the sandbox runtime, in words for an error or `check`."""
    return (
        f'register it: docker\'s daemon.json "runtimes": {{"{runtime}": {{"path": '
        f'"/usr/bin/{runtime}", "runtimeArgs": ["{RUNSC_NETWORK}"]}}}} and a reload; '
        f"podman's containers.conf [engine] runtime, for every container"
    )


def writable_mounts(spec: ContainerSpec) -> list[str]:
    """The fields of the job's writable host mounts: its read-write mounts and its
    scratch (a loop mount bound in like them). Read-only mounts need no mapping."""
    fields = [f"container.mounts[{i}]" for i, m in enumerate(spec.mounts) if not m.read_only]
    return fields + (["container.scratch"] if spec.scratch is not None else [])


class IsolationRules:
    """The operator's isolation rules, applied to each launch against the engine's word."""

    def __init__(self, settings: NodeSettings) -> None:
        self.userns = settings.job_userns
        self.writable = settings.job_userns_writable
        self.userns_cards = settings.job_userns_cards
        self.sandbox = settings.job_sandbox
        self.runtime = settings.sandbox_runtime

    def apply(
        self, spec: ContainerSpec, *, cards: int, support: IsolationSupport, engine: str
    ) -> ContainerSpec:
        """The spec with its runtime and user namespace decided; a `Conflict` for what
        the engine cannot give."""
        spec = self._sandboxed(spec, cards, support, engine)
        own, note = self.own_userns(spec, cards, support, engine)
        if note:
            log.info(
                "launch %s: %s user namespace: %s", spec.name,
                "its own" if own else "keeps the host's", note,
                extra=job_fields(spec.name, run_id_of(spec.labels), image=spec.image),
            )  # fmt: skip
        return replace(spec, own_userns=own, userns_note=note, chown_mounts=note == CHOWNED)

    def wants_sandbox(self, spec: ContainerSpec, cards: int) -> bool:
        if spec.isolation == SANDBOX or self.sandbox == "all":
            return True
        return self.sandbox == "cpu" and cards == 0

    def _sandboxed(
        self, spec: ContainerSpec, cards: int, support: IsolationSupport, engine: str
    ) -> ContainerSpec:
        runtime = self.runtime
        if self.wants_sandbox(spec, cards):
            if support.error is not None or runtime not in support.runtimes:
                has = ", ".join(sorted(support.runtimes)) or "none known"
                lacks = f"the {engine} engine has no runtime {runtime} (it has {has})"
                why = support.error or lacks
                raise SandboxUnavailable(runtime=runtime, why=why, fix=registration(runtime))
            spec = replace(spec, runtime=runtime)
        # A podman engine whose own runtime is the sandbox runs every job under it (its
        # API takes no runtime per container): a card job there needs the proxy as well.
        under = spec.runtime or support.default_runtime
        if cards and under == runtime and not _proxies_cards(support, runtime):
            raise SandboxUnavailable(
                runtime=runtime,
                why=f"a job with cards needs its GPU proxy, and {runtime} (which the "
                f"{engine} engine would run it under) is registered without {NVPROXY}",
                fix=f"register it with {NVPROXY}=true once gVisor supports this machine's "
                f"cards and driver (contrib/dev/gpu_check.py), or {JOB_SANDBOX}=cpu on an "
                "engine whose own runtime is runc",
            )
        return spec

    def own_userns(
        self, spec: ContainerSpec, cards: int, support: IsolationSupport, engine: str
    ) -> tuple[bool, str]:
        """(own, why not): whether the job gets a user namespace of its own, and why it
        keeps the host's ("" where nothing is to be said: the rule is off, or the runtime
        tells nothing of namespaces, as the process runtime)."""
        if self.userns == "off" or not support.default_runtime:
            return False, ""
        if support.remaps_users:
            return False, f"the {engine} engine maps every job's users (its own namespace)"
        if not support.per_job_userns:
            why = f"the {engine} engine gives no job a user namespace of its own"
            self._refuse_always("container", why, "use podman, or docker's userns-remap")
            return False, why
        under = spec.runtime or support.default_runtime
        if not maps_users(under):
            # runsc under podman's userns=auto fails at its start ("cannot read client
            # sync file", gVisor on this machine): the sandbox's kernel is the boundary.
            why = f"the job runs under {under}, which {engine} gives no user namespace"
            self._refuse_always("container", why, f"{JOB_SANDBOX}=off for jobs that need one")
            return False, why
        if cards and not self.userns_cards:
            return False, f"a job with cards ({USERNS_CARDS}=false)"
        unmapped = [] if support.idmap_mounts else writable_mounts(spec)
        return self._unmapped(unmapped[0], support) if unmapped else (True, "")

    def _unmapped(self, field: str, support: IsolationSupport) -> tuple[bool, str]:
        """A writable mount the runtime cannot id-map (``field``), as the operator rules:
        handed to the job's range (own namespace), refused, or the host's namespace."""
        if self.writable == "chown":
            return True, CHOWNED
        runtime = f"{support.default_runtime} {support.runtime_version}".strip()
        why = f"{field} is writable and the engine's runtime ({runtime}) cannot id-map it"
        fix = "mount it read-only, or give the engine runc 1.2 or later or crun"
        if self.writable == "refuse":
            raise UsernsUnavailable(mount=field, why=why, fix=f"{fix}, or {WRITABLE}=chown")
        self._refuse_always(field, why, fix)
        return False, why

    def _refuse_always(self, mount: str, why: str, fix: str) -> None:
        if self.userns == "always":
            raise UsernsUnavailable(mount=mount, why=why, fix=f"{fix}, or {USERNS}=auto")


UNMAPPED = {
    "chown": f"handed to each job's range before its start ({WRITABLE}=chown: the runtime "
    "cannot id-map; a walk of the mount where its owner is not the job's)",
    "refuse": f"refused, 409 ({WRITABLE}=refuse: the runtime cannot id-map)",
    "host": f"kept in the host's namespace ({WRITABLE}=host: the runtime cannot id-map)",
}
"""What `check` says of writable mounts, by the operator's rule, where the runtime cannot
id-map them."""


def _proxies_cards(support: IsolationSupport, runtime: str) -> bool:
    return any(arg.startswith(NVPROXY) for arg in support.runtimes.get(runtime, ()))


SUBID_FILES = (Path("/etc/subuid"), Path("/etc/subgid"))
SUBID_USER = "containers"
"""The user whose ranges podman's ``userns=auto`` takes each job's ids from."""


class Isolation:
    """The rules on one engine: its word on runtimes and namespaces, asked until it
    answers, and what the rules cannot have on it said once (the daemon's start asks
    first)."""

    def __init__(self, settings: NodeSettings, runtime: ContainerRuntime) -> None:
        self.rules = IsolationRules(settings)
        self.runtime = runtime
        self._support: IsolationSupport | None = None  # the engine's answer, once given

    async def support(self) -> IsolationSupport:
        if self._support is None:
            support = await self.runtime.isolation_support()
            if support.error is not None:
                return support
            self._support = support
            for fine, text in findings(self.rules, support, engine=self.runtime.name):
                log.log(logging.INFO if fine else logging.WARNING, "%s", text)
        return self._support

    async def vet(self, plan: LaunchRequest) -> LaunchRequest:
        """The vet step: the spec as the rules and the engine have it, for the cards it
        asks (`IsolationRules.apply`)."""
        support, cards = await self.support(), plan.requested_gpus
        spec = self.rules.apply(plan.spec, cards=cards, support=support, engine=self.runtime.name)
        return replace(plan, spec=spec)


def subid_ranges(files: tuple[Path, ...] = SUBID_FILES) -> list[str]:
    """The files of ``files`` that lack a range for `SUBID_USER` (unreadable included)."""
    lacking = []
    for path in files:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            lines = []
        if not any(line.startswith(f"{SUBID_USER}:") for line in lines):
            lacking.append(str(path))
    return lacking


def findings(
    rules: IsolationRules, support: IsolationSupport, *, engine: str, local: bool = True
) -> list[tuple[bool | None, str]]:
    """What an operator reads of the engine's isolation, for `check` and the daemon's
    start: (True: fine, None: a warning, False: the rules cannot be kept; text)."""
    if support.error is not None:
        return [(None, f"jobs: cannot ask {engine} its runtimes: {support.error}")]
    listed = ", ".join(
        f"{name}{' ' + ' '.join(args) if args else ''}"
        for name, args in sorted(support.runtimes.items())
    )
    default = support.default_runtime
    found: list[tuple[bool | None, str]] = [
        (True, f"jobs: {engine} runtimes: {listed or 'none listed'} (default {default})")
    ]
    found.append(_userns_finding(rules, support, engine, local))
    if rules.sandbox != "off" or rules.runtime in support.runtimes:
        found.append(_sandbox_finding(rules, support, engine))
    return found


def _userns_finding(
    rules: IsolationRules, support: IsolationSupport, engine: str, local: bool
) -> tuple[bool | None, str]:
    if rules.userns == "off":
        return None, f"jobs: no user namespace of their own ({USERNS}=off)"
    if not support.per_job_userns:
        return None, f"jobs: {engine} gives no job a user namespace of its own"
    if not maps_users(support.default_runtime):
        return None, (
            f"jobs: {engine} runs every job under {support.default_runtime}: none gets a "
            f"user namespace of its own, and card jobs need {NVPROXY}"
        )
    lacking = subid_ranges() if local else []
    if lacking:
        fix = f'add "{SUBID_USER}:2147483647:2147483648" to {" and ".join(lacking)}'
        return (
            False,
            f"jobs: no {SUBID_USER} ranges for userns=auto: every launch would fail; {fix}",
        )
    mapped = "id-mapped" if support.idmap_mounts else UNMAPPED[rules.writable]
    cards = "" if rules.userns_cards else f"; card jobs keep the host's ({USERNS_CARDS}=false)"
    return True, (
        f"jobs: each gets its own user namespace (userns=auto, 65536 ids); writable "
        f"mounts {mapped}{cards}"
    )


def _sandbox_finding(
    rules: IsolationRules, support: IsolationSupport, engine: str
) -> tuple[bool | None, str]:
    runtime, rule = rules.runtime, f"{JOB_SANDBOX}={rules.sandbox}"
    if runtime not in support.runtimes:
        return False, f"jobs: {rule} and {engine} has no {runtime}: {registration(runtime)}"
    args = support.runtimes[runtime]
    if runtime == "runsc" and RUNSC_NETWORK not in args and engine == "docker":
        return None, (
            f"jobs: {runtime} is registered without {RUNSC_NETWORK}: gVisor refuses the "
            "engine's network namespaces, every sandboxed launch would fail; "
            f"{registration(runtime)}"
        )
    return True, f"jobs: sandbox {runtime} ({rule}; card jobs need {NVPROXY})"
