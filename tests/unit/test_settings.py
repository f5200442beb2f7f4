"""NodeSettings as an operator meets them: variables, `.env`, defaults, errors, the docs."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tuneplane_node.errors import ConfigError
from tuneplane_node.settings import Fabric, NodeSettings, env_name, load_settings

OPERATING = Path(__file__).resolve().parents[2] / "docs" / "operating.md"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No TUNEPLANE_* from the caller's shell, and no stray .env: only what a test sets."""
    for name in list(os.environ):
        if name.upper().startswith("TUNEPLANE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_defaults_are_the_documented_ones() -> None:
    settings = load_settings()
    assert settings.node_token is None
    assert (settings.node_host, settings.node_port) == ("0.0.0.0", 8470)
    assert settings.state_dir == Path("~/.tuneplane-node").expanduser()
    assert settings.local_runtime == "auto"
    assert settings.docker_host is None  # the docker SDK's own rules (DOCKER_HOST)
    assert settings.podman_url == "unix:///run/podman/podman.sock"
    assert settings.runtime_threads == 16
    assert settings.local_api_timeout == 60
    assert settings.local_stop_timeout == 30
    assert settings.local_container_ttl_s == 86400
    assert settings.local_image_pull_timeout_s == 3600
    assert settings.local_image_pull_stall_s == 300
    assert settings.local_gpu_passthrough is True
    assert settings.local_gpu_count is None  # ask the driver
    assert settings.storage == Path(".tuneplane-data/storage")
    assert (settings.model_dirs, settings.fabrics) == ([], [])
    assert settings.gpu_simulation_file is None
    assert settings.gpu_xid_ignore == []
    assert settings.gpu_xid_job == [13, 31, 43, 45, 68, 94]
    assert (settings.gpu_xid_card, settings.gpu_xid_node) == (
        [48, 63, 64, 74, 95, 109, 119, 120],
        [79],
    )
    assert (settings.gpu_breaker_per_hour, settings.gpu_fault_poll_s) == (4, 2)
    assert settings.gpu_xid_quarantine_s == 600


def test_variables_are_read_with_the_tuneplane_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEPLANE_NODE_PORT", "9001")
    monkeypatch.setenv("TUNEPLANE_LOCAL_RUNTIME", "podman")
    monkeypatch.setenv("TUNEPLANE_LOCAL_GPU_PASSTHROUGH", "false")
    monkeypatch.setenv("TUNEPLANE_LOCAL_GPU_COUNT", "2")
    monkeypatch.setenv("TUNEPLANE_STORAGE_ROOT", "/srv/tuneplane")
    monkeypatch.setenv("NODE_HOST", "10.9.9.9")  # no prefix: not ours, ignored
    settings = load_settings()
    assert settings.node_port == 9001
    assert settings.local_runtime == "podman"
    assert settings.local_gpu_passthrough is False
    assert settings.local_gpu_count == 2
    assert settings.storage == Path("/srv/tuneplane")
    assert settings.node_host == "0.0.0.0"


def test_old_cli_timeout_name_still_sets_the_api_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEPLANE_LOCAL_CLI_TIMEOUT", "7")
    assert load_settings().local_api_timeout == 7
    monkeypatch.setenv("TUNEPLANE_LOCAL_API_TIMEOUT", "5")  # the new name wins
    assert load_settings().local_api_timeout == 5


def test_empty_values_count_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEPLANE_NODE_PORT", "")
    monkeypatch.setenv("TUNEPLANE_LOCAL_GPU_COUNT", "")
    monkeypatch.setenv("TUNEPLANE_RUNTIME_THREADS", "")
    settings = load_settings()
    assert (settings.node_port, settings.local_gpu_count, settings.runtime_threads) == (
        8470,
        None,
        16,
    )


def test_dotenv_in_the_working_directory_is_read(
    monkeypatch: pytest.MonkeyPatch, clean_environment: Path
) -> None:
    (clean_environment / ".env").write_text(
        "TUNEPLANE_NODE_TOKEN=from-dotenv\nTUNEPLANE_NODE_PORT=9100\nTUNEPLANE_CLUSTER_PROFILE=\n"
    )
    settings = load_settings()
    assert settings.node_token is not None
    assert settings.node_token.get_secret_value() == "from-dotenv"
    assert settings.node_port == 9100
    assert settings.cluster_profile == ""
    monkeypatch.setenv("TUNEPLANE_NODE_PORT", "9200")  # the environment wins over .env
    assert load_settings().node_port == 9200


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TUNEPLANE_RUNTIME_THREADS", "many"),
        ("TUNEPLANE_RUNTIME_THREADS", "0"),
        ("TUNEPLANE_NODE_PORT", "70000"),
        ("TUNEPLANE_LOCAL_RUNTIME", "kubernetes"),
        ("TUNEPLANE_LOCAL_GPU_PASSTHROUGH", "maybe"),
        ("TUNEPLANE_LOCAL_API_TIMEOUT", "soon"),
        ("TUNEPLANE_LOCAL_IMAGE_PULL_STALL_S", "-1"),
        ("TUNEPLANE_FABRICS", '[{"name": "ib-a"}]'),
    ],
)
def test_a_bad_value_is_a_config_error_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = caught.value.message
    assert variable in message
    assert "Traceback" not in message
    assert "\n" not in message  # one line an operator can read in a journal


