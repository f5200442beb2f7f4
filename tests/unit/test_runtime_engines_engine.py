"""What the docker and podman adapters share, without an engine: the error table, the
create options, and an engine that is not there."""

from __future__ import annotations

import http.client
import io
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker
import docker.errors
import podman
import podman.errors
import pytest
import requests
from urllib3.exceptions import ProtocolError

from tests.support.engines import engine_settings
from tuneplane_node.errors import (
    EngineConflict,
    EngineError,
    EngineRefused,
    EngineUnavailable,
    NodeError,
    SpecRefused,
)
from tuneplane_node.runtime.base import LogQuery
from tuneplane_node.runtime.engines.cgroupparent import JobParent
from tuneplane_node.runtime.engines.docker import ERRORS as DOCKER_ERRORS
from tuneplane_node.runtime.engines.docker import DockerRuntime
from tuneplane_node.runtime.engines.engine import EngineRuntime
from tuneplane_node.runtime.engines.networks.jobnetwork import checked
from tuneplane_node.runtime.engines.podman import ERRORS as PODMAN_ERRORS
from tuneplane_node.runtime.engines.podman import PodmanRuntime, create_body
from tuneplane_node.runtime.engines.seam import ErrorTable
from tuneplane_node.runtime.facts import DeviceSupport
from tuneplane_node.runtime.spec import (
    KEPT_CAPABILITIES,
    LINUX_CAPABILITIES,
    Confinement,
    ContainerSpec,
    Tmpfs,
)
from tuneplane_node.wire.values import LABEL_GPUS, LABEL_RUN_ID, Mount

TABLES = [(DOCKER_ERRORS, docker.errors), (PODMAN_ERRORS, podman.errors)]


def http_response(status: int) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    return response


@pytest.mark.parametrize(("table", "module"), TABLES, ids=["docker", "podman"])
def test_every_sdk_exception_is_translated_into_the_engine_family(
    table: ErrorTable, module: Any
) -> None:
    classes = {
        value
        for value in vars(module).values()
        if isinstance(value, type) and issubclass(value, BaseException)
    }
    assert len(classes) > 5
    for cls in classes:
        exc = cls.__new__(cls)
        BaseException.__init__(exc, "boom")
        for attribute in ("response", "explanation", "status_code"):
            if not hasattr(exc, attribute):
                setattr(exc, attribute, None)
        translated = table.translate(exc, action="run x")
        assert isinstance(translated, EngineError), cls
        assert translated.engine == table.engine


def test_a_docker_refusal_carries_the_engines_words() -> None:
    exc = docker.errors.APIError(
        "500 Server Error",
        response=http_response(500),
        explanation="could not select device driver",
    )
    translated = DOCKER_ERRORS.translate(exc, action="run tuneplane-a")
    assert type(translated) is EngineRefused and translated.status == 502
    assert translated.message == "docker refused to run tuneplane-a: could not select device driver"


@pytest.mark.parametrize(
    ("reason", "field"),
    [
        ("unable to find user bob: no matching entries in passwd file", "container.user"),
        ('exec: "/no/such": stat /no/such: no such file or directory', "container.command"),
        ('exec: "train": executable file not found in $PATH', "container.command"),
        (
            'invalid mount config for type "bind": bind source path does not exist',
            "container.mounts",
        ),
        ("Minimum memory limit allowed is 6MB", "container.memory_limit"),
        ('chdir to cwd ("/nope") set in config.json failed: not a directory', "container.workdir"),
    ],
)
def test_a_refusal_for_a_field_of_the_request_names_it(reason: str, field: str) -> None:
    exc = docker.errors.APIError("500", response=http_response(500), explanation=reason)
    translated = DOCKER_ERRORS.translate(exc, action="run tuneplane-a")
    assert isinstance(translated, SpecRefused) and translated.status == 422
    assert translated.message == f"{field}: docker refused to run tuneplane-a: {reason}"
    # Only a run's refusal is the request's fault: the same words elsewhere stay a 502.
    assert type(DOCKER_ERRORS.translate(exc, action="inspect a")) is EngineRefused


