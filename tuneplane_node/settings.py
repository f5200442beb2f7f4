"""NodeSettings: what this machine itself must answer, read from ``TUNEPLANE_*`` and `.env`.

Everything about jobs comes from the console; settings hold only facts about the node.
Every field is documented in the README (a test keeps the two in step).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from tuneplane_node.errors import ConfigError

ENV_PREFIX = "TUNEPLANE_"
DEFAULT_STORAGE = Path(".tuneplane-data/storage")


class Fabric(BaseModel):
    """An InfiniBand fabric as the operator names it, with the HCAs attached to it."""

    name: str = Field(min_length=1)
    hcas: list[str] = Field(min_length=1)


class NodeSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_ignore_empty=True,
        extra="ignore",
        populate_by_name=True,
        validate_default=True,
    )

    node_token: SecretStr | None = None
    """Bearer token the console must send. Without one the daemon refuses to start.
    A SecretStr: it prints as ********** in any log or error."""
    node_host: str = "0.0.0.0"
    """Address the API listens on."""
    node_port: int = Field(8470, ge=1, le=65535)
    """TCP port the API listens on."""
    node_state_dir: Path = Path("~/.tuneplane-node")
    """Directory for the node's own state (its node id, process-runtime job files)."""

    local_runtime: Literal["auto", "docker", "podman", "process"] = "auto"
    """Container runtime: auto tries docker then podman; process is for development only."""
    docker_host: str | None = None
    """Docker engine address; unset means the docker SDK's own rules (DOCKER_HOST)."""
    podman_url: str = "unix:///run/podman/podman.sock"
    """Address of the podman API service."""
    runtime_threads: int = Field(16, ge=1, le=256)
    """Size of the one thread pool that runs blocking engine calls (and its HTTP pool)."""
    local_api_timeout: float = Field(
        60.0,
        gt=0,
        validation_alias=AliasChoices("TUNEPLANE_LOCAL_API_TIMEOUT", "TUNEPLANE_LOCAL_CLI_TIMEOUT"),
    )
    """Seconds one engine call may take. TUNEPLANE_LOCAL_CLI_TIMEOUT is the old name."""
    local_stop_timeout: float = Field(30.0, ge=0)
    """Seconds between SIGTERM and SIGKILL when a job is stopped without a timeout."""
    local_container_ttl_s: float = Field(86400.0, ge=0)
    """Seconds an exited (or never-started) job container is kept before reap removes it."""
    local_image_pull_timeout_s: float = Field(3600.0, gt=0)
    """Seconds an image pull may take in all."""
    local_image_pull_stall_s: float = Field(300.0, gt=0)
    """Seconds an image pull may go without progress before it is abandoned."""
    local_gpu_passthrough: bool = True
    """Hand the allocated GPUs to the container (false: label only, no device)."""
    local_gpu_count: int | None = Field(None, ge=0)
    """Number of GPUs; overrides what the driver reports (unset: ask the driver)."""
    local_check_gpu_health: bool = True
    """Keep cards with ECC, XID or lost-card faults out of allocation."""
    local_check_external_gpus: bool = True
    """Keep cards used by processes outside the node's containers out of allocation."""
    cluster_profile: str = ""
    """Hardware series the operator declares for this node, reported as-is (lower-cased)."""
    storage_root: Path | None = None
    """Directory shared with jobs for checkpoints and data (unset: ./.tuneplane-data/storage)."""
    model_dirs: list[Path] = []
    """Other directories where weights and datasets live (JSON list), for inventory."""
    fabrics: list[Fabric] = []
    """InfiniBand fabrics, JSON list of {"name", "hcas"}: the operator names them."""

    gpu_simulation_file: Path | None = None
    """Development aid: a JSON file read instead of the GPU driver (see README)."""
    gpu_xid_ignore: list[int] = [13, 31, 43, 45, 68, 109]
    """XID codes caused by the application itself, which do not make a card unhealthy."""
    gpu_xid_quarantine_s: float = Field(600.0, ge=0)
    """Seconds a card stays out after a critical XID before it may come back."""
    state_relist_s: float = Field(30.0, gt=0)
    """Seconds between full relists that reconcile the container-state cache."""

    @property
    def storage(self) -> Path:
        return self.storage_root if self.storage_root is not None else DEFAULT_STORAGE

    @property
    def state_dir(self) -> Path:
        return self.node_state_dir.expanduser()


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def load_settings(**overrides: object) -> NodeSettings:
    """Read the settings; a bad value is a ConfigError naming the variable, not a traceback."""
    try:
        return NodeSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise ConfigError(describe_validation(exc)) from exc
    except SettingsError as exc:  # a list setting that is not JSON
        raise ConfigError(describe_settings_error(exc)) from exc


def describe_validation(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else "?"
        name = field if field.startswith(ENV_PREFIX) else env_name(field)
        inner = ".".join(str(part) for part in error["loc"][1:])
        where = f"{name} ({inner})" if inner else name
        problems.append(f"{where}: {error['msg']} (got {error.get('input')!r})")
    return "invalid settings: " + "; ".join(problems)


def describe_settings_error(exc: SettingsError) -> str:
    """pydantic-settings says 'error parsing value for field "fabrics"': name the variable."""
    match = re.search(r'field "(\w+)"', str(exc))
    name = env_name(match.group(1)) if match else "a TUNEPLANE_ setting"
    return (
        f"invalid settings: {name}: not valid JSON (lists are given as JSON, e.g. '[\"/models\"]')"
    )
