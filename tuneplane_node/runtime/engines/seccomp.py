"""A podman job may not create user namespaces: docker's default seccomp stance, on podman.

podman's default profile allows ``unshare``, ``clone`` and ``clone3`` whatever their
flags, so a job can make a user namespace and be root with every capability inside it
(the kernel's user-namespace code is a frequent privilege escalation path, and the
per-user limits it charges are shared with the host's root). Docker's default profile
refuses that without CAP_SYS_ADMIN. The node derives its own profile from podman's
default: ``clone`` and ``unshare`` allowed only without ``CLONE_NEWUSER``, ``clone3``
(whose flags seccomp cannot read) answered ENOSYS, so C libraries fall back to ``clone``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuneplane_node.durable import write_atomically

log = logging.getLogger(__name__)
CLONE_NEWUSER = 0x10000000
ENOSYS = 38
# containers-common's default profile: the operator's copy first, as podman reads them.
DEFAULT_PROFILES = (
    Path("/etc/containers/seccomp.json"),
    Path("/usr/share/containers/seccomp.json"),
)
GUARDED = ("clone", "clone3", "unshare")
# clone's flags are its first argument, but its second on s390.
S390 = ["s390", "s390x"]
PROFILE_NAME = "seccomp-podman.json"


def without_user_namespaces(profile: dict[str, Any]) -> dict[str, Any]:
    """``profile`` with user namespaces refused; every other rule as it was."""
    rules = [_unguarded(rule) for rule in profile.get("syscalls") or []]
    rules = [rule for rule in rules if rule["names"]]
    return {**profile, "syscalls": [*rules, *_guard_rules()]}


def _unguarded(rule: dict[str, Any]) -> dict[str, Any]:
    return {**rule, "names": [name for name in rule.get("names") or [] if name not in GUARDED]}


def _no_newuser(index: int) -> list[dict[str, Any]]:
    # MASKED_EQ: (argument & value) == valueTwo.
    return [{"index": index, "value": CLONE_NEWUSER, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]


def _guard_rules() -> list[dict[str, Any]]:
    allow = "SCMP_ACT_ALLOW"
    return [
        {"names": ["unshare"], "action": allow, "args": _no_newuser(0)},
        {"names": ["clone"], "action": allow, "args": _no_newuser(0), "excludes": {"arches": S390}},
        {"names": ["clone"], "action": allow, "args": _no_newuser(1), "includes": {"arches": S390}},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
    ]


def write_profile(state_dir: Path, *, defaults: Sequence[Path] = DEFAULT_PROFILES) -> Path | None:
    """The derived profile, written under the node's state dir; None (said once) when no
    default profile is readable: podman's built-in one then applies, user namespaces
    included."""
    derived = derive_profile(defaults)
    if derived is None:
        return None
    try:
        return _write(state_dir / PROFILE_NAME, json.dumps(derived[1], indent=1))
    except OSError as exc:
        log.error("cannot write the seccomp profile (%s): jobs may create user namespaces", exc)
        return None


def derive_profile(
    defaults: Sequence[Path] = DEFAULT_PROFILES,
) -> tuple[Path, dict[str, Any]] | None:
    """The default profile read and the node's derived from it, written nowhere (what
    ``check`` needs: it creates nothing); None, said, when none is readable."""
    source = next((path for path in defaults if path.is_file()), None)
    if source is None:
        log.error("no podman seccomp profile in %s: jobs may create user namespaces",
                  " or ".join(map(str, defaults)))  # fmt: skip
        return None
    try:
        return source, without_user_namespaces(json.loads(source.read_text()))
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        log.error("cannot derive a seccomp profile from %s (%s): jobs may create user "
                  "namespaces", source, exc)  # fmt: skip
        return None


def _write(path: Path, text: str) -> Path:
    write_atomically(path, text.encode(), mode=0o644)  # the engine reads it
    return path