def test_a_name_in_use_is_a_conflict_on_both_engines() -> None:
    by_docker = docker.errors.APIError("409", response=http_response(409), explanation="in use")
    by_podman = podman.errors.APIError(
        "500", response=http_response(500), explanation='name "a" is already in use'
    )
    for table, exc in ((DOCKER_ERRORS, by_docker), (PODMAN_ERRORS, by_podman)):
        translated = table.translate(exc, action="run a")
        assert isinstance(translated, EngineConflict) and translated.status == 409


def test_a_transport_failure_is_unavailable_not_refused() -> None:
    refused = requests.exceptions.ConnectionError("Connection refused")
    assert isinstance(DOCKER_ERRORS.translate(refused, action="x"), EngineUnavailable)
    # podman-py wraps it in an APIError without a response
    wrapped = podman.errors.APIError("boom")
    wrapped.__cause__ = refused
    translated = PODMAN_ERRORS.translate(wrapped, action="x")
    assert isinstance(translated, EngineUnavailable) and translated.status == 503
    assert "Connection refused" in translated.message


def test_podmans_500_for_a_vanished_container_means_missing() -> None:
    exc = podman.errors.APIError(
        "500",
        response=http_response(500),
        explanation="container abc does not exist in database: no such container",
    )
    assert PODMAN_ERRORS.missing(exc)
    assert not PODMAN_ERRORS.missing(podman.errors.APIError("500", response=http_response(500)))
    assert DOCKER_ERRORS.missing(docker.errors.NotFound("404", response=http_response(404)))


def test_an_error_already_the_nodes_passes_through() -> None:
    mine = EngineUnavailable(engine="docker", reason="stale")
    assert DOCKER_ERRORS.translate(mine, action="x") is mine


def test_what_an_sdk_raises_inside_translated_leaves_it_as_the_nodes_error() -> None:
    refused = docker.errors.APIError(
        "500 Server Error", response=http_response(500), explanation="driver failed"
    )
    with pytest.raises(EngineRefused) as raised, DOCKER_ERRORS.translated("start tuneplane-a"):
        raise refused
    assert raised.value.message == "docker refused to start tuneplane-a: driver failed"
    assert raised.value.__cause__ is refused  # the engine's own exception, for the log
    mine = EngineUnavailable(engine="docker", reason="stale")
    with pytest.raises(EngineUnavailable) as passed, DOCKER_ERRORS.translated("x"):
        raise mine
    assert passed.value is mine


def test_an_unexpected_exception_is_a_refusal_naming_its_type() -> None:
    translated = DOCKER_ERRORS.translate(ValueError("odd"), action="inspect a")
    assert isinstance(translated, EngineRefused)
    assert translated.message == "docker refused to inspect a: ValueError: odd"


# --- create options: shared, and what truly differs ---------------------------------------

SPEC = ContainerSpec(
    name="tuneplane-r1",
    image="trainer:1",
    command=("python", "-m", "train"),
    env={"EPOCHS": "3"},
    gpus=(1, 3),
    mounts=(Mount("/data/r1", "/work", True),),
    labels={LABEL_RUN_ID: "r1"},
    workdir="/work",
    shm_size="16g",
    cpu_limit=2.5,
    memory_limit="64g",
    user="1000:1000",
)
COMMON = {
    "image": "trainer:1",
    "name": "tuneplane-r1",
    "environment": {"EPOCHS": "3", "NVIDIA_VISIBLE_DEVICES": "1,3"},
    "labels": {LABEL_RUN_ID: "r1", LABEL_GPUS: "1,3"},
    "network_mode": "host",
    "entrypoint": ["python"],
    "command": ["-m", "train"],
    "working_dir": "/work",
    "user": "1000:1000",
    "shm_size": "16g",
    "mem_limit": "64g",
}


def adapter(kind: str, **settings: Any) -> EngineRuntime:
    """An adapter that asks no engine: docker's card request would ask the engine which
    OCI runtimes it has, so it is told the NVIDIA toolkit's (a test may say otherwise)."""
    options = engine_settings(kind, **settings)
    if kind == "podman":
        return PodmanRuntime(options)
    runtime = DockerRuntime(options)
    runtime.support = DeviceSupport(runtimes=("nvidia", "runc"))
    return runtime


