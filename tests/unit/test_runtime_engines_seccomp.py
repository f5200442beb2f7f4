"""The podman jobs' seccomp profile: podman's own, with user namespaces refused."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tuneplane_node.runtime.engines import seccomp
from tuneplane_node.runtime.engines.seccomp import CLONE_NEWUSER, without_user_namespaces

PODMAN_DEFAULT = Path("/usr/share/containers/seccomp.json")
SMALL: dict[str, Any] = {
    "defaultAction": "SCMP_ACT_ERRNO",
    "syscalls": [
        {"names": ["read", "clone", "unshare", "clone3", "write"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_SYS_ADMIN"]}},
        {"names": ["reboot"], "action": "SCMP_ACT_ERRNO"},
    ],
}


def rules_for(profile: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [rule for rule in profile["syscalls"] if name in rule["names"]]


def test_clone_and_unshare_are_allowed_only_without_a_new_user_namespace() -> None:
    derived = without_user_namespaces(SMALL)

    assert derived["defaultAction"] == "SCMP_ACT_ERRNO"
    assert rules_for(derived, "read")[0]["names"] == ["read", "write"]
    assert rules_for(derived, "reboot") == [SMALL["syscalls"][2]]
    for name in ("clone", "unshare"):
        rules = rules_for(derived, name)
        assert rules and all(rule.get("args") for rule in rules), name  # never unconditional
        for rule in rules:
            (arg,) = rule["args"]
            assert (arg["op"], arg["value"], arg["valueTwo"]) == (
                "SCMP_CMP_MASKED_EQ", CLONE_NEWUSER, 0,
            )  # fmt: skip
    (clone3,) = rules_for(derived, "clone3")
    assert (clone3["action"], clone3["errnoRet"]) == ("SCMP_ACT_ERRNO", 38)  # libc falls back


@pytest.mark.skipif(not PODMAN_DEFAULT.is_file(), reason="containers-common is not installed")
def test_podmans_own_profile_is_derived_and_written_for_the_engine(tmp_path: Path) -> None:
    path = seccomp.write_profile(tmp_path, defaults=(tmp_path / "none.json", PODMAN_DEFAULT))

    assert path == tmp_path / "seccomp-podman.json" and path.stat().st_mode & 0o044 == 0o044
    derived = json.loads(path.read_text())
    original = json.loads(PODMAN_DEFAULT.read_text())
    assert len(rules_for(derived, "clone")) == 2  # the two arches' argument positions
    assert rules_for(original, "unshare")[0].get("args") in (None, [])  # what was there
    assert all(rule.get("args") for rule in rules_for(derived, "unshare"))


def test_without_a_default_profile_the_node_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR):
        assert seccomp.write_profile(tmp_path, defaults=(tmp_path / "none.json",)) is None
    assert "jobs may create user namespaces" in caplog.text
    (tmp_path / "bad.json").write_text("{")
    assert seccomp.write_profile(tmp_path, defaults=(tmp_path / "bad.json",)) is None
