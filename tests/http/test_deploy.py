"""Deployment as an operator meets it: the systemd unit, systemd's notify protocol, the
Kubernetes manifests. The image is tests/engines/test_image.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.daemons import REPO, free_port, python_path, spawn_daemon
from tests.support.engines import under_ci
from tests.support.nodes import storage_root
from tuneplane_node.daemon.notify import notify, socket_address

UNIT = REPO / "contrib" / "systemd" / "tuneplane-node.service"
SOCKET_UNIT = UNIT.with_suffix(".socket")
SLICE_UNIT = UNIT.parent / "tuneplane-jobs.slice"
EXEC_START = "/opt/tuneplane-node/bin/tuneplane-node"
MOST_EXPOSED = 4.0  # systemd-analyze security: 0 safest, 10 "UNSAFE"; the aim


def systemd_tool(name: str, *elsewhere: str) -> str:
    """Its path; skipped with the reason where it is absent, failed under CI, where
    contrib/dev/engines.sh installs it (Debian's `systemd` package)."""
    for found in (shutil.which(name), *elsewhere):
        if found is not None and os.access(found, os.X_OK):
            return found
    message = f"{name} not installed (apt-get install systemd, or engines.sh)"
    if under_ci():
        pytest.fail(message)
    pytest.skip(message)


def systemd_analyze() -> str:
    return systemd_tool("systemd-analyze")


# --- the unit ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    """The service and its socket: no unknown key, no bad value (verify only warns on
    those: any output fails)."""
    stub = tmp_path / "tuneplane-node"  # verify wants ExecStart's program to exist
    stub.write_text("#!/bin/sh\n")
    stub.chmod(0o755)
    unit, socket_unit = tmp_path / UNIT.name, tmp_path / SOCKET_UNIT.name
    unit.write_text(UNIT.read_text().replace(EXEC_START, str(stub)))
    shutil.copy(SOCKET_UNIT, socket_unit)  # beside the service it activates
    slice_unit = tmp_path / SLICE_UNIT.name  # the jobs' parent, which the service wants
    shutil.copy(SLICE_UNIT, slice_unit)
    result = subprocess.run(
        [systemd_analyze(), "verify", str(socket_unit), str(slice_unit), str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result


@pytest.mark.slow
def test_the_unit_is_sandboxed_to_an_exposure_of_4_or_less() -> None:
    result = subprocess.run(
        [systemd_analyze(), "security", "--offline=yes", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    last = result.stdout.strip().splitlines()[-1]  # "→ Overall exposure level for ...: 2.2 OK"
    exposure = float(last.split(": ")[1].split()[0])
    assert exposure <= MOST_EXPOSED, result.stdout


def unit_settings(unit: Path = UNIT) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            values.setdefault(key, []).append(value)
    return values


def test_the_unit_runs_the_venv_and_gives_up_on_a_configuration_error() -> None:
    """Exit 2 (a bad setting, tests/http/test_cli.py) is not restarted every 5 s forever."""
    settings = unit_settings()
    assert settings["ExecStart"] == [f"{EXEC_START} serve"]
    assert settings["Type"] == ["notify"]
    assert settings["RestartPreventExitStatus"] == ["2"]
    # What it must still reach: the host's /dev (NVML) and every pid's cgroup file.
    assert settings.get("PrivateDevices", ["no"]) == ["no"]
    assert "ProtectProc" not in settings
    assert settings["OOMScoreAdjust"] == ["-900"]  # a job (500) is killed before the node


# systemd.exec(5): each of these puts the unit in a mount namespace of its own, whose mounts
# the engine (in the host's) never sees.
MOUNT_NAMESPACE = (
    "PrivateMounts", "ProtectSystem", "ProtectHome", "PrivateTmp", "ProtectKernelTunables",
    "ProtectKernelModules", "ProtectKernelLogs", "ProtectControlGroups", "ReadOnlyPaths",
    "ReadWritePaths", "InaccessiblePaths", "TemporaryFileSystem", "BindPaths", "ProtectProc",
)  # fmt: skip


def test_the_unit_can_stage_mounts_the_engine_sees_and_nothing_more() -> None:
    """Issue 33: the node binds each job's mounts at its staging path: the host's mount
    namespace, CAP_SYS_ADMIN and the mount calls; no other capability, privileged calls
    still refused."""
    settings = unit_settings()
    assert not [name for name in MOUNT_NAMESPACE if name in settings]
    assert settings["CapabilityBoundingSet"] == ["CAP_SYS_ADMIN"]
    assert settings["NoNewPrivileges"] == ["yes"]
    assert settings["SystemCallFilter"] == ["@system-service @mount", "~@privileged @resources"]


def test_the_socket_unit_holds_the_port_on_both_families_for_one_daemon() -> None:
    settings = unit_settings(SOCKET_UNIT)
    assert settings["ListenStream"] == ["8470"]  # [::]:8470 ...
    assert settings["BindIPv6Only"] == ["both"]  # ... taking IPv4 too
    assert settings["Accept"] == ["no"]  # one daemon, not one per connection
    assert settings["WantedBy"] == ["sockets.target"]


# --- systemd's notify protocol ---------------------------------------------------------------


@pytest.fixture(params=["abstract", "path"])
def notify_socket(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket as systemd binds it: ``@name`` (abstract) or a path."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        if request.param == "abstract":
            name = f"@tuneplane-test-{uuid.uuid4().hex}"
        else:
            name = str(tmp_path / "notify")
        listener.bind(socket_address(name) or "")
        # A wait that ends at the datagram: long enough for a start on a loaded machine.
        listener.settimeout(120)
        yield name, listener


def test_notify_sends_one_datagram_of_the_fields(
    notify_socket: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, listener = notify_socket
    monkeypatch.setenv("NOTIFY_SOCKET", name)
    assert notify("READY=1", "STATUS=serving")
    assert listener.recv(4096) == b"READY=1\nSTATUS=serving"


def test_notify_outside_systemd_sends_nothing_and_never_raises(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not notify("READY=1")
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")  # a VM's: not handled
    assert not notify("READY=1")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert not notify("READY=1")


def get_healthz(port: int) -> object:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as reply:
        return json.loads(reply.read())


@pytest.mark.slow
def test_serve_says_ready_once_it_answers_and_stopping_on_sigterm(
    tmp_path: Path, notify_socket: tuple[str, socket.socket]
) -> None:
    """READY=1 only once the port answers (asked once, right after: no retry), and
    STOPPING=1 when systemd's SIGTERM comes."""
    name, listener = notify_socket
    port = free_port()
    process = spawn_daemon(tmp_path, port, TUNEPLANE_LOCAL_RUNTIME="process", NOTIFY_SOCKET=name)
    try:
        ready = listener.recv(4096).decode().split("\n")
        assert get_healthz(port) == {"ok": True}
        assert ready[0] == "READY=1" and ready[1].startswith("STATUS=serving")
        process.send_signal(signal.SIGTERM)
        assert listener.recv(4096) == b"STOPPING=1"
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