async def test_docker_options_replace_the_entrypoint_and_request_the_cards() -> None:
    runtime = adapter("docker")
    options = runtime.create_options(SPEC)
    await runtime.close()

    assert {key: options[key] for key in COMMON} == COMMON
    assert "stop_signal" not in options and options["detach"] is True  # the image's own
    assert options["init"] is True
    stopped_by = runtime.create_options(replace(SPEC, stop_signal="SIGUSR2"))
    assert stopped_by["stop_signal"] == "SIGUSR2"
    assert options["nano_cpus"] == 2_500_000_000
    assert options["mounts"] == [
        {"Target": "/work", "Source": "/data/r1", "Type": "bind", "ReadOnly": True}
    ]
    (request,) = options["device_requests"]
    assert (request["DeviceIDs"], request["Capabilities"]) == (["1", "3"], [["gpu"]])


@pytest.mark.parametrize(
    ("support", "driver", "ids"),
    [
        (
            DeviceSupport(runtimes=("runc",), cdi_dirs=("/etc/cdi",)),
            "cdi",
            ["nvidia.com/gpu=1", "nvidia.com/gpu=3"],
        ),
        (DeviceSupport(runtimes=("nvidia", "runc"), cdi_dirs=("/etc/cdi",)), "", ["1", "3"]),
    ],
)
async def test_docker_without_the_nvidia_runtime_gets_the_cards_as_cdi_devices(
    support: DeviceSupport, driver: str, ids: list[str]
) -> None:
    """Docker 25+ reading CDI specifications and no nvidia runtime: readiness says ready,
    so the cards go as its `cdi` driver's devices (`--device nvidia.com/gpu=1`); a GPU
    device request there is docker's 'could not select device driver'."""
    runtime = adapter("docker")
    assert isinstance(runtime, DockerRuntime)
    runtime.support = support
    (request,) = runtime.create_options(SPEC)["device_requests"]
    await runtime.close()
    assert (request["Driver"], request["DeviceIDs"]) == (driver, ids)


@pytest.mark.parametrize("kind", ["docker", "podman"])
async def test_a_disk_limit_bounds_the_layer_only_where_the_store_has_project_quotas(
    kind: str,
) -> None:
    """This kernel has no quota support: the decision is what can be tested here."""
    runtime = adapter(kind)
    bounded = replace(SPEC, disk_limit_bytes=100 * 2**20)
    runtime.images.quotas = True  # xfs with pquota, as the engine and the mount table said
    with_quotas = runtime.create_options(bounded)
    runtime.images.quotas = False
    without = runtime.create_options(bounded)
    await runtime.close()
    assert with_quotas["storage_opt"] == {"size": str(100 * 2**20)}
    assert "storage_opt" not in without  # the disk monitor holds it there


def test_podman_is_given_the_size_in_libpods_own_field() -> None:
    """podman-py refuses ``storage_opt``: the body is its rendering plus ``storage_opts``."""
    options = {"image": "busybox", "name": "j", "entrypoint": ["sh"], "labels": {"a": "b"}}
    body = create_body(options, {"size": "104857600"})
    assert body["storage_opts"] == {"size": "104857600"}
    assert body["entrypoint"] == ["sh"] and body["name"] == "j"  # podman-py's own rendering


@pytest.mark.parametrize(("chown", "options"), [(True, []), (False, ["idmap"])])
async def test_a_job_of_its_own_namespace_has_its_writable_binds_id_mapped_or_handed_over(
    chown: bool, options: list[str]
) -> None:
    """podman-py renders no mount option of libpod's (it drops an ``options`` list): the
    body itself says ``idmap``, on writable binds only; the node hands them over itself
    where the runtime cannot map (`handover`). Before issue 51 no bind was id-mapped."""
    runtime = adapter("podman")
    spec = replace(
        SPEC, mounts=(Mount("/d", "/rw"), Mount("/m", "/ro", read_only=True)),
        own_userns=True, chown_mounts=chown, network="bridge",
    )  # fmt: skip
    created = runtime.create_options(spec)
    await runtime.close()
    body = create_body(created, None, spec)
    binds = {m["destination"]: m["options"] for m in body["mounts"] if m["type"] == "bind"}
    assert binds == {"/rw": options, "/ro": ["ro"]}
    assert body["idmappings"]["AutoUserNs"] is True
    assert create_body(created).get("idmappings") is None  # the host's: no spec of its own


