"""Private images end to end: a registry that wants a password (contrib/dev/engines.sh
starts it on 127.0.0.1:5005), the daemon over a socket, docker and podman.

What a console would notice: a launch with credentials runs, one without (or with a
wrong password) fails at once saying the registry refused it, the node's own file and a
credential helper stand in for the launch's, a cached private image runs only for
credentials its registry accepts, `pull_policy: always` picks up a moved tag; and the
password is nowhere a person could read it.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeNode
from tests.support.console import HEADERS, Console
from tests.support.engines import OWN_DOCKER_SOCK, engine_missing
from tests.support.images import IMAGE
from tests.support.jobs import unique
from tests.support.waiting import wait_until
from tuneplane_node.daemon.state import NODE
from tuneplane_node.jobs.images.keeper import RECORD_FILE
from tuneplane_node.logformat import JsonFormatter
from tuneplane_node.runtime.cache import CachedRuntime

pytestmark = pytest.mark.engine
ENGINES = ["docker", "podman"]
PRIVATE_REGISTRY = "127.0.0.1:5005"
PRIVATE = f"{PRIVATE_REGISTRY}/tuneplane-test/trainer:1"
REFUSED = f"the registry refused access to {PRIVATE}"
SHOW = ["/bin/cat", "/private"]
SHOWN = "a private test image"


async def forget(node: Console, image: str) -> None:
    """Untag the image on the node's engine (only this name: the suite's own), so a
    launch must pull it."""
    cached = node.app[NODE].runtime
    assert isinstance(cached, CachedRuntime)
    engine: Any = cached.inner.inner  # type: ignore[attr-defined]  # TrackingRuntime's
    if engine.name == "docker":
        remove = lambda: engine.api.remove_image(image, force=True)  # noqa: E731 (one call)
    else:
        remove = lambda: engine.client.images.remove(image, force=True)  # noqa: E731
    try:
        await engine.pool.call(remove)
    except Exception as exc:  # not there: the goal is met
        assert "no such image" in str(exc).lower() or "not known" in str(exc).lower(), exc


async def everything_shown(node: Console, caplog: pytest.LogCaptureFixture, *refs: str) -> str:
    """What a person can read of the node: its log lines (as text and as JSON, with their
    fields), answers, metrics, state files."""
    as_json = [JsonFormatter().format(record) for record in caplog.records]
    parts = [caplog.text, *as_json, json.dumps(await node.health())]
    parts.append(json.dumps(await node.observe(*refs)))
    async with node.client.get("/metrics", headers=HEADERS) as response:
        parts.append(await response.text())
    state_dir = node.app[NODE].settings.state_dir
    parts += [p.read_text(errors="replace") for p in state_dir.glob("*") if p.is_file()]
    return "\n".join(parts)


async def run_to_exit(node: Console, ref: str) -> str:
    await node.wait_for(ref, "status", "exited", timeout=60)
    return await node.logs(ref)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_launch_with_credentials_runs_and_one_without_fails_at_once(
    make_node: MakeNode, engine: str, login: dict[str, str], debug_logs: pytest.LogCaptureFixture
) -> None:
    node = await make_node(engine)
    await forget(node, PRIVATE)

    anonymous, _ = await node.launch(SHOW, gpus=1, image=PRIVATE)
    wrong, _ = await node.launch(
        SHOW, gpus=1, image=PRIVATE, registry_auth={**login, "password": "not-the-password"}
    )
    started = time.monotonic()
    for ref in (anonymous, wrong):
        state = await node.wait_for(ref, "status", "dead")
        assert state["pending_phase"] == "failed" and REFUSED in state["pending_error"], state
    assert time.monotonic() - started < 20  # no retry loop, nowhere near the stall deadline
    health = await node.answered_health()
    assert (health["gpus_reserved"], health["gpus_free"]) == (0, 4)  # both let go

    ref, answer = await node.launch(SHOW, gpus=1, image=PRIVATE, registry_auth=login)
    assert answer["phase"] == "pulling"
    assert SHOWN in await run_to_exit(node, ref)

    shown = await everything_shown(node, debug_logs, anonymous, wrong, ref)
    assert login["password"] not in shown and "not-the-password" not in shown
    labels, env = await container_labels_and_env(node, ref)
    assert login["password"] not in json.dumps([labels, env])


async def container_labels_and_env(node: Console, ref: str) -> tuple[Any, Any]:
    cached = node.app[NODE].runtime
    assert isinstance(cached, CachedRuntime)
    engine: Any = cached.inner.inner  # type: ignore[attr-defined]
    state = await cached.inspect(ref)
    document = await engine.pool.call(engine._document, state.handle)
    return document["Config"].get("Labels"), document["Config"].get("Env")


def auth_file(path: Path, registry: str, user: str, password: str) -> Path:
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    text = json.dumps({"auths": {registry: {"auth": pair}}})
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    temporary.replace(path)  # as an operator's tooling would: the watch sees a new file
    return path


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_node_file_stands_in_and_its_rotation_needs_no_restart(
    make_node: MakeNode,
    engine: str,
    login: dict[str, str],
    tmp_path: Path,
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    config = auth_file(tmp_path / "config.json", PRIVATE_REGISTRY, login["username"], "stale")
    node = await make_node(engine, registry_auth_file=config)
    await forget(node, PRIVATE)
    stale, _ = await node.launch(SHOW, image=PRIVATE)
    assert REFUSED in (await node.failed(stale))["pending_error"]

    read = f"registry auth file {config} read"
    before = sum(read in message for message in debug_logs.messages)
    auth_file(config, PRIVATE_REGISTRY, login["username"], login["password"])
    # The file is watched twice a second: read again once the node says so.
    await wait_until(lambda: sum(read in m for m in debug_logs.messages) > before)
    ref, answer = await node.launch(SHOW, image=PRIVATE)

    assert answer["phase"] == "pulling"
    assert SHOWN in await run_to_exit(node, ref)
    assert login["password"] not in await everything_shown(node, debug_logs, stale, ref)


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_credential_helper_is_run_and_its_answer_used(
    make_node: MakeNode,
    engine: str,
    login: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bin_dir, asked = tmp_path / "bin", tmp_path / "asked"
    bin_dir.mkdir()
    answer = json.dumps({"Username": login["username"], "Secret": login["password"]})
    helper = bin_dir / "docker-credential-tuneplane-test"
    helper.write_text(f"#!/bin/sh\ncat >>{asked}\necho >>{asked}\necho '{answer}'\n")
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"credHelpers": {PRIVATE_REGISTRY: "tuneplane-test"}}))
    node = await make_node(engine, registry_auth_file=config)
    await forget(node, PRIVATE)

    ref, _ = await node.launch(SHOW, image=PRIVATE)

    assert SHOWN in await run_to_exit(node, ref)
    assert asked.read_text().split() == [PRIVATE_REGISTRY]  # asked for this registry, once


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_cached_private_image_is_not_a_free_pass(
    make_node: MakeNode, engine: str, login: dict[str, str], tmp_path: Path
) -> None:
    node = await make_node(engine)
    await forget(node, PRIVATE)
    first, _ = await node.launch(SHOW, image=PRIVATE, registry_auth=login)
    assert SHOWN in await run_to_exit(node, first)

    await refused_without_credentials(node)
    _, answer = await node.launch(SHOW, image=PRIVATE, registry_auth=login)
    assert answer["phase"] == "running"  # the image is here: no pull

    # A restarted daemon (the same state directory) keeps the record.
    restarted = await make_node(engine)
    await refused_without_credentials(restarted)
    # Credentials the record does not hold are asked of the registry (a manifest HEAD).
    record = tmp_path / "state" / RECORD_FILE
    document = json.loads(record.read_text())
    document["images"][f"{PRIVATE_REGISTRY}/tuneplane-test/trainer"]["credentials"] = ["0" * 64]
    record.write_text(json.dumps(document))
    asked_registry = await make_node(engine)
    wrong = {**login, "password": "not-the-password"}
    _, refused = await asked_registry.launch(SHOW, image=PRIVATE, registry_auth=wrong, expect=403)
    assert "does not accept" in refused["detail"]
    _, answer = await asked_registry.launch(SHOW, image=PRIVATE, registry_auth=login)
    assert answer["phase"] == "running"


async def refused_without_credentials(node: Console) -> None:
    ref, answer = await node.launch(SHOW, image=PRIVATE, gpus=1, expect=403)
    assert PRIVATE in answer["detail"]
    assert (await node.state(ref))["exists"] is False  # nothing created
    health = await node.answered_health()
    assert health["gpus_free"] == 4, health


def own_docker(*args: str, config: Path) -> None:
    """The docker CLI on the suite's own engine, which the nodes here do not use: what
    it builds and pushes is on no node's engine until a node pulls it."""
    command = ["docker", "-H", f"unix://{OWN_DOCKER_SOCK}", "--config", str(config), *args]
    subprocess.run(command, check=True, capture_output=True, timeout=120)