def test_a_bad_value_under_the_old_timeout_name_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TUNEPLANE_LOCAL_CLI_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match=r"TUNEPLANE_LOCAL_(API|CLI)_TIMEOUT"):
        load_settings()


def test_a_list_setting_that_is_not_json_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TUNEPLANE_MODEL_DIRS", "/models")
    with pytest.raises(ConfigError, match="TUNEPLANE_MODEL_DIRS"):
        load_settings()


def test_an_unprefixed_variable_never_sets_the_api_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LOCAL_API_TIMEOUT", "9")
    assert load_settings().local_api_timeout == 60


def test_list_settings_are_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEPLANE_MODEL_DIRS", '["/models", "/datasets"]')
    monkeypatch.setenv("TUNEPLANE_FABRICS", '[{"name": "ib-a", "hcas": ["mlx5_0", "mlx5_1"]}]')
    monkeypatch.setenv("TUNEPLANE_GPU_XID_IGNORE", "[13, 43]")
    settings = load_settings()
    assert settings.model_dirs == [Path("/models"), Path("/datasets")]
    assert settings.fabrics == [Fabric(name="ib-a", hcas=["mlx5_0", "mlx5_1"])]
    assert settings.gpu_xid_ignore == [13, 43]


# --- the operator's docs keep up with the settings -------------------------------