async def test_podman_options_say_the_same_in_libpods_words() -> None:
    runtime = adapter("podman")
    options = runtime.create_options(SPEC)
    await runtime.close()

    assert {key: options[key] for key in COMMON} == COMMON
    assert "stop_signal" not in options and options["init"] is True  # the image's own
    stopped_by = runtime.create_options(replace(SPEC, stop_signal="SIGUSR2"))
    assert stopped_by["stop_signal"] == 12  # libpod's number
    assert (options["cpu_period"], options["cpu_quota"]) == (100_000, 250_000)
    assert options["mounts"] == [
        {"type": "bind", "source": "/data/r1", "target": "/work", "read_only": True}
    ]
    assert options["devices"] == ["nvidia.com/gpu=1", "nvidia.com/gpu=3"]


@pytest.mark.parametrize("kind", ["docker", "podman"])
async def test_without_passthrough_the_cards_are_labelled_but_not_handed_over(kind: str) -> None:
    runtime = adapter(kind, local_gpu_passthrough=False)
    options = runtime.create_options(SPEC)
    await runtime.close()

    assert options["labels"][LABEL_GPUS] == "1,3"
    assert "device_requests" not in options and "devices" not in options
    assert options["environment"]["NVIDIA_VISIBLE_DEVICES"] == "void"  # not every card


@pytest.mark.parametrize("kind", ["docker", "podman"])
async def test_a_bare_spec_keeps_the_images_entrypoint_and_sets_no_limits(kind: str) -> None:
    runtime = adapter(kind)
    options = runtime.create_options(ContainerSpec(name="a", image="i"))
    await runtime.close()

    assert "entrypoint" not in options and "command" not in options
    assert options["environment"] == {"NVIDIA_VISIBLE_DEVICES": "void"}
    for limit in ("working_dir", "user", "shm_size", "mem_limit", "nano_cpus", "cpu_quota"):
        assert limit not in options


@pytest.mark.parametrize("kind", ["docker", "podman"])
async def test_every_job_starts_from_no_capability_and_is_bounded(kind: str) -> None:
    runtime = adapter(kind)
    options = runtime.create_options(SPEC)
    await runtime.close()

    assert (options["pids_limit"], options["oom_score_adj"]) == (16384, 500)
    # Whatever the engine's own default set, a job holds no more than the kept ones.
    if kind == "docker":
        assert (options["cap_drop"], options["cap_add"]) == (["ALL"], list(KEPT_CAPABILITIES))
    else:
        assert "cap_add" not in options  # podman makes added ones ambient for any user
        assert set(options["cap_drop"]) == set(LINUX_CAPABILITIES) - set(KEPT_CAPABILITIES)


READ_ONLY = replace(
    SPEC, read_only_root=True, tmpfs=(Tmpfs("/tmp", 512 * 2**20), Tmpfs("/run", 64 * 2**20))
)


async def test_docker_mounts_a_read_only_root_and_its_bounded_tmpfs() -> None:
    runtime = adapter("docker")
    options = runtime.create_options(READ_ONLY)
    writable = runtime.create_options(SPEC)
    await runtime.close()

    assert options["read_only"] is True
    # exec spelt out: docker's tmpfs is noexec unless told.
    assert options["tmpfs"] == {
        "/tmp": f"rw,exec,nosuid,nodev,size={512 * 2**20},mode=1777",
        "/run": f"rw,exec,nosuid,nodev,size={64 * 2**20},mode=1777",
    }
    assert "read_only" not in writable and "tmpfs" not in writable


