"""AuthFile: the node's registry credentials, ``TUNEPLANE_REGISTRY_AUTH_FILE``.

The file is Docker's ``config.json``, read with the docker SDK's own reader
(`docker.auth`): ``auths`` (``auth`` or ``identitytoken``), ``credHelpers`` and
``credsStore``. Both engines use it and the daemon holds it (made with the app, watched,
read again on SIGHUP), so it stands on the runtime's floor, not in an engine's wing (the
daemon reaches no engine's module); it is the second (and last) module that imports the
docker SDK, and its errors are translated here. A credential helper is run here too, not
through `docker.credentials.Store`, which waits for the program without a deadline: a
hung helper must not hold a pool thread forever.

The file is read again when it changes (watched twice a second, off the loop) and on
SIGHUP; a new version that is unreadable or malformed keeps the last good one, as the
token file does. Nothing read from it reaches a log: only registries and counts do.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
from pathlib import Path
from typing import Any

import docker.auth
import docker.errors

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import ConfigError
from tuneplane_node.settings import NodeSettings, env_name
from tuneplane_node.watched import FileStamp
from tuneplane_node.wire.values import RegistryAuth

log = logging.getLogger(__name__)
WATCH_S = 0.5
HELPER_TIMEOUT_S = 10.0
"""The longest a ``docker-credential-<name> get`` may take before it counts as no answer."""
HELPER_PREFIX = "docker-credential-"
TOKEN_USERNAME = "<token>"  # a helper's way of saying "the secret is an identity token"


class AuthFile:
    """The credentials of one config.json, by registry."""

    def __init__(self, path: Path, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.path = path
        self.clock = clock  # the watch's period
        self.stamp = FileStamp(path)
        self._config: docker.auth.AuthConfig = docker.auth.AuthConfig({})

    @classmethod
    def from_settings(
        cls, settings: NodeSettings, *, clock: Clock = SYSTEM_CLOCK
    ) -> AuthFile | None:
        """The start-up file, or None when none is set; a bad file is a ConfigError."""
        if settings.registry_auth_file is None:
            return None
        auth_file = cls(settings.registry_auth_file, clock=clock)
        try:
            auth_file._config = auth_file._read()
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{env_name('registry_auth_file')}: {exc}") from None
        return auth_file

    def __repr__(self) -> str:
        return f"AuthFile({str(self.path)!r})"

    def described(self) -> str:
        """What the file holds, by registry (the names only)."""
        config = self._config
        parts = [f"credentials for {', '.join(sorted(config.auths)) or 'no registry'}"]
        if config.cred_helpers:
            helpers = (f"{r} ({name})" for r, name in sorted(config.cred_helpers.items()))
            parts.append(f"helpers for {', '.join(helpers)}")
        if config.creds_store:
            parts.append(f"store {config.creds_store} for the others")
        return "; ".join(parts)

    def lookup(self, registry: str) -> RegistryAuth | None:
        """The file's credentials for ``registry``: its helper's first, then ``auths``.
        Blocking (a helper is a program): call it off the loop."""
        config = self._config
        helper = config.get_credential_store(registry)
        if helper:
            found = run_helper(helper, registry)
            if found is not None:
                return found
        return _from_entry(docker.auth.resolve_authconfig({"auths": config.auths}, registry))

    async def watch(self, every: float = WATCH_S) -> None:
        """Read the file again whenever it changes; runs until cancelled."""
        while True:
            await self.clock.sleep(every)
            if await asyncio.to_thread(self.stamp.changed):
                await self.reload()

    async def reload(self) -> None:
        """Read the file again now (SIGHUP); on failure keep the last good version."""
        try:
            config = await asyncio.to_thread(self._read)
        except (OSError, ValueError) as exc:
            log.error(
                "registry auth file %s unreadable (%s): keeping the last good one", self.path, exc
            )
            return
        self._config = config
        log.info("registry auth file %s read: %s", self.path, self.described())

    def _read(self) -> docker.auth.AuthConfig:
        self.stamp.reading()
        try:
            document = json.loads(self.path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.path} is not JSON: {exc.msg} at line {exc.lineno}") from None
        if not isinstance(document, dict):
            raise ValueError(f"{self.path} is not a JSON object")
        try:
            return docker.auth.load_config(config_dict=document)
        except (docker.errors.DockerException, ValueError, TypeError, AttributeError) as exc:
            # The SDK's words name the registry, never the secret (binascii's neither).
            raise ValueError(f"{self.path}: {type(exc).__name__}: {exc}") from None


def _from_entry(entry: Any) -> RegistryAuth | None:
    """An ``auths`` entry as the SDK parsed it: user and password, or an identity token."""
    if not isinstance(entry, dict):
        return None
    if entry.get("IdentityToken"):
        return RegistryAuth(identity_token=str(entry["IdentityToken"]), source="file")
    if entry.get("username") and entry.get("password") is not None:
        return RegistryAuth(
            username=str(entry["username"]), password=str(entry["password"]), source="file"
        )
    return None


def run_helper(name: str, registry: str) -> RegistryAuth | None:
    """``docker-credential-<name> get`` for the registry, within `HELPER_TIMEOUT_S`;
    None when it has nothing for it, fails or is too slow (logged without its output,
    which may hold the secret)."""
    program = shutil.which(f"{HELPER_PREFIX}{name}")
    if program is None:
        log.warning("credential helper %s%s not found on PATH", HELPER_PREFIX, name)
        return None
    # docker's own lookup names Docker Hub by its v1 index URL (docker.auth.INDEX_URL).
    server = docker.auth.INDEX_URL if registry == docker.auth.INDEX_NAME else registry
    try:
        done = subprocess.run(
            [program, "get"], input=server.encode(), capture_output=True,
            timeout=HELPER_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("credential helper %s for %s: %s", name, registry, type(exc).__name__)
        return None
    if done.returncode != 0:
        log.info(
            "credential helper %s has nothing for %s (exit %d)", name, registry, done.returncode
        )
        return None
    return _from_helper(done.stdout, name=name, registry=registry)


def _from_helper(output: bytes, *, name: str, registry: str) -> RegistryAuth | None:
    try:
        answer = json.loads(output)
        username, secret = str(answer["Username"]), str(answer["Secret"])
    except (ValueError, KeyError, TypeError):
        log.warning("credential helper %s answered for %s in no known shape", name, registry)
        return None
    if not secret:
        return None
    if username == TOKEN_USERNAME:
        return RegistryAuth(identity_token=secret, source="file")
    return RegistryAuth(username=username, password=secret, source="file")