def until_listening(port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
            return
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, f"nothing ever listened on {port}"
            time.sleep(0.02)


@pytest.mark.slow
def test_serve_under_socket_activation_serves_the_socket_it_is_given(tmp_path: Path) -> None:
    """As the .socket unit runs it: the port held outside the daemon and passed as fd 3
    (LISTEN_FDS). The daemon binds nothing of its own: its settings' port stays free."""
    activate = systemd_tool("systemd-socket-activate", "/lib/systemd/systemd-socket-activate")
    port, own_port = free_port(), free_port()
    settings = {
        "PYTHONPATH": python_path(),
        "TUNEPLANE_NODE_TOKEN": "t0ken-0123456789abcdef",
        "TUNEPLANE_NODE_PORT": str(own_port),
        "TUNEPLANE_LOCAL_RUNTIME": "process",
        "TUNEPLANE_NODE_STATE_DIR": str(tmp_path / "state"),
        "TUNEPLANE_STORAGE_ROOT": str(storage_root(tmp_path)),
    }
    # It passes on only PATH, HOME, TERM and USER of its own environment, and the -E ones.
    argv = [activate, "-l", f"127.0.0.1:{port}", *(f"-E{k}={v}" for k, v in settings.items())]
    log = tmp_path / "serve.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [*argv, sys.executable, "-m", "tuneplane_node", "serve"],
            cwd=tmp_path,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)},
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        until_listening(port)  # systemd-socket-activate's own socket
        # That first connection started the daemon (exec: the same pid); this one waits in
        # the backlog until it serves.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=60) as reply:
            assert json.loads(reply.read()) == {"ok": True}
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", own_port))  # not bound by the daemon
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    text = log.read_text()
    assert f"serving the sockets systemd passed (LISTEN_FDS): 127.0.0.1:{port}" in text, text
    assert "Traceback" not in text


# --- Kubernetes ------------------------------------------------------------------------------

MANIFESTS = sorted((REPO / "contrib" / "k8s").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda path: path.name)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(manifest: Path) -> None:
    """Offline, strict (an unknown field is an error): kubernetes-validate's schemas."""
    import kubernetes_validate  # a fifth of a second to import: only this slow test needs it

    version = kubernetes_validate.latest_version()
    for document in yaml.safe_load_all(manifest.read_text()):
        kubernetes_validate.validate(document, version, strict=True)


def test_the_daemonset_stages_mounts_the_host_sees_and_reads_its_token_from_a_secret() -> None:
    """Issue 33: privileged only for Bidirectional propagation, and only on the state
    dir, where the staged mounts are made; the root file system stays read-only."""
    (daemonset,) = yaml.safe_load_all((REPO / "contrib/k8s/daemonset.yaml").read_text())
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["automountServiceAccountToken"] is False
    security = container["securityContext"]
    assert security["privileged"] is True  # Kubernetes' condition for Bidirectional
    assert security["readOnlyRootFilesystem"] is True
    propagation = {
        mount["mountPath"]: mount.get("mountPropagation") for mount in container["volumeMounts"]
    }
    env_state = {item["name"]: item.get("value") for item in container["env"]}
    state = env_state["TUNEPLANE_NODE_STATE_DIR"]
    assert [path for path, how in propagation.items() if how == "Bidirectional"] == [state]
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    env = {item["name"]: item for item in container["env"]}
    assert "TUNEPLANE_NODE_TOKEN" not in env  # not in the pod spec for all to read
    token_dir = env["TUNEPLANE_NODE_TOKEN_FILE"]["value"].rsplit("/", 1)[0]
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes[mounts[token_dir]]["secret"]["secretName"] == "tuneplane-node"