async def test_podman_says_the_same_with_tmpfs_mounts_and_none_of_its_own() -> None:
    runtime = adapter("podman")
    options = runtime.create_options(READ_ONLY)
    await runtime.close()

    assert (options["read_only"], options["read_write_tmpfs"]) == (True, False)
    tmpfs = [mount for mount in options["mounts"] if mount["type"] == "tmpfs"]
    assert tmpfs == [
        {"type": "tmpfs", "source": "tmpfs", "target": "/tmp", "size": str(512 * 2**20),
         "mode": "1777"},
        {"type": "tmpfs", "source": "tmpfs", "target": "/run", "size": str(64 * 2**20),
         "mode": "1777"},
    ]  # fmt: skip


@pytest.mark.parametrize("kind", ["docker", "podman"])
@pytest.mark.parametrize(
    ("driver", "form"), [("cgroupfs", "/tuneplane-jobs"), ("systemd", "tuneplane-jobs.slice")]
)
async def test_every_job_is_created_under_the_parent_in_the_drivers_form(
    kind: str, driver: str, form: str
) -> None:
    runtime = adapter(kind)
    runtime.jobs_parent.parent = JobParent("tuneplane-jobs", driver=driver, unified=False)
    options = runtime.create_options(SPEC)
    await runtime.close()
    assert options["cgroup_parent"] == form


async def test_docker_rotates_the_log_and_sets_no_new_privileges() -> None:
    runtime = adapter("docker")
    options = runtime.create_options(replace(SPEC, confinement=Confinement(log_max_files=2)))
    await runtime.close()

    assert options["security_opt"] == ["no-new-privileges"]
    assert options["log_config"] == {
        "Type": "json-file",
        "Config": {"max-size": str(10 * 2**20), "max-file": "2"},
    }


async def test_podman_bounds_the_log_and_refuses_user_namespaces(tmp_path: Path) -> None:
    runtime = adapter("podman", node_state_dir=tmp_path)
    options = runtime.create_options(SPEC)
    await runtime.close()

    assert options["no_new_privileges"] is True
    assert options["log_config"] == {"Type": "k8s-file", "Config": {"size": 50 * 2**20}}
    if Path("/usr/share/containers/seccomp.json").is_file():
        assert options["seccomp_profile_path"] == str(tmp_path / "seccomp-podman.json")


async def test_a_remote_podman_keeps_its_own_seccomp_profile(tmp_path: Path) -> None:
    runtime = adapter("podman", podman_url="tcp://10.0.0.1:8888", node_state_dir=tmp_path)
    options = runtime.create_options(SPEC)
    await runtime.close()

    assert "seccomp_profile_path" not in options and not list(tmp_path.iterdir())


# --- an engine that is not there ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["docker", "podman"])
async def test_an_unreachable_engine_is_unavailable_never_gone(kind: str, tmp_path: Path) -> None:
    address = f"unix://{tmp_path}/no-engine.sock"
    runtime = adapter(kind, docker_host=address, podman_url=address)
    try:
        for call in (runtime.ps(), runtime.inspect("x"), runtime.kill("x", "SIGTERM")):
            with pytest.raises(EngineUnavailable):
                await call
        health = await runtime.health()
    finally:
        await runtime.close()

    assert not health.ok
    assert "unreachable" in (health.error or "")


def test_every_engine_error_is_a_node_error() -> None:
    assert issubclass(EngineError, NodeError)
    assert EngineUnavailable(engine="e", reason="r").status == 503


# --- reading logs: lines, not the engine's pieces --------------------------------------------


class ScriptedLogs(DockerRuntime):
    """The docker adapter over a scripted log: entries as docker's API gives them."""

    def __init__(self, lines: list[bytes]) -> None:
        super().__init__(engine_settings("docker"))
        self.stream = [
            b"2026-11-30T12:00:00Z " + line[i : i + 16]
            for line in lines
            for i in range(0, len(line), 16)
        ]
        self.asked: list[int] = []

    def _log_entries(self, ref: str, tail: int, since: Any) -> Any:
        self.asked.append(tail)
        return iter(self.stream[-tail:])


