"""`tuneplane-node check` as an operator reads it: one line per fact, ok / warn / FAIL,
exit 1 on any FAIL. ``cli.main`` runs in this process with a controlled environment;
the process runtime stands in for an engine where the engine is not the point."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.checkcommand import Check
from tests.support.console import TOKEN
from tests.support.daemons import free_port, spawn_daemon
from tests.support.engines import engine_settings, podman_url
from tests.support.nodes import storage_root
from tuneplane_node.checks import engine as engine_checks
from tuneplane_node.checks.findings import OK, WARN
from tuneplane_node.cli import main
from tuneplane_node.wire import PROTOCOL, PROTOCOL_HEADER

# Slow: the check command end to end: ports, files, TLS and engines tried for real.
pytestmark = pytest.mark.slow


def test_a_sound_machine_passes_and_no_secret_is_printed(check: Check, tmp_path: Path) -> None:
    code, lines, out = check()
    assert code == 0, out
    assert lines["token"] == "ok token: 1 accepted (full 1), from TUNEPLANE_NODE_TOKEN"
    assert lines["storage root"].startswith(f"ok storage root: {storage_root(tmp_path)} on ")
    assert lines["state dir"].startswith(f"ok state dir: {tmp_path / 'state'} writable")
    assert lines["engine"].startswith("warn engine: process runtime")
    assert lines["tls"].startswith("warn tls: off")
    assert {"gpu", "mount roots", "mounts", "fabrics", "port"} <= lines.keys()
    assert lines["mounts"].startswith("warn mounts: the process runtime mounts nothing")
    assert "s3cret" not in out


def test_a_missing_token_fails(check: Check) -> None:
    code, lines, _ = check(TUNEPLANE_NODE_TOKEN="")
    assert code == 1
    assert lines["token"].startswith(
        "FAIL token: neither TUNEPLANE_NODE_TOKEN nor TUNEPLANE_NODE_TOKEN_FILE is set"
    )


def test_a_token_file_is_counted_never_shown(check: Check, tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text(
        "# rotated monthly\nfirst-s3cret-0123456789\n\n"
        "second-s3cret-0123456789 name=prometheus scope=metrics\n"
    )
    code, lines, out = check(
        TUNEPLANE_NODE_TOKEN="", TUNEPLANE_NODE_TOKEN_FILE=str(tmp_path / "tokens")
    )
    assert code == 0, out
    assert lines["token"] == (
        "ok token: 2 accepted (full 1, metrics 1), "
        f"from TUNEPLANE_NODE_TOKEN_FILE {tmp_path / 'tokens'}"
    )
    assert "s3cret" not in out


@pytest.mark.parametrize("where", ["env", "file"])
def test_a_short_token_fails_and_says_how_to_make_one(
    check: Check, tmp_path: Path, where: str
) -> None:
    """Issue 25, finding 9: a one-character token passed `check` (and `serve`)."""
    (tmp_path / "tokens").write_text("x\n")
    given = {"TUNEPLANE_NODE_TOKEN": "x"}
    if where == "file":
        given = {"TUNEPLANE_NODE_TOKEN": "", "TUNEPLANE_NODE_TOKEN_FILE": str(tmp_path / "tokens")}
    code, lines, out = check(**given)
    assert code == 1, out
    assert lines["token"].startswith("FAIL token: TUNEPLANE_NODE_TOKEN")
    assert lines["token"].endswith(
        "a token of 1 characters is too easy to guess: at least 16; "
        "make one with `openssl rand -hex 32`"
    )


def key_pair(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    subprocess.run(["openssl", "req", "-x509", *ec, "-keyout", key, "-out", cert, "-days", "1",
                    "-subj", f"/CN={name}"], check=True, capture_output=True)  # fmt: skip
    return cert, key


def test_tls_files_that_match_pass_and_a_foreign_key_fails(check: Check, tmp_path: Path) -> None:
    cert, key = key_pair(tmp_path, "node")
    _, other_key = key_pair(tmp_path, "other")
    code, lines, _ = check(TUNEPLANE_TLS_CERT_FILE=str(cert), TUNEPLANE_TLS_KEY_FILE=str(key))
    assert code == 0
    assert lines["tls"] == f"ok tls: {cert} matches its key {key}"
    code, lines, _ = check(TUNEPLANE_TLS_CERT_FILE=str(cert), TUNEPLANE_TLS_KEY_FILE=str(other_key))
    assert code == 1
    assert lines["tls"].startswith("FAIL tls: TUNEPLANE_TLS_CERT_FILE: cannot use the TLS files")


def test_the_volume_ca_file_is_loaded_as_the_fetches_load_it(check: Check, tmp_path: Path) -> None:
    """A private mirror's CA (issue 52, part 9): said when it loads, a FAIL when it does
    not (every https volume of that CA would fail at its first fetch)."""
    cert, _ = key_pair(tmp_path, "mirror-ca")
    code, lines, out = check(TUNEPLANE_VOLUME_CA_FILE=str(cert))
    assert code == 0, out
    assert lines["volume CA"] == (
        f"ok volume CA: {cert}: 1 CA(s) trusted for https volume sources and registries"
    )
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    code, lines, _ = check(TUNEPLANE_VOLUME_CA_FILE=str(tmp_path / "junk.pem"))
    assert code == 1
    assert lines["volume CA"].startswith(f"FAIL volume CA: TUNEPLANE_VOLUME_CA_FILE {tmp_path}")
    assert "volume CA" not in check(TUNEPLANE_VOLUME_CA_FILE="")[1]  # the system's alone


def test_the_engine_down_fails_naming_its_address(check: Check) -> None:
    address = "unix:///nonexistent/no-engine.sock"  # not under the storage root: a mount root
    code, lines, _ = check(TUNEPLANE_LOCAL_RUNTIME="docker", TUNEPLANE_DOCKER_HOST=address)
    assert code == 1
    assert lines["engine"].startswith(f"FAIL engine: docker at {address} does not answer: ")


def test_a_runtime_without_a_store_says_nothing_holds_a_jobs_disk(check: Check) -> None:
    _, lines, _ = check(TUNEPLANE_JOB_DISK_LIMIT="20g")
    assert lines["job disk"] == (
        "warn job disk: TUNEPLANE_JOB_DISK_LIMIT=20g is held by nothing (no store): "
        "no job is measured"
    )
    assert lines["scratch"] == (
        "warn scratch: the process runtime mounts nothing: container.scratch is refused"
    )


def test_cards_come_from_the_simulation_file_and_a_bad_file_fails(
    check: Check, tmp_path: Path
) -> None:
    simulation = tmp_path / "gpus.json"
    cards = [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(2)]
    simulation.write_text(json.dumps({"driver": "580.1", "cards": cards}))
    code, lines, _ = check(TUNEPLANE_GPU_SIMULATION_FILE=str(simulation))
    assert code == 0
    assert lines["gpu"] == (
        f"ok gpu: simulation file {simulation}, driver 580.1: 2 x NVIDIA H100 80GB HBM3"
    )
    simulation.write_text('{"cards": [{"name": "no index"}]}')
    code, lines, _ = check(TUNEPLANE_GPU_SIMULATION_FILE=str(simulation))
    assert code == 1
    assert lines["gpu"].startswith("FAIL gpu: simulation: ")


def test_an_unknown_card_count_fails_naming_the_setting(check: Check) -> None:
    """Issue 25, finding 1: no driver, no count: every card launch was a bare 409."""
    code, lines, out = check(TUNEPLANE_LOCAL_GPU_COUNT="")
    assert code == 1, out
    assert lines["gpu jobs"].startswith(
        "FAIL gpu jobs: cannot run: the card count is unknown: no GPU driver answered ("
    )
    assert lines["gpu jobs"].endswith(
        "install the NVIDIA driver, or set TUNEPLANE_LOCAL_GPU_COUNT (0 on a machine without cards)"
    )
    code, lines, _ = check()  # TUNEPLANE_LOCAL_GPU_COUNT=0: none by design
    assert (code, lines["gpu jobs"]) == (0, "ok gpu jobs: none here (no cards)")


def test_a_missing_model_dir_and_mount_root_fail_by_name(check: Check, tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    dirs = json.dumps([str(tmp_path / "models"), str(tmp_path / "filer")])
    code, lines, out = check(TUNEPLANE_MODEL_DIRS=dirs)
    assert code == 1
    model_lines = [line for line in out.splitlines() if "model dir:" in line]
    assert model_lines[0].startswith(f"ok   model dir: {tmp_path / 'models'} on ")
    assert model_lines[1] == f"FAIL model dir: {tmp_path / 'filer'} is not a directory"
    assert lines["mount roots"].startswith(f"FAIL mount roots: {tmp_path / 'filer'} missing")


def test_an_unwritable_state_dir_fails(check: Check, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    code, lines, _ = check(TUNEPLANE_NODE_STATE_DIR=str(tmp_path / "a-file" / "state"))
    assert code == 1
    assert lines["state dir"].startswith(f"FAIL state dir: {tmp_path / 'a-file' / 'state'}: ")


def test_a_configured_fabric_this_machine_lacks_fails(check: Check) -> None:
    fabrics = json.dumps([{"name": "ib-east", "hcas": ["mlx5_nonexistent"]}])
    code, lines, _ = check(TUNEPLANE_FABRICS=fabrics)
    assert code == 1
    assert "mlx5_nonexistent (fabric ib-east)" in lines["fabrics"]
    assert lines["fabrics"].startswith("FAIL")


def test_the_node_port_in_use_fails(check: Check) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines, _ = check(TUNEPLANE_NODE_HOST="127.0.0.1", TUNEPLANE_NODE_PORT=str(port))
    assert code == 1
    assert (
        lines["port"]
        == f"FAIL port: 127.0.0.1:{port}: Address already in use (a node already serving?)"
    )


def test_a_serving_node_is_reported_not_failed_on_its_own_port(
    check: Check, tmp_path: Path
) -> None:
    """Issue 36, finding 8: check on a serving node failed on the node's own port."""
    port, served = free_port(), tmp_path / "served"
    served.mkdir()
    daemon = spawn_daemon(served, port, TUNEPLANE_LOCAL_RUNTIME="process")
    try:
        deadline = time.monotonic() + 30
        while True:
            assert daemon.poll() is None and time.monotonic() < deadline
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            time.sleep(0.1)
        code, lines, _ = check(TUNEPLANE_NODE_HOST="127.0.0.1", TUNEPLANE_NODE_PORT=str(port))
    finally:
        daemon.kill()
        daemon.wait(timeout=10)
    assert lines["port"] == (
        f"ok port: 127.0.0.1:{port}: served by a running tuneplane-node "
        f"(pid {daemon.pid}, port {port})"
    ), lines["port"]
    assert code == 0


