"""The check's egress step: what a job of the node's job network reaches on the engine as
it is, proven by a throwaway job (the cloud's metadata service and the operator's denied
networks must not answer it), and whether host-network jobs are held to the same.

The job is the image `TUNEPLANE_CHECK_IMAGE` names, where the engine has it (the check
pulls nothing): ``sh`` and ``nc`` (busybox's). Each place is tried once, 3 s at most:
``open`` (it connected) or a host's reset (``Connection refused``) is an answer, and
FAILs the check; the rule's own refusal reads ``No route to host``.
"""

from __future__ import annotations

import asyncio
import uuid
from ipaddress import IPv4Network
from typing import TYPE_CHECKING

from tuneplane_node.checks.findings import FAIL, OK, WARN, Finding
from tuneplane_node.errors import ConfigError, NodeError
from tuneplane_node.settings import NodeSettings, env_name

if TYPE_CHECKING:
    from tuneplane_node.runtime.base import ContainerRuntime

METADATA = "169.254.169.254"
PORT = 80
TRIES_S = 3
MOST_DENIED = 3
"""Denied networks tried, at most: a refused place costs nothing, a silent one 3 s."""
RULE, IMAGE = env_name("job_egress_rule"), env_name("check_image")


def check_egress(settings: NodeSettings) -> list[Finding]:
    return asyncio.run(_egress_findings(settings))


async def _egress_findings(settings: NodeSettings) -> list[Finding]:
    from tuneplane_node.runtime import detect_runtime
    from tuneplane_node.runtime.engines.engine import EngineRuntime

    try:
        runtime = await detect_runtime(settings, cache=False)
    except ConfigError:
        return []  # the engine step has said so
    try:
        if not isinstance(runtime, EngineRuntime):
            return []  # the jobs step has said: the process runtime holds no bound
        found = [await probe(runtime, settings)]
        return [*found, *host_network_finding(settings, local=runtime._local())]
    finally:
        await runtime.close()


def places(settings: NodeSettings) -> dict[str, str]:
    """What the job tries, by what it stands for: the metadata address, and the first
    address of each of the first IPv4 networks of `TUNEPLANE_JOB_EGRESS_DENY`."""
    tried = {"the cloud's metadata service": f"{METADATA} {PORT}"}
    denied = [net for net in settings.job_egress_deny if isinstance(net, IPv4Network)]
    for net in denied[:MOST_DENIED]:
        address = net.network_address + (1 if net.num_addresses > 2 else 0)
        tried[f"{env_name('job_egress_deny')} {net}"] = f"{address} {PORT}"
    return tried


def script(tried: dict[str, str]) -> str:
    """One line per place, ``<n>=open`` or nc's word on why it could not connect."""
    return "; ".join(
        f"echo {n}=$(nc -w {TRIES_S} {where} </dev/null 2>&1 >/dev/null && echo open)"
        for n, where in enumerate(tried.values())
    )


async def probe(runtime: ContainerRuntime, settings: NodeSettings) -> Finding:
    """The throwaway job's tries, judged; a job that cannot run is a warning."""
    image, kind = settings.check_image, settings.job_network
    try:
        if not await runtime.image_exists(image):
            return (WARN, (
                f"egress: not proven: {image} is not on the {runtime.name} engine (pull it, or "
                f"set {IMAGE} to an image with sh and nc there)"
            ))  # fmt: skip
        tried = places(settings)
        said = await _run(runtime, image, kind, script(tried))
    except NodeError as exc:
        return WARN, f"egress: not proven: a job on the {kind} network did not run: {exc.message}"
    return verdict(tried, said, kind=kind, rule=settings.job_egress_rule)


async def _run(runtime: ContainerRuntime, image: str, network: str, command: str) -> str:
    """The job run to its end and removed; its output."""
    from tuneplane_node.runtime.base import LogQuery
    from tuneplane_node.runtime.labels import LABEL_RUN_ID
    from tuneplane_node.runtime.spec import ContainerSpec
    from tuneplane_node.wire.values import container_name

    run_id = f"check-egress-{uuid.uuid4().hex[:8]}"
    spec = ContainerSpec(
        name=container_name(run_id), image=image, command=("/bin/sh", "-c", command),
        labels={LABEL_RUN_ID: run_id}, network=network,
    )  # fmt: skip
    try:
        await runtime.run(spec)
        await runtime.wait_exited(spec.name, timeout=TRIES_S * (MOST_DENIED + 1) + 30)
        logs = await runtime.logs(spec.name, LogQuery(tail=20, max_bytes=64 * 1024))
    finally:
        await runtime.remove(spec.name)
    return logs.text if logs is not None else ""


def verdict(tried: dict[str, str], said: str, *, kind: str, rule: bool) -> Finding:
    """FAIL where a place answered; else what held it."""
    lines = (line.split(" ", 1)[-1].partition("=") for line in said.splitlines())
    words = {n: why.strip() for n, _, why in lines}
    answered, held = [], []
    for n, (what, where) in enumerate(tried.items()):
        why = words.get(str(n), "no word from the job")
        place = f"{what} ({where.replace(' ', ':')})"
        if why == "open" or "Connection refused" in why:
            answered.append(f"{place}: {why}")
        else:
            held.append(f"{place}: {'refused' if 'No route to host' in why else 'no answer'}")
    if answered:
        fix = (
            f"set {RULE}=true"
            if not rule
            else "the node's rule does not hold here (its log says why)"
        )
        return FAIL, f"egress: a job on the {kind} network reaches {'; '.join(answered)}: {fix}"
    level = OK if rule else WARN
    off = "" if rule else f"; no rule holds it ({RULE}=false): on a cloud it would answer"
    return level, f"egress: a job on the {kind} network reaches none of {'; '.join(held)}{off}"


def host_network_finding(settings: NodeSettings, *, local: bool) -> list[Finding]:
    """Whether host-network jobs are held to the same addresses (a cgroup match, where
    the machine has a cgroup v2 tree)."""
    from tuneplane_node.runtime.engines.networks.egress import cgroup2_root

    if settings.job_host_network in ("bridge", "refuse") or not settings.job_egress_rule:
        return []  # no job gets the host network, or no rule holds any job
    if not local:
        return [(WARN, "egress: host-network jobs: the engine's machine is another: not told")]
    root = cgroup2_root()
    if root is None:
        return [(WARN, (
            f"egress: a host-network job ({env_name('job_host_network')}="
            f"{settings.job_host_network}) reaches the cloud's metadata service and "
            f"{env_name('job_egress_deny')}: this machine has no cgroup v2 tree (cgroup v1 "
            "alone), and no rule can match a job's sockets without one"
        ))]  # fmt: skip
    return [(OK, (
        "egress: host-network jobs: the same addresses refused by a cgroup match on the "
        f"jobs' parent, in the cgroup v2 tree ({root})"
    ))]  # fmt: skip