async def test_tail_counts_lines_however_many_pieces_they_took() -> None:
    runtime = ScriptedLogs([b"x" * 100 + b"\n", b"short\n", b"y" * 100 + b"\n", b"z" * 60 + b"\n"])
    text = await runtime.logs("a", LogQuery(tail=2, max_bytes=10_000))
    await runtime.close()

    assert text is not None
    assert [line.split(" ", 1)[1] for line in text.text.splitlines()] == ["y" * 100, "z" * 60]
    assert runtime.asked == [3, 24]  # one more entry than lines, then eight times as many


async def test_a_tail_longer_than_the_log_reads_it_once_whole() -> None:
    runtime = ScriptedLogs([b"one\n", b"two\n"])
    text = await runtime.logs("a", LogQuery(tail=10, max_bytes=10_000))
    await runtime.close()
    assert text is not None and text.text.count("\n") == 2 and runtime.asked == [11]


class RacedRemove:
    """libpod's API as a job ending during a forced remove meets it: the first DELETE
    answers 500 "container state improper", the next removes it."""

    def __init__(self) -> None:
        self.deletes = 0

    def delete(self, path: str, params: Any) -> requests.Response:
        if path.startswith("/networks/"):
            return http_response(404)  # the job had no network of its own
        self.deletes += 1
        if self.deletes > 1:
            return http_response(204)
        response = http_response(500)
        response._content = (
            b'{"cause": "container state improper", "message": "cannot remove container'
            b' as it could not be stopped: container state improper: stopped"}'
        )
        return response

    def get(self, path: str, params: Any = None) -> requests.Response:
        response = http_response(200)  # still there
        if path == "/networks/json":
            response._content = b"[]"  # no job network to prune
        return response


def podman_over(api: Any, monkeypatch: pytest.MonkeyPatch) -> EngineRuntime:
    """The podman adapter over a scripted libpod API."""
    monkeypatch.setattr(PodmanRuntime, "api", property(lambda self: api))
    return adapter("podman")


def test_a_podman_remove_that_raced_the_jobs_end_is_tried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = RacedRemove()
    runtime = podman_over(api, monkeypatch)
    runtime._remove("tuneplane-job-1")  # no error: the second try removed it
    assert api.deletes == 2


class RefusedStreams:
    """An engine answering every streamed request 500, with a body."""

    def __init__(self) -> None:
        self.answers: list[requests.Response] = []
        self.headers: list[Mapping[str, str]] = []

    def get(self, path: str, **options: Any) -> requests.Response:
        response = http_response(500)
        response.raw = io.BytesIO(b'{"message": "no"}')
        self.answers.append(response)
        self.headers.append(options.get("headers") or {})
        return response

    post = get


def test_a_refused_stream_is_closed_by_the_thread_that_opened_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = RefusedStreams()
    runtime = podman_over(api, monkeypatch)
    for open_stream in (
        lambda: runtime._open_follow("x", {}),
        lambda: runtime._open_pull("reg/x:1", {}),
        runtime._open_events,
    ):
        with pytest.raises(requests.HTTPError):
            open_stream()
    assert len(api.answers) == 3
    assert all(answer.raw.closed for answer in api.answers)  # its connection given back
    # The engine closes a stream's connection after it: the socket a cancel shuts down
    # is never one the pool hands to another call.
    assert all(sent.get("Connection") == "close" for sent in api.headers)


def test_docker_streams_ask_the_engine_to_close_their_connection_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime, api = adapter("docker"), RefusedStreams()
    monkeypatch.setattr(DockerRuntime, "api", property(lambda self: api))
    api._url = lambda path, *args: path  # type: ignore[attr-defined]  # docker-py's helpers
    api._get, api._post = api.get, api.post  # type: ignore[attr-defined]
    api._raise_for_status = requests.Response.raise_for_status  # type: ignore[attr-defined]
    for open_stream in (
        lambda: runtime._open_follow("x", {}),
        lambda: runtime._open_pull("reg/x:1", {"X-Registry-Auth": "e30="}),
    ):
        with pytest.raises(requests.HTTPError):
            open_stream()
    assert [sent.get("Connection") for sent in api.headers] == ["close", "close"]
    assert api.headers[1]["X-Registry-Auth"] == "e30="  # the pull's own credentials kept


