"""The node's registry auth file (Docker's config.json) and the pull's credentials on the
wire: what the engines get, what a bad file does, what a refusal says. No engine."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from tests.conftest import fake_settings
from tuneplane_node.errors import ConfigError, EngineRefused, RegistryRefused
from tuneplane_node.references import ImageName
from tuneplane_node.runtime import authfile
from tuneplane_node.runtime.authfile import AuthFile
from tuneplane_node.runtime.engines.dockerformat import auth_header
from tuneplane_node.runtime.engines.pulling import pull_headers, refusal_of_pull
from tuneplane_node.wire.values import RegistryAuth

REGISTRY = "registry.test:5005"
PASSWORD = "pa55-w0rd"


def config_json(path: Path, document: object) -> Path:
    path.write_text(json.dumps(document))
    return path


def basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def loaded(tmp_path: Path, document: object) -> AuthFile:
    path = config_json(tmp_path / "config.json", document)
    auth_file = AuthFile.from_settings(fake_settings(tmp_path, registry_auth_file=path))
    assert auth_file is not None
    return auth_file


def test_auths_give_a_user_and_password_or_an_identity_token(tmp_path: Path) -> None:
    auth_file = loaded(
        tmp_path,
        {
            "auths": {
                REGISTRY: {"auth": basic("ci", PASSWORD)},
                "https://token.test/v1/": {"identitytoken": "tok-123"},
            }
        },
    )
    assert auth_file.lookup(REGISTRY) == RegistryAuth("ci", PASSWORD, source="file")
    assert auth_file.lookup("token.test") == RegistryAuth(identity_token="tok-123", source="file")
    assert auth_file.lookup("elsewhere.test") is None
    assert PASSWORD not in repr(auth_file)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "is not JSON"),
        ("[1, 2]", "is not a JSON object"),
        (json.dumps({"auths": {REGISTRY: "a string"}}), "InvalidConfigFile"),
        (json.dumps({"auths": {REGISTRY: {"auth": "bm9jb2xvbg=="}}}), "ValueError"),  # "nocolon"
    ],
)
def test_a_malformed_file_is_one_start_up_line_naming_the_variable(
    tmp_path: Path, text: str, why: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ConfigError) as error:
        AuthFile.from_settings(fake_settings(tmp_path, registry_auth_file=path))
    assert error.value.message.startswith("TUNEPLANE_REGISTRY_AUTH_FILE: ")
    assert why in error.value.message and "\n" not in error.value.message


def test_an_unreadable_file_stops_the_start(tmp_path: Path) -> None:
    missing = tmp_path / "absent.json"
    with pytest.raises(ConfigError, match=r"TUNEPLANE_REGISTRY_AUTH_FILE: .*absent\.json"):
        AuthFile.from_settings(fake_settings(tmp_path, registry_auth_file=missing))


async def test_a_bad_new_version_keeps_the_last_good_one(tmp_path: Path) -> None:
    auth_file = loaded(tmp_path, {"auths": {REGISTRY: {"auth": basic("ci", "old")}}})
    config_json(auth_file.path, {"auths": {REGISTRY: {"auth": basic("ci", "new")}}})
    assert auth_file.stamp.changed()
    await auth_file.reload()
    assert auth_file.lookup(REGISTRY) == RegistryAuth("ci", "new", source="file")
    auth_file.path.write_text("{broken")
    await auth_file.reload()
    assert auth_file.lookup(REGISTRY) == RegistryAuth("ci", "new", source="file")


def helper_program(bin_dir: Path, name: str, script: str) -> Path:
    bin_dir.mkdir(exist_ok=True)
    program = bin_dir / f"docker-credential-{name}"
    program.write_text(f"#!/bin/sh\n{script}\n")
    program.chmod(0o755)
    return program


def test_a_credential_helper_is_asked_for_its_registry_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    answer = json.dumps({"ServerURL": REGISTRY, "Username": "<token>", "Secret": "from-helper"})
    helper_program(
        tmp_path / "bin", "test", f"read r; echo \"$r\" >{tmp_path}/asked; echo '{answer}'"
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    auth_file = loaded(
        tmp_path,
        {"credHelpers": {REGISTRY: "test"}, "auths": {REGISTRY: {"auth": basic("ci", "x")}}},
    )
    assert auth_file.lookup(REGISTRY) == RegistryAuth(identity_token="from-helper", source="file")
    assert (tmp_path / "asked").read_text().strip() == REGISTRY


def test_a_failing_or_missing_helper_falls_back_to_auths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helper_program(tmp_path / "bin", "broken", f"echo {PASSWORD} >&2; exit 1")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    document = {
        "credHelpers": {REGISTRY: "broken", "other.test": "absent"},
        "auths": {REGISTRY: {"auth": basic("ci", "fallback")}},
    }
    auth_file = loaded(tmp_path, document)
    assert auth_file.lookup(REGISTRY) == RegistryAuth("ci", "fallback", source="file")
    assert auth_file.lookup("other.test") is None


@pytest.mark.slow  # waits out a (shortened) helper deadline
def test_a_hung_helper_is_given_up_on_at_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    helper_program(tmp_path / "bin", "hung", "exec sleep 30")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setattr(authfile, "HELPER_TIMEOUT_S", 0.3)
    auth_file = loaded(tmp_path, {"credsStore": "hung"})
    assert auth_file.lookup(REGISTRY) is None


def test_the_pull_header_is_dockers_auth_config() -> None:
    headers = pull_headers(f"{REGISTRY}/team/trainer:1", RegistryAuth("ci", PASSWORD))
    document = json.loads(base64.urlsafe_b64decode(headers["X-Registry-Auth"]))
    assert document == {"username": "ci", "password": PASSWORD, "serveraddress": REGISTRY}
    token = json.loads(base64.urlsafe_b64decode(auth_header(RegistryAuth(identity_token="t"), "r")))
    assert token == {"identitytoken": "t", "serveraddress": "r"}
    assert pull_headers("busybox", None) == {}


@pytest.mark.parametrize(
    ("image", "parsed"),
    [
        ("busybox", ("docker.io", "library/busybox", "latest")),
        ("team/x:2", ("docker.io", "team/x", "2")),
        ("localhost/x", ("localhost", "x", "latest")),
        (f"{REGISTRY}/a/b:1", (REGISTRY, "a/b", "1")),
        (f"{REGISTRY}/a@sha256:{'c' * 64}", (REGISTRY, "a", f"sha256:{'c' * 64}")),
    ],
)
def test_an_image_name_as_the_engines_read_it(image: str, parsed: tuple[str, str, str]) -> None:
    assert ImageName.parse(image) == parsed
    assert ImageName.parse(image).by_digest == ("@" in image)


@pytest.mark.parametrize(
    "words",
    [
        "unauthorized: authentication required",  # docker 20.10, wrong password
        'Head "http://r/v2/x/manifests/1": no basic auth credentials',  # docker, none
        "initializing source docker://r/x:1: reading manifest 1 in r/x: unauthorized: "
        "authentication required",  # podman 4.3
        "denied: requested access to the resource is denied",
    ],
)
def test_a_registry_refusal_says_so_and_never_shows_the_secret(words: str) -> None:
    refused = EngineRefused(engine="docker", action="pull r/x:1", reason=f"{words} {PASSWORD}")
    said = refusal_of_pull(refused, image="r/x:1", auth=RegistryAuth("ci", PASSWORD))
    assert isinstance(said, RegistryRefused)
    assert "the registry refused access to r/x:1" in said.message
    assert PASSWORD not in said.message


def test_another_refusal_keeps_its_words() -> None:
    refused = EngineRefused(engine="podman", action="pull r/x:1", reason="no space left on device")
    assert refusal_of_pull(refused, image="r/x:1", auth=None) is refused
