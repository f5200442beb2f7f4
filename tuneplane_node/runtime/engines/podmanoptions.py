"""How a podman job's create says what podman-py's create() does not spell, or spells
otherwise than docker's: the CPU limit as a CFS quota, limits as libpod's unsigned
ulimits, a tmpfs as a mount, a user namespace of the job's own, capabilities dropped by
name, the fabric network's endpoint; and a job's create options as podman-py takes them
(`engine_options`). Plain data for `runtime.engines.podman`; nothing here imports an SDK.
"""

from __future__ import annotations

import resource
from collections.abc import Sequence
from typing import Any

from tuneplane_node.runtime.engines.networks.jobnetwork import (
    NODE_NETWORKS,
    fabric_network,
    own_network,
)
from tuneplane_node.runtime.facts import CDI_GPU_KIND, JOB_INTERFACE
from tuneplane_node.runtime.labels import LABEL_FABRIC_ADDRESS
from tuneplane_node.runtime.spec import (
    FABRIC,
    RDMA_CAPABILITY,
    UNLIMITED,
    Confinement,
    ContainerSpec,
    Tmpfs,
)
from tuneplane_node.settings import Fabric
from tuneplane_node.signals import JOB_SIGNALS

CPU_PERIOD_US = 100_000


def rdma_ulimits(memlock: int | None, pids_limit: int) -> list[dict[str, Any]]:
    """memlock for an RDMA job (libpod reads limits as unsigned: RLIM_INFINITY where
    docker takes -1). Podman 4 drops containers.conf's default_ulimits from a container
    given any limit and sets nofile and nproc to 1048576, which an engine with lower hard
    limits cannot grant: nofile is given at this process's own hard limit (the engine's
    on a machine set up alike), nproc at the job's pids limit, which bounds it anyway."""
    locked = UNLIMITED if memlock is None else memlock
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = UNLIMITED if nofile == resource.RLIM_INFINITY else nofile
    return [
        {"Name": "memlock", "Soft": locked, "Hard": locked},
        {"Name": "nofile", "Soft": nofile, "Hard": nofile},
        {"Name": "nproc", "Soft": pids_limit, "Hard": pids_limit},
    ]


def tmpfs_mount(tmpfs: Tmpfs) -> dict[str, Any]:
    """A tmpfs mount: libpod's options for one are rw, nosuid, nodev and exec (unlike
    its ``--tmpfs``), what `Tmpfs.options` says for docker."""
    return {
        "type": "tmpfs",
        "source": "tmpfs",  # without it podman-py's mount is a directory, not a tmpfs
        "target": tmpfs.path,
        "size": str(tmpfs.size_bytes),
        "mode": "1777",
    }


USERNS_SIZE = 65536
"""The ids of a job's own user namespace (podman's ``auto`` default is 1024: too few for
an image whose files belong to ``nobody``, 65534)."""
OWN_USERNS = {
    "userns": {"nsmode": "auto", "value": f"size={USERNS_SIZE}"},
    # podman 4.3's service reads the range from idmappings alone (the CLI sets both).
    "idmappings": {"AutoUserNs": True, "AutoUserNsOpts": {"Size": USERNS_SIZE}},
}
"""libpod's create fields for a user namespace of the job's own, from the ``containers``
ranges of /etc/subuid and /etc/subgid (podman-py has no field for idmappings)."""


def own_userns(body: dict[str, Any], spec: ContainerSpec) -> dict[str, Any]:
    """A create body given a user namespace of the job's own (`OWN_USERNS`), its writable
    binds id-mapped unless the node hands them to its range (`handover`): podman-py
    renders no mount option of libpod's (it drops ``options``), so the body says them."""
    body.update(OWN_USERNS)
    for mount in body.get("mounts") or [] if not spec.chown_mounts else ():
        if mount.get("type") == "bind" and "ro" not in mount.get("options", []):
            mount["options"] = [*mount.get("options", []), "idmap"]
    return body


HOST_SYS = {"type": "bind", "source": "/sys", "target": "/sys", "read_only": True}


def fabric_endpoint(spec: ContainerSpec, fabric: Fabric) -> dict[str, Any]:
    """The container on the fabric network only, at its label's address, as eth0."""
    address = spec.labels[LABEL_FABRIC_ADDRESS]
    return {fabric_network(fabric): {"static_ips": [address], "interface_name": JOB_INTERFACE}}


def confined(confinement: Confinement) -> dict[str, Any]:
    options: dict[str, Any] = {
        # Every other one dropped by name: podman hands what cap_add names to a
        # non-root user as ambient capabilities, which docker never does.
        "cap_drop": list(confinement.dropped),
        "log_config": {"Type": "k8s-file", "Config": {"size": confinement.log_budget}},
        "no_new_privileges": confinement.no_new_privileges,
    }
    if confinement.init:  # catatonit as PID 1: it passes signals on, reaps zombies
        options["init"] = True
    return options


def engine_options(
    spec: ContainerSpec, bounds: dict[str, Any], cards: Sequence[int], *, fabric: Fabric | None
) -> dict[str, Any]:
    """A job's create options as podman-py takes them (`confined`'s ``bounds`` among
    them), its ``cards`` as CDI devices; ``fabric``: the settings' fabric, for a job on it."""
    options: dict[str, Any] = {}
    if spec.stop_signal:  # else the image's STOPSIGNAL, else SIGTERM: libpod's own rule
        options["stop_signal"] = JOB_SIGNALS[spec.stop_signal]  # libpod wants the number
    options.update(bounds)
    options["mounts"] = [
        {"type": "bind", "source": m.host, "target": m.container, "read_only": m.read_only}
        for m in spec.mounts
    ]
    if spec.own_userns and spec.network == "host":
        # A user namespace of its own may not mount the sysfs of the host's network
        # namespace (runc: "mount sysfs:/sys: operation not permitted"): the host's,
        # read-only, as a root job of the host network sees it anyway.
        options["mounts"].append(HOST_SYS)
    if spec.network in NODE_NETWORKS:  # its own, made before it (`_create`)
        options["network_mode"] = "bridge"
        options["networks"] = {own_network(spec.name): {}}
    if spec.network == FABRIC and fabric is not None:  # the node's, made before it (`_create`)
        options["network_mode"] = "bridge"
        options["networks"] = fabric_endpoint(spec, fabric)
    if spec.read_only_root:
        # podman-py refuses tmpfs=: tmpfs mounts say the same; none of podman's own
        # on /var/tmp (read_write_tmpfs).
        options["read_only"] = True
        options["read_write_tmpfs"] = False
        options["mounts"] += [tmpfs_mount(each) for each in spec.tmpfs]
    if spec.cpu_limit:
        # podman-py ignores nano_cpus; a CFS quota says the same thing.
        options["cpu_period"] = CPU_PERIOD_US
        options["cpu_quota"] = int(spec.cpu_limit * CPU_PERIOD_US)
    cpus, mems = spec.cpuset()  # at create only: never updated on a running job
    if cpus:
        options["cpuset_cpus"] = cpus
    if mems:
        options["cpuset_mems"] = mems
    devices = [f"{CDI_GPU_KIND}={gpu}" for gpu in cards]
    if devices or spec.rdma_devices:
        options["devices"] = devices + spec.rdma_mappings()
    if spec.rdma_devices:
        options["ulimits"] = rdma_ulimits(spec.rdma_memlock, spec.confinement.pids_limit)
        options["cap_drop"] = [c for c in options["cap_drop"] if c != RDMA_CAPABILITY]
        options["cap_add"] = [RDMA_CAPABILITY]
    return options