class RefusedKills:
    """An adapter whose engine answers every kill with a refusal saying ``words``."""

    words = ""
    module: Any

    def _kill(self, ref: str, signal: str) -> None:
        status = 409 if "is not running" in self.words else 500
        raise self.module.errors.APIError(
            f"{status} Server Error", response=http_response(status), explanation=self.words
        )


class DockerRefusingKills(RefusedKills, DockerRuntime):
    module = docker


class PodmanRefusingKills(RefusedKills, PodmanRuntime):
    module = podman


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("docker", "Cannot kill container: tuneplane-a: Container 3f2a is not running"),
        ("podman", "can only kill running containers. 3f2a is in state exited: "
                   "container state improper"),
        # Issue 52: the job ended between libpod's look at its state and the runtime's
        # kill. A stop with timeout 0 answered 502 on it.
        ("podman", "container state improper: stopped"),
    ],
)  # fmt: skip
async def test_a_kill_that_meets_a_job_already_ended_sent_nothing_and_is_no_error(
    kind: str, words: str
) -> None:
    settings = engine_settings(kind)
    runtime = DockerRefusingKills(settings) if kind == "docker" else PodmanRefusingKills(settings)
    try:
        runtime.words = words
        assert await runtime.kill("tuneplane-a", "SIGKILL") is False
        runtime.words = "permission denied"  # any other refusal is one
        with pytest.raises(EngineRefused, match="permission denied"):
            await runtime.kill("tuneplane-a", "SIGKILL")
    finally:
        await runtime.close()


# --- the node's job networks (TUNEPLANE_JOB_NETWORK) -------------------------------------------


@pytest.mark.parametrize(
    ("network", "mode"),
    [("isolated", "tuneplane-jobs"), ("sealed", "tuneplane-jobs-sealed"), ("bridge", "bridge")],
)
def test_docker_puts_a_job_on_the_nodes_network_of_its_kind(network: str, mode: str) -> None:
    options = adapter("docker").create_options(replace(SPEC, network=network))
    assert options["network_mode"] == mode


@pytest.mark.parametrize("network", ["isolated", "sealed"])
def test_podman_puts_a_job_on_a_network_of_its_own(network: str) -> None:
    options = adapter("podman").create_options(replace(SPEC, network=network))
    assert options["network_mode"] == "bridge"
    assert options["networks"] == {f"tuneplane-jobs-{SPEC.name}": {}}
    bridged = adapter("podman").create_options(replace(SPEC, network="bridge"))
    assert bridged["network_mode"] == "bridge" and "networks" not in bridged


NODE_MADE = {
    "Labels": {"tuneplane.node-network": "isolated"},
    "Options": {"com.docker.network.bridge.enable_icc": "false"},
    "Internal": False,
}


@pytest.mark.parametrize(
    ("found", "why"),
    [
        ({**NODE_MADE, "Labels": {}}, "it is not the node's"),
        ({**NODE_MADE, "Labels": {"tuneplane.node-network": "sealed"}}, "it is not the node's"),
        ({**NODE_MADE, "Options": {}}, "it lets containers reach each other"),
        ({**NODE_MADE, "Internal": True}, "it is internal"),
    ],
)
def test_a_network_of_the_nodes_name_that_is_not_as_the_node_makes_it_is_refused(
    found: dict[str, Any], why: str
) -> None:
    with pytest.raises(EngineRefused) as refused:
        checked("docker", "tuneplane-jobs", "isolated", found)
    assert refused.value.status == 502 and refused.value.code == "engine_refused"
    assert f"network tuneplane-jobs exists and {why}" in refused.value.message
    checked("docker", "tuneplane-jobs", "isolated", NODE_MADE)  # the node's own: used


# --- a connection that broke before the engine answered --------------------------------------


def broken_connection(module: Any, inner: BaseException) -> Exception:
    """What each SDK raises when the connection it took from its pool broke before an
    answer: requests' ``ConnectionError`` (the CI flake said ``('Connection aborted.',
    ResponseNotReady())``), which podman-py wraps in an APIError without a response."""
    error = requests.exceptions.ConnectionError(ProtocolError("Connection aborted.", inner))
    if module is docker:
        return error
    wrapped = podman.errors.APIError("http://d/v4/info", explanation="GET operation failed")
    wrapped.__cause__ = error
    return wrapped