def push_version(image: str, version: str, *, context: Path, login: dict[str, str]) -> None:
    auth_file(context / "config.json", PRIVATE_REGISTRY, login["username"], login["password"])
    (context / "version").write_text(f"{version}\n")
    (context / "Dockerfile").write_text(f"FROM {IMAGE}\nCOPY version /version\n")
    own_docker("build", "-q", "-t", image, str(context), config=context)
    own_docker("push", image, config=context)


@pytest.mark.parametrize("engine", ENGINES)
async def test_pull_policy_always_picks_up_a_tag_pushed_again(
    make_node: MakeNode, engine: str, login: dict[str, str], tmp_path: Path
) -> None:
    if not OWN_DOCKER_SOCK.exists():
        engine_missing("the suite's own docker engine", f"no {OWN_DOCKER_SOCK}")
    image = f"{PRIVATE_REGISTRY}/tuneplane-test/moving:{unique('tag')}"
    node = await make_node(engine)
    try:
        push_version(image, "one", context=tmp_path, login=login)
        old, _ = await node.launch(["/bin/cat", "/version"], image=image, registry_auth=login)
        assert "one" in await run_to_exit(node, old)
        push_version(image, "two", context=tmp_path, login=login)

        kept, answer = await node.launch(["/bin/cat", "/version"], image=image, registry_auth=login)
        assert answer["phase"] == "running" and "one" in await run_to_exit(node, kept)
        moved, answer = await node.launch(
            ["/bin/cat", "/version"], image=image, registry_auth=login, pull_policy="always"
        )
        assert answer["phase"] == "pulling"
        assert "two" in await run_to_exit(node, moved)
    finally:
        for ref in node.made or ():
            await node.remove(ref)
        await forget(node, image)
        own_docker("rmi", "-f", image, config=tmp_path)


