"""`tuneplane-node check`: every step in order, one line per fact as each is learnt; and
the steps about the node itself: where relative paths start, the token, TLS, the registry
auth file, the node's port (a node already serving on it is no fault)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

from tuneplane_node.checks.egress import check_egress
from tuneplane_node.checks.engine import check_engine, check_jobs
from tuneplane_node.checks.findings import FAIL, OK, WARN, Finding
from tuneplane_node.checks.gpus import (
    check_fabric_network,
    check_fabrics,
    check_gpus,
    check_rdma,
)
from tuneplane_node.checks.notices import check_notices
from tuneplane_node.checks.storage import (
    check_disk,
    check_mount_roots,
    check_mounts,
    check_state_dir,
    check_storage,
)
from tuneplane_node.errors import ConfigError
from tuneplane_node.settings import NodeSettings, env_name, load_settings


def check(settings: NodeSettings, *, env_file: Path | None = None) -> int:
    """One line per fact, as each is learnt; 1 when any is a FAIL. Starts no daemon.
    ``env_file``: the ``--env-file`` the settings were read with (absolute)."""
    steps: tuple[Callable[[NodeSettings], list[Finding]], ...] = (
        check_token,
        check_tls,
        check_registry_auth,
        check_volume_ca,
        check_engine,
        check_jobs,
        check_egress,
        check_gpus,
        check_disk,
        check_storage,
        check_mount_roots,
        check_mounts,
        check_state_dir,
        check_fabrics,
        check_fabric_network,
        check_rdma,
        check_notices,
        check_port,
    )
    failed = False
    base, settings = path_base(settings, env_file)
    print(f"{OK:<4} {settings_read(env_file)}", flush=True)
    if base is not None:
        print(f"{base[0]:<4} {base[1]}", flush=True)
    for step in steps:
        for level, text in step(settings):
            print(f"{level:<4} {text}", flush=True)
            failed |= level == FAIL
    return 1 if failed else 0


def settings_read(env_file: Path | None) -> str:
    """Where the settings came from, in the order each wins over the one before: the
    working directory's ``.env``, ``--env-file``, the environment's own variables (named:
    a variable set in the shell wins over the file the daemon's unit reads)."""
    read = [f"{Path.cwd() / '.env'}"] if Path(".env").is_file() else []
    read += [f"{env_file} (--env-file)"] if env_file is not None else []
    settings = {env_name(name) for name in NodeSettings.model_fields}
    # An empty one is not given (env_ignore_empty): the file's value holds.
    named = sorted(name for name, value in os.environ.items() if name.upper() in settings and value)
    if named:
        over = _overridden(env_file, named)
        read.append(f"the environment ({', '.join(named)}{over})")
    if not read:
        return "settings: the defaults: no .env here, no --env-file, no TUNEPLANE_* variable"
    return f"settings: from {', then '.join(read)}"


def _overridden(env_file: Path | None, named: list[str]) -> str:
    """``; over the file's: NAME, ...``: the file's variables the environment sets too."""
    if env_file is None:
        return ""
    from dotenv import dotenv_values  # pydantic-settings' own reader of .env files

    filed = {name.upper() for name in dotenv_values(env_file)}
    both = [name for name in named if name.upper() in filed]
    return f"; over the file's: {', '.join(both)}" if both else ""


def path_base(
    settings: NodeSettings, env_file: Path | None = None
) -> tuple[Finding | None, NodeSettings]:
    """Where relative paths start, as serve resolves them: a node serving on the port
    resolves them (and read its ``.env``) in its own working directory, so check moves
    there and reads the settings again; else in this one, as a serve started here would.
    The finding is None when every path setting is absolute."""
    serving = _serving_pid(settings)
    if serving is not None:
        try:
            directory = Path(os.readlink(f"/proc/{serving}/cwd"))
            os.chdir(directory)
        except OSError as exc:
            here = Path.cwd()
            return (
                WARN,
                f"paths: relative ones from {here}: the serving node's (pid "
                f"{serving}) working directory is unreadable: {exc.strerror}",
            ), settings
        settings = load_settings(env_file)
        if _relative_paths(settings):
            return (
                OK,
                f"paths: relative ones from {directory}, the working directory of "
                f"the serving node (pid {serving})",
            ), settings
        return None, settings
    if _relative_paths(settings):
        return (
            OK,
            f"paths: relative ones from {Path.cwd()}, the working directory "
            "(a serve started elsewhere resolves them there)",
        ), settings
    return None, settings


def _relative_paths(settings: NodeSettings) -> list[Path]:
    paths = [settings.storage, settings.state_dir, settings.scratch_dir, *settings.model_dirs]
    paths += settings.allowed_mount_roots or []
    for name in ("node_token_file", "tls_cert_file", "tls_key_file", "tls_client_ca_file",
                 "registry_auth_file", "gpu_simulation_file"):  # fmt: skip
        path = getattr(settings, name)
        paths += [path] if path is not None else []
    return [path for path in paths if not path.expanduser().is_absolute()]


def _serving_pid(settings: NodeSettings) -> int | None:
    """The pid of the tuneplane-node serving on the node's port, if one is."""
    from tuneplane_node.daemon.listener import port_holders

    pids = port_holders(settings.node_port)
    if not pids or serving_node(settings) is None:
        return None
    # Under the socket unit systemd (pid 1) holds the port too: the node is the one named.
    named = [pid for pid in pids if b"tuneplane" in _cmdline(pid)]
    return (named or pids)[0]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def check_token(settings: NodeSettings) -> list[Finding]:
    from tuneplane_node.daemon.access.tokens import TokenSet

    try:
        tokens = TokenSet.from_settings(settings)
    except ConfigError as exc:
        return [(FAIL, f"token: {exc.message}")]
    sources = [env_name("node_token")] if settings.node_token else []
    if settings.node_token_file is not None:
        sources.append(f"{env_name('node_token_file')} {settings.node_token_file}")
    scopes = ", ".join(f"{scope} {n}" for scope, n in tokens.scopes().items())
    text = f"token: {len(tokens)} accepted ({scopes}), from {' and '.join(sources)}"
    return [(OK, text)]


def check_tls(settings: NodeSettings) -> list[Finding]:
    from tuneplane_node.daemon.server import tls_context

    if settings.tls_cert_file is None:
        return [(WARN, f"tls: off, the API is plain HTTP ({env_name('tls_cert_file')} is unset)")]
    try:
        tls_context(settings)  # the daemon's own loading: chain, key, client CA
    except ConfigError as exc:
        return [(FAIL, f"tls: {exc.message}")]
    text = f"tls: {settings.tls_cert_file} matches its key {settings.tls_key_file}"
    if settings.tls_client_ca_file is not None:
        text += f"; clients need a certificate of {settings.tls_client_ca_file}"
    return [(OK, text)]


def check_registry_auth(settings: NodeSettings) -> list[Finding]:
    """The auth file as the daemon reads it; its registries, never a credential."""
    from tuneplane_node.runtime.authfile import AuthFile

    try:
        auth_file = AuthFile.from_settings(settings)
    except ConfigError as exc:
        return [(FAIL, f"registry auth: {exc.message}")]
    if auth_file is None:
        return []  # anonymous pulls, or the launch's own credentials
    return [(OK, f"registry auth: {auth_file.path}: {auth_file.described()}")]


def check_volume_ca(settings: NodeSettings) -> list[Finding]:
    """The CAs the volume fetches trust besides the system's, loaded as the fetcher
    loads them: a file that does not load fails every https volume of a private CA."""
    import ssl

    path = settings.volume_ca_file
    if path is None:
        return []  # the system's CAs alone
    context = ssl.create_default_context(cafile=None)
    before = len(context.get_ca_certs())
    try:
        context.load_verify_locations(cafile=str(path))
    except (OSError, ssl.SSLError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return [(FAIL, f"volume CA: {env_name('volume_ca_file')} {path}: {why}")]
    added = len(context.get_ca_certs()) - before
    text = f"volume CA: {path}: {added} CA(s) trusted for https volume sources and registries"
    return [(OK, text)]


def serving_node(settings: NodeSettings) -> str | None:
    """``pid 1234, port 8470`` when a tuneplane-node answers ``/healthz`` on the node's
    port (a check on a serving node: no fault); None when what holds it is not one."""
    import ssl
    import urllib.request

    from tuneplane_node.daemon.listener import port_holders

    host, port = settings.node_host, settings.node_port
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    scheme = "https" if settings.tls_cert_file else "http"
    context = None
    if scheme == "https":  # who answers, not a secret sent: its certificate is not checked
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    url = f"{scheme}://{host if ':' not in host else f'[{host}]'}:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=3, context=context) as answer:
            if json.loads(answer.read()) != {"ok": True}:
                return None
    except (OSError, ValueError):
        return None
    pids = ", ".join(str(pid) for pid in port_holders(port)) or "unknown"
    return f"pid {pids}, port {port}"


def check_port(settings: NodeSettings) -> list[Finding]:
    from tuneplane_node.daemon.listener import CannotListen, bind, describe

    host, port = settings.node_host, settings.node_port
    try:
        sockets = bind(host, port, backlog=1)  # as serve binds: both families for 0.0.0.0
    except CannotListen as exc:
        serving = serving_node(settings)
        if serving is not None:
            return [(OK, f"port: {exc.address}: served by a running tuneplane-node ({serving})")]
        return [(FAIL, f"port: {exc.address}: {exc.reason} (a node already serving?)")]
    named = " and ".join(describe(sock) for sock in sockets)
    for sock in sockets:
        sock.close()
    return [(OK, f"port: {named} free")]