class BrokenOnce:
    """An adapter whose engine breaks the connection of its first ``failures`` calls of
    each kind before answering; what each verb asked is counted."""

    module: Any
    failures = 1
    inner: BaseException = http.client.ResponseNotReady()

    def __init__(self, settings: Any) -> None:
        super().__init__(settings)  # type: ignore[call-arg]
        self.asked: list[str] = []

    def _answer(self, call: str) -> None:
        self.asked.append(call)
        if self.asked.count(call) <= self.failures:
            raise broken_connection(self.module, self.inner)

    def _version(self) -> str:
        self._answer("version")
        return "4.3.1"

    def _list_brief(self) -> list[Any]:
        self._answer("list")
        return []

    def _remove(self, name: str) -> None:
        self._answer("remove")

    def _kill(self, ref: str, signal: str) -> None:
        self._answer("kill")


class DockerBrokenOnce(BrokenOnce, DockerRuntime):
    module = docker


class PodmanBrokenOnce(BrokenOnce, PodmanRuntime):
    module = podman


def broken_once(kind: str) -> DockerBrokenOnce | PodmanBrokenOnce:
    settings = engine_settings(kind)
    return DockerBrokenOnce(settings) if kind == "docker" else PodmanBrokenOnce(settings)


@pytest.mark.parametrize("kind", ["docker", "podman"])
@pytest.mark.parametrize(
    "inner",
    [
        http.client.ResponseNotReady(),
        http.client.RemoteDisconnected("Remote end closed connection without response"),
        ConnectionResetError(104, "Connection reset by peer"),
        BrokenPipeError(32, "Broken pipe"),
    ],
    ids=["not-ready", "remote-disconnected", "reset", "broken-pipe"],
)
async def test_a_read_whose_connection_broke_before_an_answer_is_asked_once_more(
    kind: str, inner: BaseException, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(BrokenOnce, "inner", inner)
    runtime = broken_once(kind)
    try:
        health = await runtime.health()
        listed = await runtime.ps()
    finally:
        await runtime.close()

    assert health.ok and health.version == "4.3.1"
    assert listed == []
    assert runtime.asked == ["version", "version", "list", "list"]


@pytest.mark.parametrize("kind", ["docker", "podman"])
async def test_a_read_broken_twice_is_unavailable(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(BrokenOnce, "failures", 2)
    runtime = broken_once(kind)
    try:
        with pytest.raises(EngineUnavailable):
            await runtime.ps()
    finally:
        await runtime.close()
    assert runtime.asked == ["list", "list"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["docker", "podman"])
async def test_a_write_whose_connection_broke_is_unavailable_and_never_asked_again(
    kind: str,
) -> None:
    """The engine may have done it: a kill sent twice is two signals."""
    runtime = broken_once(kind)
    try:
        for write in (runtime.remove("tuneplane-a"), runtime.kill("tuneplane-a", "SIGTERM")):
            with pytest.raises(EngineUnavailable, match="Connection aborted"):
                await write
    finally:
        await runtime.close()
    assert runtime.asked == ["remove", "kill"]


class DockerCounted(DockerRuntime):
    asked = 0

    def _version(self) -> str:
        self.asked += 1
        return super()._version()


class PodmanCounted(PodmanRuntime):
    asked = 0

    def _version(self) -> str:
        self.asked += 1
        return super()._version()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["docker", "podman"])
async def test_an_engine_that_is_down_is_asked_once_and_said_at_once(
    kind: str, tmp_path: Path
) -> None:
    address = f"unix://{tmp_path}/no-engine.sock"
    settings = engine_settings(kind, docker_host=address, podman_url=address)
    runtime: DockerCounted | PodmanCounted
    runtime = DockerCounted(settings) if kind == "docker" else PodmanCounted(settings)
    try:
        health = await runtime.health()
    finally:
        await runtime.close()
    assert not health.ok and "unreachable" in (health.error or "")
    assert runtime.asked == 1