def settings_section() -> str:
    """docs/operating.md's "## Settings" section, up to the next section."""
    text = OPERATING.read_text()
    start = text.index("\n## Settings\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def documented_settings() -> set[str]:
    """The variables named in the first column of the operator's settings table."""
    rows = re.findall(r"^\|\s*`(TUNEPLANE_[A-Z0-9_]+)`", settings_section(), re.MULTILINE)
    return set(rows)


def test_every_setting_is_in_the_settings_table() -> None:
    documented = documented_settings()
    missing = [env_name(field) for field in NodeSettings.model_fields]
    missing = [name for name in missing if name not in documented]
    assert not missing, f"docs/operating.md's settings table lacks {missing}"


def test_the_settings_table_documents_no_setting_that_does_not_exist() -> None:
    real = {env_name(field) for field in NodeSettings.model_fields}
    stale = sorted(documented_settings() - real)
    assert not stale, f"docs/operating.md documents settings that do not exist: {stale}"


def test_the_settings_table_names_the_old_timeout_variable() -> None:
    assert "TUNEPLANE_LOCAL_CLI_TIMEOUT" in settings_section()


# --- settings that would start a broken node are refused at start ----------------------


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("TUNEPLANE_LOCAL_API_TIMEOUT", "inf", "finite"),
        ("TUNEPLANE_LOCAL_STOP_TIMEOUT", "inf", "finite"),
        ("TUNEPLANE_LOCAL_STOP_TIMEOUT", "1e9", "less than or equal"),
        ("TUNEPLANE_STATE_RELIST_S", "nan", "finite"),
        ("TUNEPLANE_DOCKER_HOST", "bogus://x", "unix://"),
        ("TUNEPLANE_PODMAN_URL", "ftp://x", "unix://"),
        ("TUNEPLANE_HEADER_TIMEOUT_S", "0", "greater than 0"),
        ("TUNEPLANE_ALLOWED_MOUNT_ROOTS", '["/"]', "may never mount"),
        ("TUNEPLANE_ALLOWED_MOUNT_ROOTS", '["/var"]', "/var/run"),
        ("TUNEPLANE_ALLOWED_MOUNT_ROOTS", '["/proc/1"]', "/proc"),
        ("TUNEPLANE_TLS_CERT_FILE", "/etc/ssl/x.pem", "go together"),
        ("TUNEPLANE_JOB_CGROUP_PARENT", "/jobs", "should match pattern"),
        ("TUNEPLANE_JOB_CGROUP_PARENT", "jobs.slice", "should match pattern"),
        ("TUNEPLANE_JOB_CGROUP_PARENT", "a--b", "should match pattern"),
        ("TUNEPLANE_SYSTEM_RESERVED_PIDS", "-1", "greater than or equal to 0"),
        ("TUNEPLANE_VOLUME_INSECURE_HOSTS", '["mirror.lan"]', "is not host:port"),
        ("TUNEPLANE_VOLUME_INSECURE_HOSTS", '["mirror.lan:0"]', "is not host:port"),
        ("TUNEPLANE_VOLUME_FILLS", "0", "greater than or equal to 1"),
    ],
)
def test_a_setting_that_would_break_the_node_stops_its_start(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, says: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as refused:
        load_settings()
    message = refused.value.message
    assert variable in message and says in message
    assert "\n" not in message


@pytest.mark.parametrize("token", ["change-me ", " change-me", "two words", "tab\there", "ünïcode"])
def test_a_token_a_header_would_not_carry_intact_is_refused_unrepeated(
    monkeypatch: pytest.MonkeyPatch, token: str
) -> None:
    monkeypatch.setenv("TUNEPLANE_NODE_TOKEN", token)
    with pytest.raises(ConfigError) as refused:
        load_settings()
    assert refused.value.message == (
        "invalid settings: TUNEPLANE_NODE_TOKEN: must be printable ASCII without spaces"
    )


def test_the_default_mount_roots_are_the_storage_root_and_the_model_dirs(tmp_path: Path) -> None:
    settings = load_settings(storage_root=tmp_path / "s", model_dirs=[tmp_path / "m"])
    assert settings.mount_roots == [(tmp_path / "s").resolve(), (tmp_path / "m").resolve()]
    assert load_settings(allowed_mount_roots=[tmp_path]).mount_roots == [tmp_path.resolve()]


def test_the_volume_store_may_not_be_a_mount_root_nor_lie_in_one(tmp_path: Path) -> None:
    """A job that could mount the store could read every tenant's weights and rewrite
    what other jobs are handed; it sees its entries only through its own read-only binds."""
    with pytest.raises(ConfigError, match="TUNEPLANE_VOLUME_ROOT"):
        load_settings(storage_root=tmp_path, volume_root=tmp_path / "volumes")
    default = load_settings(storage_root=tmp_path / "s", node_state_dir=tmp_path / "state")
    assert default.volume_dir == tmp_path / "state" / "volumes"


def test_an_engine_socket_named_only_by_docker_host_is_never_a_mount_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's address has one meaning: the socket the docker SDK is pointed at by
    DOCKER_HOST alone is the engine's as much as one in TUNEPLANE_DOCKER_HOST, and a job
    that mounted it would command the engine."""
    engine = tmp_path / "engines" / "docker.sock"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{engine}")
    settings = load_settings(storage_root=tmp_path / "data")
    assert settings.engine_address("docker") == f"unix://{engine}"
    assert settings.never_a_root(tmp_path / "engines") == engine.resolve()
    assert settings.engine_address("process") == ""
    with pytest.raises(ConfigError, match=r"docker\.sock, which a job may never mount"):
        load_settings(storage_root=tmp_path)
