"""`NodeSettings`: every setting of the node, its views' included, and the rules across
them (pairs that go together, thresholds in order, mount roots clear of the host's and
the node's own files); `load_settings`, which says a bad one as a `ConfigError`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import SettingsConfigDict, SettingsError

from tuneplane_node.errors import ConfigError
from tuneplane_node.settings.fabric import Fabric
from tuneplane_node.settings.gpus import GpuSettings
from tuneplane_node.settings.images import ImageStoreSettings
from tuneplane_node.settings.jobs import JobSettings
from tuneplane_node.settings.notices import NoticeSettings
from tuneplane_node.settings.problems import describe_settings_error, describe_validation
from tuneplane_node.settings.values import (
    DAY,
    DOCKER_DEFAULT,
    DOCKER_SCHEMES,
    ENV_PREFIX,
    PODMAN_SCHEMES,
    TOKEN_PATTERN,
    absolute,
    checked_address,
    env_name,
    unix_socket,
)
from tuneplane_node.settings.views import (
    ImageSettings,
    LifecycleSettings,
    ObserveSettings,
    VolumeSettings,
    made_from,
)
from tuneplane_node.settings.volumes import VolumeStoreSettings
from tuneplane_node.signals import JOB_SIGNALS, job_signal
from tuneplane_node.sizes import MAX_SIZE, size_in_bytes

DEFAULT_STORAGE = Path(".tuneplane-data/storage")
# Never mountable into a job, nor inside a root that holds one of them: the host itself.
NEVER_MOUNTED = tuple(
    Path(p)
    for p in (
        "/", "/proc", "/sys", "/dev", "/etc", "/boot", "/run", "/var/run",
        "/var/lib/docker", "/var/lib/containers", "/run/docker.sock", "/run/podman",
    )
)  # fmt: skip
# A root may not even lie inside these: /proc/1/root is the host's whole filesystem.
NEVER_UNDER = tuple(Path(p) for p in ("/proc", "/sys", "/dev", "/etc", "/boot"))


class NodeSettings(
    GpuSettings, NoticeSettings, ImageStoreSettings, VolumeStoreSettings, JobSettings
):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_file=".env",
        env_ignore_empty=True,
        extra="ignore",
        populate_by_name=True,
        validate_default=True,
    )

    node_token: SecretStr | None = None
    """Bearer token the console must send. Without one (or a token file) the daemon
    refuses to start. A SecretStr: it prints as ********** in any log or error."""
    node_token_file: Path | None = None
    """A file of tokens, one per line (blank lines and # comments ignored); every listed
    token is accepted, and the file is read again when it changes and on SIGHUP."""
    header_timeout_s: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False)
    """Seconds a connection may take to send a request's headers, and may stay idle
    between requests, before the node closes it."""
    tls_cert_file: Path | None = None
    """PEM certificate chain: with the key, the API is served over HTTPS only (TLS 1.2+)."""
    tls_key_file: Path | None = None
    """PEM private key of the certificate."""
    tls_client_ca_file: Path | None = None
    """PEM CA: clients must present a certificate it signed (mutual TLS), on every path
    but /healthz."""
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
    dev_shared_engine: bool = False
    """Development only: let ``serve`` start beside another daemon of this machine on the
    same engine (a test suite's daemons). Off, the second one refuses to start: two
    daemons on one engine hand out the same cards and sweep each other's launches."""
    runtime_threads: int = Field(16, ge=1, le=256)
    """Size of the one thread pool that runs blocking engine calls (and its HTTP pool)."""
    local_api_timeout: float = Field(
        60.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        validation_alias=AliasChoices("TUNEPLANE_LOCAL_API_TIMEOUT", "TUNEPLANE_LOCAL_CLI_TIMEOUT"),
    )
    """Seconds one engine call may take. TUNEPLANE_LOCAL_CLI_TIMEOUT is the old name."""
    local_stop_timeout: float = Field(30.0, ge=0, le=30 * DAY, allow_inf_nan=False)
    """Seconds between SIGTERM and SIGKILL when a job is stopped without a timeout."""
    job_warn_signal: str | None = None
    """The signal every stop the node makes on its own (a card's fault, a cloud's notice, a
    drain without a warning of its own, disk pressure) warns a job with first, where its
    launch gave no ``container.warn_signal``; unset: no warning (the stop signal alone)."""
    job_warn_s: float = Field(30.0, ge=0, le=30 * DAY, allow_inf_nan=False)
    """Seconds from that warning to the stop signal, where the launch gave no
    ``container.warn_s`` (a notice whose deadline leaves less gives less)."""
    local_container_ttl_s: float = Field(DAY, ge=0, le=3650 * DAY, allow_inf_nan=False)
    """Seconds an exited (or never-started) job container is kept before reap removes it."""
    logs_max_bytes: int = Field(8 * 2**20, ge=1024, le=2**30)
    """Bytes a logs answer holds at most: the newest output; older is cut and said so."""
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
    allowed_mount_roots: list[Path] | None = None
    """Host directories a job's mounts may come from (JSON list); unset: the storage root
    and every model dir. None may be, or hold, the host's system directories."""
    scratch_root: Path | None = None
    """Directory of the jobs' scratch files (``container.scratch``: one sparse ext4 file
    per job, loop-mounted); unset: ``scratch`` in the state directory. Neither a mount
    root nor inside or holding one; one node's alone (its start removes the files no
    container of its engine names)."""
    fabrics: list[Fabric] = []
    """InfiniBand fabrics, JSON list of {"name", "hcas"}: the operator names them. An
    entry may add a fabric network ("interface", "network": ``macvlan`` or ``ipvlan``,
    "subnet", "range" inside it, optional "gateway"): a job asking for ``network: host``
    that is not given the host network (``TUNEPLANE_JOB_HOST_NETWORK``) runs there instead
    of the job network, with an address of its own from "range", written in its label
    ``tuneplane.fabric-address`` and never handed to another while its container exists,
    and ``NCCL_SOCKET_IFNAME`` (and ``NCCL_IB_GID_INDEX`` for RoCE) unless the console set
    them. At most one fabric has a network."""
    rdma: Literal["auto", "off", "all"] = "auto"
    """Which jobs get the machine's RDMA devices (with memlock unlimited, IPC_LOCK and
    NCCL_IB_HCA): ``auto`` a job holding at least one card, ``all`` every job, ``off``
    none."""
    rdma_memlock: str | int = "unlimited"
    """The locked-memory limit (soft and hard) of a job given RDMA devices: ``unlimited``
    (what verbs want: they pin every buffer they register), or a size where the engine
    may not raise the limit that far (a sandbox, a rootless engine)."""
    rdma_device_dir: Path = Path("/dev/infiniband")
    """Where the RDMA devices are: the character devices uverbs* and rdma_cm are handed
    to jobs (umad*, for management tools, never)."""

    cpu_affinity: Literal["numa", "off"] = "numa"
    """``numa``: a job holding cards is created confined to the CPUs and memory of its
    cards' NUMA nodes (when they have as many CPUs as its ``cpu_limit``), set at create
    only; ``off``: jobs run on every CPU."""

    gpu_simulation_file: Path | None = None
    """Development aid: a JSON file read instead of the GPU driver (docs/operating.md)."""
    state_relist_s: float = Field(30.0, gt=0, le=DAY, allow_inf_nan=False)
    """Seconds between full relists that reconcile the container-state cache."""
    watch_history: int = Field(10_000, ge=1, le=1_000_000)
    """Changes the change log behind ``GET /node/v1/jobs?index=`` keeps (each job's
    latest); a console's cursor older than them is answered with every job (``full``)."""
    watch_max: int = Field(64, ge=1, le=10_000)
    """Watch queries (``GET /node/v1/jobs?index=&wait=``) waiting at once; the next is a 429.
    A quarter of them (at least one) is kept for ``full`` tokens (the console's)."""

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Least severe log lines written (``--log-level`` overrides it). DEBUG adds one
    access line per request."""
    log_format: Literal["text", "json"] = "text"
    """``json``: one JSON object per line (time, level, logger, message, and run_id, ref,
    image, gpus where they apply), for a log shipper. ``--log-format`` overrides it."""
    metrics_public: bool = False
    """Serve ``GET /metrics`` without the bearer token (for a scraper that cannot send one)."""
    metrics_per_job: bool = False
    """Serve each running job's CPU, memory and card figures as series labelled by
    ``run_id`` (off: how many series a scrape carries is the operator's choice)."""
    stats_interval_s: float = Field(5.0, ge=1, le=3600, allow_inf_nan=False)
    """Seconds between two samples of the running jobs' CPU, memory and card figures;
    CPU use is the average over this period."""

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper_level(cls, level: object) -> object:
        return level.strip().upper() if isinstance(level, str) else level

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower_format(cls, fmt: object) -> object:
        return fmt.strip().lower() if isinstance(fmt, str) else fmt

    @field_validator("job_warn_signal")
    @classmethod
    def _a_job_signal(cls, name: str | None) -> str | None:
        if name is None or name == "":
            return None
        if (known := job_signal(name)) is None:
            raise ValueError(f"must be one of {', '.join(JOB_SIGNALS)}")
        return known

    @field_validator("node_token")
    @classmethod
    def _printable_token(cls, token: SecretStr | None) -> SecretStr | None:
        # A trailing space would start a node that refuses every request: HTTP strips it.
        if token is None or token.get_secret_value() == "":
            return None  # no token: the daemon refuses to start, saying so
        if not TOKEN_PATTERN.fullmatch(token.get_secret_value()):
            raise ValueError("must be printable ASCII without spaces")
        return token

    @field_validator("docker_host")
    @classmethod
    def _docker_scheme(cls, address: str | None) -> str | None:
        return address if address is None else checked_address(address, DOCKER_SCHEMES)

    @field_validator("podman_url")
    @classmethod
    def _podman_scheme(cls, address: str) -> str:
        return checked_address(address, PODMAN_SCHEMES)

    @field_validator("rdma_memlock")
    @classmethod
    def _unlimited_or_a_size(cls, size: str | int) -> str | int:
        if size == "unlimited":
            return size
        bytes_ = size_in_bytes(size)
        if bytes_ is None or not 0 < bytes_ <= MAX_SIZE:
            raise ValueError("must be unlimited, a size like 64g, or a number of bytes")
        return size

    @property
    def rdma_memlock_bytes(self) -> int | None:
        """The RDMA jobs' memlock in bytes; None for unlimited."""
        if self.rdma_memlock == "unlimited":
            return None
        return int(size_in_bytes(self.rdma_memlock) or 0)

    @property
    def fabric_network(self) -> Fabric | None:
        """The fabric whose network the spanning jobs run on, None when none has one."""
        return next((fabric for fabric in self.fabrics if fabric.has_network), None)

    @model_validator(mode="after")
    def _consistent(self) -> NodeSettings:
        """What no one value says: the pairs that go together, the thresholds in order,
        one fabric network, mount roots clear of what a job may never mount."""
        _tls_pair(self)
        _one_fabric_network(self)
        _below(self, "image_gc_low_percent", "image_gc_high_percent")
        _below(self, "inode_low_percent", "inode_high_percent")
        _below(self, "volume_gc_low_percent", "volume_gc_high_percent")
        _safe_mount_roots(self)
        return self

    def node_files(self) -> list[tuple[Path, str]]:
        """The node's own files, each with the setting that names it, which no job may
        mount nor a mount root hold: the token file and its directory, the TLS key and
        certificate, the registry auth file, the scratch root, the state directory (the
        staged mounts of every job are in it)."""
        files: list[tuple[Path, str]] = []
        if self.node_token_file is not None:
            token = absolute(self.node_token_file)
            setting = env_name("node_token_file")
            files += [(token, setting), (token.parent, f"the directory of {setting}")]
        for name in ("tls_key_file", "tls_cert_file", "registry_auth_file"):
            path = getattr(self, name)
            if path is not None:
                files.append((absolute(path), env_name(name)))
        if self.scratch_root is not None:  # else in the state directory
            files.append((absolute(self.scratch_root), env_name("scratch_root")))
        if self.volume_root is not None:  # else in the state directory
            files.append((absolute(self.volume_root), env_name("volume_root")))
        return [*files, (absolute(self.state_dir), env_name("node_state_dir"))]

    def never_a_root(self, root: Path) -> Path | None:
        """The path a job may never mount that ``root`` is, holds or lies in; None when
        ``root`` could be a mount root."""
        bad = [p for p in self._never_mounted() if p == root or p.is_relative_to(root)]
        bad += [p for p in NEVER_UNDER if root.is_relative_to(p)]
        return bad[0] if bad else None

    def _never_mounted(self) -> list[Path]:
        paths = [unix_socket(self.engine_address(engine)) for engine in ("docker", "podman")]
        return [*NEVER_MOUNTED, *(Path(path).resolve() for path in paths if path is not None)]

    def engine_address(self, engine: str) -> str:
        """An engine's address, one meaning wherever it is used (the SDK's client, the
        engine lock, its memlock, the sockets never mounted, ``check``): docker's setting,
        else ``DOCKER_HOST`` as the docker SDK reads it, else the SDK's default socket;
        podman's setting. The process runtime has none: ""."""
        if engine == "docker":
            return self.docker_host or os.environ.get("DOCKER_HOST") or DOCKER_DEFAULT
        return self.podman_url if engine == "podman" else ""

    @property
    def storage(self) -> Path:
        return self.storage_root if self.storage_root is not None else DEFAULT_STORAGE

    @property
    def state_dir(self) -> Path:
        return self.node_state_dir.expanduser()

    @property
    def scratch_dir(self) -> Path:
        """Where the jobs' scratch files are (`scratch_root`, else in the state dir)."""
        root = self.scratch_root
        return root.expanduser() if root is not None else self.state_dir / "scratch"

    @property
    def volume_dir(self) -> Path:
        """Where the volume store is (`volume_root`, else in the state dir)."""
        root = self.volume_root
        return root.expanduser() if root is not None else self.state_dir / "volumes"

    @property
    def mount_roots(self) -> list[Path]:
        """The directories a job's mounts may come from, absolute and resolved."""
        roots = self.allowed_mount_roots
        if roots is None:
            roots = [self.storage, *self.model_dirs]
        return [root.expanduser().resolve() for root in roots]

    # The views by concern (views.py), each made when read: never cached, since a
    # `model_copy(update=...)` would carry a cached view of the values it replaced.

    @property
    def images(self) -> ImageSettings:
        return made_from(self, ImageSettings)

    @property
    def volumes(self) -> VolumeSettings:
        return made_from(self, VolumeSettings)

    @property
    def lifecycle(self) -> LifecycleSettings:
        return made_from(self, LifecycleSettings)

    @property
    def observe(self) -> ObserveSettings:
        return made_from(self, ObserveSettings)


def _tls_pair(settings: NodeSettings) -> None:
    if (settings.tls_cert_file is None) != (settings.tls_key_file is None):
        raise ValueError(f"{env_name('tls_cert_file')} and {env_name('tls_key_file')} go together")


def _one_fabric_network(settings: NodeSettings) -> None:
    named = [fabric.name for fabric in settings.fabrics if fabric.has_network]
    if len(named) > 1:
        raise ValueError(
            f"{env_name('fabrics')}: at most one fabric has a network (interface, subnet, "
            f"range); {', '.join(named)} do"
        )


def _below(settings: NodeSettings, low: str, high: str) -> None:
    """A GC's low threshold under its high one."""
    if getattr(settings, low) >= getattr(settings, high):
        raise ValueError(
            f"{env_name(low)} ({getattr(settings, low)}) must be below "
            f"{env_name(high)} ({getattr(settings, high)})"
        )


def _safe_mount_roots(settings: NodeSettings) -> None:
    source = env_name("allowed_mount_roots")
    if settings.allowed_mount_roots is None:  # the defaults come from these two
        source = f"{env_name('storage_root')} or {env_name('model_dirs')} (a mount root)"
    for root in settings.mount_roots:
        bad = settings.never_a_root(root)
        if bad is not None:
            raise ValueError(
                f"{source}: {root} is or holds {bad}, which a job may never "
                f"mount; set {env_name('allowed_mount_roots')} to directories for job data"
            )
        own = next((f for f in settings.node_files() if f[0].is_relative_to(root)), None)
        if own is not None:
            raise ValueError(
                f"{source}: {root} is or holds {own[0]} ({own[1]}), which a job may "
                f"never mount; keep the node's own files out of the mount roots"
            )


def load_settings(env_file: Path | None = None, **overrides: object) -> NodeSettings:
    """Read the settings; a bad value is a ConfigError naming the variable, not a traceback.
    ``env_file``: a file of ``VARIABLE=value`` lines, the format of the systemd unit's
    ``EnvironmentFile`` (``--env-file``), read over the working directory's ``.env``;
    the process's own environment wins over both, as it does over ``.env``. A file
    that cannot be read is a ConfigError (pydantic-settings skips a missing one)."""
    files: tuple[Path | str, ...] = (".env",)
    if env_file is not None:
        try:
            env_file.open("rb").close()
        except OSError as exc:
            raise ConfigError(f"--env-file {env_file}: {exc.strerror or exc}") from exc
        files = (".env", env_file)
    try:
        return NodeSettings(_env_file=files, **overrides)  # type: ignore[arg-type, call-arg]
    except ValidationError as exc:
        raise ConfigError(describe_validation(exc)) from exc
    except SettingsError as exc:  # a list setting that is not JSON
        raise ConfigError(describe_settings_error(exc)) from exc