async def engine_of(node: Console) -> Any:
    cached = node.app[NODE].runtime
    assert isinstance(cached, CachedRuntime)
    return cached.inner.inner  # type: ignore[attr-defined]  # TrackingRuntime's


async def tag(node: Console, image: str, new: str) -> None:
    """A second name for the image on the node's engine, as an operator's `docker tag`."""
    engine = await engine_of(node)
    repository, _, version = new.rpartition(":")
    if engine.name == "docker":
        await engine.pool.call(lambda: engine.api.tag(image, repository, version))
    else:
        await engine.pool.call(lambda: engine.client.images.get(image).tag(repository, version))


async def refused(node: Console, image: str) -> int:
    """A launch and a prefetch of ``image`` without credentials: refused (403 or 422),
    the same answer whether it is here or not, and nothing made."""
    ref, answer = await node.launch(SHOW, image=image, gpus=1, expect=answer_status(image))
    assert answer["code"] in ("forbidden_image", "invalid_field"), answer
    assert (await node.state(ref))["exists"] is False
    status, prefetch = await node.call("POST", "/node/v1/images/pull", json={"image": image})
    assert (status, prefetch["code"]) == (answer_status(image), answer["code"]), prefetch
    return status


def answer_status(image: str) -> int:
    """422 for a spelling a console never needs (an id or a prefix); 403 for a name."""
    return 403 if "/" in image else 422


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_private_image_is_refused_by_every_spelling_of_it_and_runs_for_its_owner(
    make_node: MakeNode, engine: str, login: dict[str, str]
) -> None:
    node = await make_node(engine)
    await forget(node, PRIVATE)
    first, _ = await node.launch(SHOW, image=PRIVATE, registry_auth=login)
    assert SHOWN in await run_to_exit(node, first)
    inspected = await (await engine_of(node)).image_info(PRIVATE)
    assert inspected is not None
    hexid = inspected.id.removeprefix("sha256:")
    (digest,) = {d.rpartition("@")[2] for d in inspected.digests}
    other_tag = f"{PRIVATE_REGISTRY}/tuneplane-test/trainer:{unique('tag')}"
    retagged = f"127.0.0.1:5000/tuneplane-test/{unique('looks-public')}:1"
    await tag(node, PRIVATE, other_tag)
    await tag(node, PRIVATE, retagged)
    try:
        by_digest = f"{PRIVATE_REGISTRY}/tuneplane-test/trainer@{digest}"
        for spelling in (f"sha256:{hexid}", hexid, hexid[:12], hexid[:2]):
            assert await refused(node, spelling) == 422
        for spelling in (PRIVATE, by_digest, other_tag, retagged):
            assert await refused(node, spelling) == 403
        for spelling in (PRIVATE, by_digest, other_tag, retagged):  # the owner runs each
            ref, answer = await node.launch(SHOW, image=spelling, registry_auth=login)
            assert answer["phase"] == "running", (spelling, answer)
            assert SHOWN in await run_to_exit(node, ref)
        # A short name is Docker Hub's image, not this one: never run from the store.
        ref, answer = await node.launch(SHOW, image="tuneplane-test/trainer:1")
        assert answer["phase"] == "pulling"
        await node.remove(ref)
        listed = (await node.ok("GET", "/node/v1/images"))["images"]
        assert [i["image"] for i in listed if i["id"] == inspected.id] == [PRIVATE]
    finally:
        for name in (other_tag, retagged):
            await forget(node, name)
