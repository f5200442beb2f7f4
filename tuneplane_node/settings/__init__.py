"""NodeSettings: what this machine itself must answer, read from ``TUNEPLANE_*`` and `.env`.

Everything about jobs comes from the console; settings hold only facts about the node.
Every field is documented in docs/operating.md (a test keeps the two in step).

The variables stay flat (``TUNEPLANE_*``); in the code, settings are grouped by concern:
the jobs' and the volume store's are declared apart (`JobSettings`, jobs.py;
`VolumeStoreSettings`, volumes.py: `NodeSettings` extends both), and
each wing of the node reads a frozen view of its own concern, made from `NodeSettings`
(`ImageSettings`, `VolumeSettings`, ...: views.py). The package's modules: `NodeSettings`,
its rules across settings and `load_settings` (node.py); a fabric (fabric.py); one value
read and checked (values.py); a bad setting said (problems.py). Every name is imported
from here.
"""

from __future__ import annotations

from tuneplane_node.settings.fabric import INTERFACE_PATTERN, Fabric
from tuneplane_node.settings.jobs import MIN_SCRATCH, MIN_TMPFS, JobSettings
from tuneplane_node.settings.node import (
    DEFAULT_STORAGE,
    NEVER_MOUNTED,
    NEVER_UNDER,
    NodeSettings,
    load_settings,
)
from tuneplane_node.settings.notices import NoticeSettings
from tuneplane_node.settings.problems import (
    SECRET_FIELDS,
    describe_settings_error,
    describe_validation,
)
from tuneplane_node.settings.values import (
    DAY,
    DOCKER_DEFAULT,
    DOCKER_SCHEMES,
    ENV_PREFIX,
    GIB,
    PODMAN_SCHEMES,
    TOKEN_PATTERN,
    env_name,
    local_engine,
    unix_socket,
)
from tuneplane_node.settings.views import (
    ImageSettings,
    LifecycleSettings,
    ObserveSettings,
    VolumeSettings,
)
from tuneplane_node.settings.volumes import VolumeStoreSettings

__all__ = [
    "DAY",
    "DEFAULT_STORAGE",
    "DOCKER_DEFAULT",
    "DOCKER_SCHEMES",
    "ENV_PREFIX",
    "GIB",
    "INTERFACE_PATTERN",
    "MIN_SCRATCH",
    "MIN_TMPFS",
    "NEVER_MOUNTED",
    "NEVER_UNDER",
    "PODMAN_SCHEMES",
    "SECRET_FIELDS",
    "TOKEN_PATTERN",
    "Fabric",
    "ImageSettings",
    "JobSettings",
    "LifecycleSettings",
    "NodeSettings",
    "NoticeSettings",
    "ObserveSettings",
    "VolumeSettings",
    "VolumeStoreSettings",
    "describe_settings_error",
    "describe_validation",
    "env_name",
    "load_settings",
    "local_engine",
    "unix_socket",
]