def test_check_beside_a_serving_node_resolves_paths_in_its_working_directory(
    check: Check, tmp_path: Path
) -> None:
    """Issue 36, finding 8: check run from another directory resolved a relative storage
    root against its own working directory, not the serving node's."""
    port, served = free_port(), tmp_path / "served"
    (served / "data").mkdir(parents=True)
    relative = {"TUNEPLANE_STORAGE_ROOT": "data", "TUNEPLANE_NODE_STATE_DIR": "state"}
    daemon = spawn_daemon(served, port, TUNEPLANE_LOCAL_RUNTIME="process", settings_of=relative)
    try:
        inventory = served_inventory(daemon, port)
        code, lines, out = check(
            TUNEPLANE_NODE_HOST="127.0.0.1", TUNEPLANE_NODE_PORT=str(port), **relative
        )
    finally:
        daemon.kill()
        daemon.wait(timeout=10)
    assert Path.cwd() == served  # check moved to where serve resolves its paths
    assert (served / "data").resolve() in map(Path, inventory["storage"][0]["paths"])
    assert lines["storage root"].startswith(f"ok storage root: {served / 'data'} on "), out
    assert lines["state dir"].startswith("ok state dir: state writable"), out
    assert lines["paths"] == (
        f"ok paths: relative ones from {served}, the working directory of the serving "
        f"node (pid {daemon.pid})"
    )
    assert code == 0, out
    assert not (tmp_path / "data").exists() and not (tmp_path / "state").exists()


