"""The README's operator path ("On a GPU machine"), followed from scratch as a script: its
lines run one by one with its paths moved under a temporary root and ``sudo`` dropped
(the suite runs as root). The wheel goes into a virtual environment of its own, the
settings and token files are made as written, ``check`` fails on what a GPU machine
without the NVIDIA runtime lacks and passes once the fix it names is applied, and the
installed units' daemon serves ``ctl`` with the operate token, Prometheus with the
metrics one and the console with the full one, on the suite's docker. No systemd
runs here (it is not this machine's init): ``systemctl enable --now`` is the unit files'
own ``EnvironmentFile=`` and ``ExecStart=`` under ``systemd-socket-activate`` with the
socket unit's port, as systemd would run them."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.http.test_deploy import systemd_tool, unit_settings
from tests.support.daemons import REPO, free_port
from tests.support.engines import TESTS_DOCKER_SOCK, engine_missing
from tests.support.images import IMAGE
from tests.support.jobs import unique
from tuneplane_node.wire import PROTOCOL, PROTOCOL_HEADER

pytestmark = [pytest.mark.engine, pytest.mark.slow]

README_BLOCK = re.compile(r"<!-- operator path[^>]*-->\n```sh\n(.*?)```", re.S)
MOVED = ("/opt/tuneplane-node", "/etc/tuneplane-node", "/etc/systemd/system/")
SYSTEMCTL = "systemctl enable --now"


def operator_lines() -> list[str]:
    (block,) = README_BLOCK.findall((REPO / "README.md").read_text())
    return str(block).strip().splitlines()


class Machine:
    """The operator's machine under ``root``: the README's lines run there, in a
    checkout (the repository) with the wheel in ``root/dist``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.daemon: subprocess.Popen[bytes] | None = None
        self.file("/etc/systemd/system").mkdir(parents=True)  # a systemd machine has it

    def moved(self, line: str) -> str:
        line = line.removeprefix("sudo ").replace(" sudo ", " ")
        for path in MOVED:
            line = line.replace(path, f"{self.root}{path}")
        return line.replace("dist/", f"{self.root}/dist/")

    def run(self, line: str) -> subprocess.CompletedProcess[str]:
        """One line in the operator's root shell: this environment (pip's index, proxies)
        but no TUNEPLANE_ setting, which comes from the env file alone, and no
        PYTHONPATH: the installed wheel runs, not the checkout."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNEPLANE_", "PYTHON"))}
        env["TUNEPLANE_CTL_URL"] = f"http://127.0.0.1:{self.port}"
        return subprocess.run(
            ["bash", "-c", self.moved(line)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    def file(self, path: str) -> Path:
        return Path(f"{self.root}{path}")

    def tokens(self) -> dict[str, str]:
        """Each token of the file by its name."""
        lines = self.file("/etc/tuneplane-node/tokens").read_text().splitlines()
        found = {}
        for line in lines:
            if match := re.search(r"name=(\S+)", line):
                found[match[1]] = line.split()[0]
        return found

    def start_units(self) -> None:
        """What ``systemctl enable --now`` starts: the socket unit's port held outside the
        daemon, the service's ExecStart with its EnvironmentFile, in its directory."""
        units = self.file("/etc/systemd/system/")
        service = {k: v[-1] for k, v in unit_settings(units / "tuneplane-node.service").items()}
        assert unit_settings(units / "tuneplane-node.socket")["ListenStream"] == ["8470"]
        settings = env_file(self.moved(service["EnvironmentFile"]))
        workdir = self.file(service["WorkingDirectory"])  # systemd makes it: StateDirectory=
        workdir.mkdir(parents=True, exist_ok=True)
        activate = systemd_tool("systemd-socket-activate", "/lib/systemd/systemd-socket-activate")
        listen = ["-l", f"127.0.0.1:{self.port}"]  # 8470 may be another node's here
        argv = [activate, *listen, *(f"-E{k}={v}" for k, v in settings.items())]
        with (self.root / "serve.log").open("w") as log:
            self.daemon = subprocess.Popen(
                [*argv, *self.moved(service["ExecStart"]).split()],
                cwd=workdir,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def stop_units(self) -> int:
        assert self.daemon is not None
        self.daemon.send_signal(signal.SIGTERM)
        return self.daemon.wait(timeout=60)

    def ask(self, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                PROTOCOL_HEADER: str(PROTOCOL),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as reply:
                return reply.status, answer_of(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, answer_of(exc.read())


def answer_of(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode()


def env_file(path: str) -> dict[str, str]:
    """An ``EnvironmentFile=`` as systemd reads it: ``KEY=value``, quotes taken off, an
    empty value passed as empty (the daemon reads that as its default)."""
    settings = {}
    for line in Path(path).read_text().splitlines():
        if line.strip() and not line.lstrip().startswith(("#", ";")):
            key, value = line.split("=", 1)
            if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            settings[key.strip()] = value
    return settings


def check_lines(output: str) -> dict[str, str]:
    lines = {}
    for line in output.splitlines():
        level, text = line.split(None, 1)
        lines[text.split(":", 1)[0]] = f"{level} {text}"
    return lines


def development_settings(machine: Machine) -> str:
    """The operator's edit of the env file on this machine: the suite's docker, a
    port of its own, and a GPU machine of two cards (the simulation file: no driver here)."""
    cards = [{"index": i, "name": "NVIDIA H100 80GB HBM3"} for i in range(2)]
    simulation = machine.root / "gpus.json"
    simulation.write_text(json.dumps({"driver": "580.1", "cards": cards}))
    (machine.root / "data").mkdir()  # the machine's storage for checkpoints
    return "".join(
        f"{key}={value}\n"
        for key, value in {
            "TUNEPLANE_LOCAL_RUNTIME": "docker",
            "TUNEPLANE_DOCKER_HOST": f"unix://{TESTS_DOCKER_SOCK}",
            "TUNEPLANE_NODE_STATE_DIR": machine.file("/var/lib/tuneplane-node"),
            "TUNEPLANE_STORAGE_ROOT": machine.root / "data",
            "TUNEPLANE_NODE_HOST": "127.0.0.1",
            "TUNEPLANE_NODE_PORT": machine.port,  # check's port line; the units pass theirs
            "TUNEPLANE_GPU_SIMULATION_FILE": simulation,
            "TUNEPLANE_DEV_SHARED_ENGINE": "true",  # other tests' daemons share this docker
        }.items()
    )


def build_wheel(dist: Path) -> None:
    """`python -m build` as "A wheel" says; no isolation: the test venv's setuptools."""
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "-o", str(dist)]
    subprocess.run([*build, str(REPO)], check=True, capture_output=True, timeout=300)


def test_the_readme_operator_path_from_a_wheel_to_a_scraped_node(tmp_path: Path) -> None:
    if not TESTS_DOCKER_SOCK.exists():
        engine_missing("docker", f"no socket at {TESTS_DOCKER_SOCK}")
    machine = Machine(tmp_path)
    build_wheel(tmp_path / "dist")
    lines = operator_lines()
    steps = iter(lines)
    try:
        walk(machine, steps)
    finally:
        if machine.daemon is not None and machine.daemon.poll() is None:
            machine.daemon.kill()
            machine.daemon.wait(timeout=10)
    assert next(steps, None) is None, "the walk stopped before the README's last line"


def walk(machine: Machine, steps: Any) -> None:
    for line in steps:
        if SYSTEMCTL in line:
            machine.start_units()
            continue
        if " check --env-file " in line:
            check_fails_then_passes_once_fixed(machine, line)
            continue
        result = machine.run(line)
        if " ctl " in line:
            the_running_node_serves_each_token_its_scope(machine, line, result)
            continue
        assert result.returncode == 0, f"{line}\n{result.stdout}{result.stderr}"
    env = machine.file("/etc/tuneplane-node/env")
    tokens = machine.file("/etc/tuneplane-node/tokens")
    assert stat.S_IMODE(env.stat().st_mode) == stat.S_IMODE(tokens.stat().st_mode) == 0o600


def check_fails_then_passes_once_fixed(machine: Machine, line: str) -> None:
    """On a GPU machine whose docker has no NVIDIA runtime, check fails on that alone and
    names the fix; the development fix the docs give (no passthrough) makes it pass."""
    env = machine.file("/etc/tuneplane-node/env")
    assert "TUNEPLANE_NODE_TOKEN_FILE=" + str(machine.file("/etc/tuneplane-node/tokens")) in (
        env.read_text()
    )
    with env.open("a") as file:
        file.write(development_settings(machine))
    first = machine.run(line)
    lines = check_lines(first.stdout)
    assert first.returncode == 1, first.stdout + first.stderr
    assert [subject for subject, text in lines.items() if text.startswith("FAIL")] == ["gpu jobs"]
    assert "nvidia-ctk runtime configure --runtime=docker" in lines["gpu jobs"]
    assert lines["token"].startswith("ok token: 3 accepted (") and lines["token"].endswith(
        f"), from TUNEPLANE_NODE_TOKEN_FILE {machine.file('/etc/tuneplane-node/tokens')}"
    ), lines["token"]
    assert all(f"{scope} 1" in lines["token"] for scope in ("full", "operate", "metrics"))
    assert lines["gpu"].startswith("ok gpu: simulation file ")
    assert lines["settings"] == f"ok settings: from {env} (--env-file)"  # the unit's file alone
    with env.open("a") as file:
        file.write("TUNEPLANE_LOCAL_GPU_PASSTHROUGH=false\n")
    second = machine.run(line)
    assert second.returncode == 0, second.stdout + second.stderr
    assert check_lines(second.stdout)["gpu jobs"].startswith("warn gpu jobs: ")
    for secret in machine.tokens().values():
        assert secret not in first.stdout + second.stdout + first.stderr + second.stderr


def the_running_node_serves_each_token_its_scope(
    machine: Machine, line: str, health: subprocess.CompletedProcess[str]
) -> None:
    """ctl with the file's first token (operate) lists images, cordons and uncordons,
    and cannot stop a job; Prometheus's token scrapes and reads nothing else; the
    console's launches a card job on docker."""
    assert health.returncode == 0, health.stdout + health.stderr
    assert "docker" in health.stdout
    tokens = machine.tokens()
    ctl = line.removesuffix(" health")  # the README's ctl, for other verbs
    for verb in ("images", "cordon --reason try", "uncordon"):
        done = machine.run(f"{ctl} {verb}")
        assert done.returncode == 0, (verb, done.stdout + done.stderr)
    refused = machine.run(f"{ctl} stop tuneplane-x")
    assert refused.returncode != 0 and "needs a token of scope full" in refused.stderr

    status, metrics = machine.ask("GET", "/metrics", tokens["prometheus"])
    assert status == 200 and 'tuneplane_node_gpus{state="free"} 2.0' in metrics, metrics
    status, answer = machine.ask("GET", "/node/v1/health", tokens["prometheus"])
    assert (status, answer["code"]) == (403, "insufficient_scope")

    run_id = unique("operator")
    job = {"image": IMAGE, "command": ["/bin/sleep", "300"]}
    body = {"run_id": run_id, "requested_gpus": 1, "container": job}
    status, launched = machine.ask("POST", "/node/v1/launch", tokens["console"], body)
    ref = launched.get("ref") if isinstance(launched, dict) else None
    try:
        assert (status, launched["phase"], len(launched["gpus"])) == (200, "running", 1)
        observed = machine.run(f"{ctl} observe {ref}")
        assert observed.returncode == 0 and "running" in observed.stdout, observed.stdout
    finally:
        if ref:
            machine.ask("POST", "/node/v1/stop", tokens["console"], {"ref": ref, "timeout": 0})
            machine.ask("POST", "/node/v1/remove", tokens["console"], {"ref": ref})
    assert machine.stop_units() == 0
    log = (machine.root / "serve.log").read_text()
    assert "with token console" in log and "Traceback" not in log
    assert not any(secret in log for secret in tokens.values())
    shutil.rmtree(machine.file("/opt/tuneplane-node"))  # 100 MB of venv: not kept in /tmp