def test_check_without_a_serving_node_says_where_relative_paths_start(
    check: Check, tmp_path: Path
) -> None:
    (tmp_path / "data").mkdir()
    code, lines, out = check(TUNEPLANE_STORAGE_ROOT="data")
    assert lines["paths"].startswith(f"ok paths: relative ones from {tmp_path}, "), out
    assert lines["storage root"].startswith(f"ok storage root: {tmp_path / 'data'} on ")
    assert code == 0, out


def served_inventory(daemon: subprocess.Popen[bytes], port: int) -> dict[str, Any]:
    """The inventory of a daemon just spawned, once it answers."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/node/v1/inventory",
        headers={"Authorization": f"Bearer {TOKEN}", PROTOCOL_HEADER: str(PROTOCOL)},
    )
    deadline = time.monotonic() + 30
    while True:
        assert daemon.poll() is None and time.monotonic() < deadline
        with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=5) as answer:
            found: dict[str, Any] = json.loads(answer.read())
            return found
        time.sleep(0.1)


def test_the_jobs_bounds_are_said_and_a_reachable_plain_api_is_warned_of(check: Check) -> None:
    code, _, out = check(TUNEPLANE_JOB_PIDS_LIMIT="2048")
    jobs = [line for line in out.splitlines() if " jobs: " in line]
    assert code == 0, out
    assert jobs[0].startswith("ok   jobs: capabilities CHOWN, DAC_OVERRIDE, ")
    assert "no-new-privileges on; pids 2048; log 10485760 bytes x 5; oom_score_adj 500" in jobs[0]
    assert any(line.startswith("ok   jobs: a launch asking for the host network gets it only "
                               "holding every card") and "socket unit" in line
               for line in jobs)  # fmt: skip
    assert "warn jobs: the process runtime applies none of these bounds" in jobs

    _, _, allowed = check(TUNEPLANE_JOB_HOST_NETWORK="allow")
    assert "warn jobs: host-network jobs are allowed beside each other" in allowed
    assert "the API is plain HTTP" in allowed

    _, _, bridged = check(
        TUNEPLANE_JOB_HOST_NETWORK="bridge", TUNEPLANE_JOB_CAPABILITIES="restricted"
    )
    assert "host-network jobs are allowed" not in bridged
    assert "ok   jobs: a launch asking for the host network is bridged" in bridged
    assert "jobs: capabilities none;" in bridged
    assert "ok   jobs: a bridged job runs isolated: it cannot reach another job" in bridged

    _, _, shared = check(TUNEPLANE_JOB_NETWORK="bridge")
    assert "warn jobs: a bridged job runs on the engine's default bridge" in shared


def test_a_reserve_larger_than_the_machine_fails(check: Check) -> None:
    code, lines, _ = check(TUNEPLANE_SYSTEM_RESERVED_MEMORY="100000g")
    assert code == 1
    assert lines["jobs"].startswith(
        "FAIL jobs: TUNEPLANE_SYSTEM_RESERVED_MEMORY: reserving 100000g"
    )


def test_a_pids_reserve_larger_than_pid_max_fails(check: Check) -> None:
    code, lines, _ = check(TUNEPLANE_SYSTEM_RESERVED_PIDS="4194304")
    assert code == 1
    assert lines["jobs"].startswith("FAIL jobs: TUNEPLANE_SYSTEM_RESERVED_PIDS: reserving 4194304")


def test_the_registry_auth_file_is_read_as_the_daemon_reads_it_and_shows_no_secret(
    check: Check, tmp_path: Path
) -> None:
    config = tmp_path / "config.json"
    pair = base64.b64encode(b"ci:hunter2-secret").decode()
    config.write_text(json.dumps({"auths": {"registry.test": {"auth": pair}}}))
    code, lines, out = check(TUNEPLANE_REGISTRY_AUTH_FILE=str(config))
    assert lines["registry auth"] == f"ok registry auth: {config}: credentials for registry.test"
    assert "hunter2" not in out and code == 0

    config.write_text("{broken")
    code, lines, _ = check(TUNEPLANE_REGISTRY_AUTH_FILE=str(config))
    assert lines["registry auth"].startswith("FAIL registry auth: TUNEPLANE_REGISTRY_AUTH_FILE: ")
    assert code == 1


def test_rdma_on_a_runtime_whose_limit_is_unknown_is_warned_of(
    check: Check, tmp_path: Path
) -> None:
    from tests.unit.test_jobs_rules_confinement_rdma import rdma_dir

    _, lines, _ = check(TUNEPLANE_RDMA_DEVICE_DIR=str(rdma_dir(tmp_path)))
    assert lines["rdma"].startswith("warn rdma: 3 devices; the engine's locked-memory limit")
    _, lines, _ = check(TUNEPLANE_RDMA="off")
    assert lines["rdma"] == "ok rdma: off"


def test_the_engines_runtimes_and_isolation_are_said(check: Check) -> None:
    settings = {"TUNEPLANE_LOCAL_RUNTIME": "podman", "TUNEPLANE_PODMAN_URL": podman_url()}
    code, _, out = check(**settings)
    assert code == 0, out
    assert "ok   jobs: podman runtimes: runc (default runc)" in out
    assert "ok   jobs: each gets its own user namespace (userns=auto, 65536 ids)" in out
    code, _, out = check(**settings, TUNEPLANE_JOB_SANDBOX="cpu")
    assert code == 1
    assert "FAIL jobs: TUNEPLANE_JOB_SANDBOX=cpu and podman has no runsc: register it" in out


def test_a_machine_without_iptables_is_told_its_bridged_jobs_reach_its_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = engine_settings("podman", job_network="isolated")
    level, line = engine_checks.job_network_finding(settings)
    assert level == OK and "podman: a network of each job's own, the same rule" in line
    monkeypatch.setattr("shutil.which", lambda name: None if name == "iptables" else name)
    level, line = engine_checks.job_network_finding(settings)
    assert level == WARN, line
    assert line.endswith("reaches this machine's ports: iptables or nsenter is not on this machine")


def test_a_card_left_with_a_process_or_out_for_a_fault_is_named(
    check: Check, tmp_path: Path
) -> None:
    """Issue 53: a card no launch gets though no job of the node holds it."""
    simulation = tmp_path / "gpus.json"
    cards = [
        {"index": 0, "xid": [48]},
        {"index": 1, "processes": [{"pid": os.getpid(), "used_mib": 20480}]},
        {"index": 2},
    ]
    simulation.write_text(json.dumps({"driver": "580.1", "cards": cards}))
    code, lines, out = check(
        TUNEPLANE_GPU_SIMULATION_FILE=str(simulation), TUNEPLANE_LOCAL_GPU_COUNT=""
    )
    assert code == 0, out
    assert lines["gpu 0"].startswith("warn gpu 0: out: XID 48 at ")
    assert lines["gpu 1"] == (
        f"warn gpu 1: draining: compute process {os.getpid()} on it, no job of the node: "
        "no launch gets it until it is gone"
    )
    assert "gpu 2" not in lines


# --- the settings it read ---------------------------------------------------------------------


def test_the_env_file_is_read_as_the_unit_reads_it_and_named(check: Check, tmp_path: Path) -> None:
    """The README's daemon and the systemd unit keep their settings in a file: a check
    without it looked at another node (issue 52, part 7); with ``--env-file`` it reads
    the file, and says so."""
    env = tmp_path / "env"
    env.write_text(
        "# /etc/tuneplane-node/env\nTUNEPLANE_NODE_TOKEN=f1le-t0ken-0123456789\n"
        "TUNEPLANE_LOCAL_GPU_COUNT=0\nTUNEPLANE_LOCAL_API_TIMEOUT=\n"
    )
    code, lines, out = check(TUNEPLANE_NODE_TOKEN="")
    assert code == 1 and lines["token"].startswith("FAIL token: neither"), out
    code, lines, out = check("--env-file", str(env), TUNEPLANE_NODE_TOKEN="")
    assert code == 0, out
    assert lines["token"] == "ok token: 1 accepted (full 1), from TUNEPLANE_NODE_TOKEN"
    assert lines["settings"].startswith(f"ok settings: from {env} (--env-file), then the env")
    assert "TUNEPLANE_NODE_TOKEN" not in lines["settings"] and "f1le" not in out
    assert out.startswith("ok   settings: ")  # the first line: what the others were read from


def test_a_variable_of_the_environment_wins_over_the_file_and_is_named(
    check: Check, tmp_path: Path
) -> None:
    env = tmp_path / "env"
    env.write_text("TUNEPLANE_NODE_TOKEN=short\nTUNEPLANE_LOCAL_RUNTIME=docker\n")
    code, lines, out = check("--env-file", str(env))  # the fixture's token and runtime
    assert code == 0, out
    assert lines["engine"].startswith("warn engine: process runtime")
    said = lines["settings"].partition("over the file's: ")[2]
    assert said == "TUNEPLANE_LOCAL_RUNTIME, TUNEPLANE_NODE_TOKEN)"


def test_an_env_file_that_cannot_be_read_is_a_setting_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check", "--env-file", str(tmp_path / "absent")]) == 2
    assert capsys.readouterr() == (
        "",
        (f"tuneplane-node: --env-file {tmp_path / 'absent'}: No such file or directory\n"),
    )


def test_inventory_reads_the_env_file(
    check: Check, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``inventory`` reads what ``serve`` and ``check`` read (the fixture's environment
    stands in for a shell that set nothing of the node's but a token)."""
    storage = tmp_path / "elsewhere"
    storage.mkdir()
    (tmp_path / "env").write_text(f"TUNEPLANE_STORAGE_ROOT={storage}\n")
    check(TUNEPLANE_STORAGE_ROOT="")  # the fixture's environment, without a storage root
    assert main(["inventory", "--env-file", str(tmp_path / "env")]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["storage_root_visible"] is True
    assert [entry["paths"] for entry in facts["storage"]] == [[str(storage)]]
