"""Private images, pull policy and the pull's credentials against the in-memory engine:
every rule, no registry, no sleeps (the registry's answer is a function of the test's,
and the recheck period passes on the fake clock)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import IMAGE
from tests.fakes import FakeClock, FakeRuntime
from tests.helpers import settle
from tuneplane_node.errors import ConfigError, ImageAccessDenied
from tuneplane_node.jobs import JobService, LaunchRequest, Pulling, Started
from tuneplane_node.jobs.images import RECORD_FILE, ImageKeeper
from tuneplane_node.jobs.results import ALWAYS
from tuneplane_node.runtime.base import LABEL_RUN_ID, ContainerSpec, RegistryAuth, container_name
from tuneplane_node.settings import NodeSettings

RIGHT = RegistryAuth(username="ci", password="s3cret-right")
OTHER = RegistryAuth(username="ci", password="s3cret-other")
REPOSITORY = "registry.test/trainer"


class Registry:
    """The registry's answer to a manifest HEAD: yes for the credentials in ``accepts``."""

    def __init__(self, *accepts: RegistryAuth) -> None:
        self.accepts = set(accepts)
        self.asked: list[RegistryAuth] = []
        self.down = False

    def __call__(self, image: str, auth: RegistryAuth) -> bool:
        self.asked.append(auth)
        if self.down:
            raise OSError("connection refused")
        return auth in self.accepts


def launch(
    run_id: str, *, image: str = IMAGE, auth: RegistryAuth | None = None, policy: str = ""
) -> LaunchRequest:
    spec = ContainerSpec(name=container_name(run_id), image=image, labels={LABEL_RUN_ID: run_id})
    request = LaunchRequest(run_id, 1, spec, auth=auth)
    return replace(request, pull_policy=policy) if policy else request


async def pull_then_run(
    service: JobService, fake: FakeRuntime, run_id: str, auth: RegistryAuth | None
) -> None:
    """A launch whose image the engine lacks, its pull finished, its container started."""
    fake.images.discard(IMAGE)
    fake.pulling.clear()
    assert isinstance(await service.launch(launch(run_id, auth=auth)), Pulling)
    await fake.pulling.wait()
    record = service.pending.get(container_name(run_id))
    assert record is not None and record.task is not None
    fake.pull_of(IMAGE).finish()
    await record.task  # the pull recorded, the container made
    assert service.pending.get(container_name(run_id)) is None


@pytest.fixture
async def private(service: JobService, fake: FakeRuntime) -> Registry:
    """A node that pulled IMAGE with RIGHT; its registry accepts RIGHT only."""
    await service.images.start()
    registry = service.images.check = Registry(RIGHT)
    await pull_then_run(service, fake, "first", RIGHT)
    registry.asked.clear()
    return registry


async def test_the_pull_gets_the_launchs_credentials(
    service: JobService, fake: FakeRuntime
) -> None:
    fake.images.discard(IMAGE)
    await service.launch(launch("r1", auth=RIGHT))
    await fake.pulling.wait()
    assert fake.pull_of(IMAGE).auth == RIGHT
    fake.pull_of(IMAGE).finish()
    await settle()


async def test_launches_with_other_credentials_do_not_share_a_pull(
    service: JobService, fake: FakeRuntime
) -> None:
    fake.images.discard(IMAGE)
    for run_id, auth in (("a", RIGHT), ("b", OTHER), ("c", RIGHT), ("d", None)):
        await service.launch(launch(run_id, auth=auth))
    await settle()
    assert sorted(str(pull.auth and pull.auth.password) for pull in fake.pulls) == [
        "None", "s3cret-other", "s3cret-right",
    ]  # fmt: skip


async def test_a_cached_private_image_is_refused_without_credentials_and_nothing_is_made(
    service: JobService, fake: FakeRuntime, private: Registry
) -> None:
    with pytest.raises(ImageAccessDenied, match=f"private image {IMAGE}") as refused:
        await service.launch(launch("second"))
    assert refused.value.status == 403
    assert not (await service.observe(["tuneplane-second"]))["tuneplane-second"].exists
    assert (await service.allocator.occupancy()).reserved == frozenset()
    assert private.asked == []  # no credentials: nothing to ask


async def test_the_credentials_that_pulled_it_run_it_without_asking_the_registry(
    service: JobService, private: Registry
) -> None:
    assert isinstance(await service.launch(launch("again", auth=RIGHT)), Started)
    assert private.asked == []


async def test_other_credentials_run_it_when_the_registry_accepts_them_and_the_yes_is_kept(
    service: JobService, private: Registry, clock: FakeClock
) -> None:
    private.accepts.add(OTHER)
    assert isinstance(await service.launch(launch("o1", auth=OTHER)), Started)
    assert isinstance(await service.launch(launch("o2", auth=OTHER)), Started)
    assert private.asked == [OTHER]  # once: the yes is kept

    private.accepts.discard(OTHER)  # revoked at the registry
    clock.advance(3600 + 1)
    with pytest.raises(ImageAccessDenied, match="does not accept"):
        await service.launch(launch("o3", auth=OTHER))


async def test_credentials_the_registry_refuses_or_cannot_judge_are_refused(
    service: JobService, private: Registry
) -> None:
    with pytest.raises(ImageAccessDenied, match="does not accept"):
        await service.launch(launch("wrong", auth=OTHER))
    private.down = True
    with pytest.raises(ImageAccessDenied, match="could not be asked"):
        await service.launch(launch("unknown", auth=OTHER))


async def test_every_tag_and_digest_of_a_private_repository_is_private(
    service: JobService, fake: FakeRuntime, private: Registry
) -> None:
    for image in (f"{REPOSITORY}:2", f"{REPOSITORY}@sha256:{'a' * 64}"):
        fake.images.add(image)  # however it got here
        with pytest.raises(ImageAccessDenied):
            await service.launch(launch("other-tag", image=image))


async def test_an_image_the_node_did_not_pull_is_not_checked(
    service: JobService, private: Registry
) -> None:
    elsewhere = launch("operator", image="registry.test/operators-own:1")
    service.runtime.images.add(elsewhere.spec.image)  # type: ignore[attr-defined]
    assert isinstance(await service.launch(elsewhere), Started)


async def test_the_record_survives_a_restart_and_holds_no_secret(
    service: JobService, private: Registry, settings: NodeSettings, clock: FakeClock
) -> None:
    text = (settings.state_dir / RECORD_FILE).read_text()
    assert RIGHT.password not in text and REPOSITORY in text

    restarted = ImageKeeper(settings, credentials=None, clock=clock, check=Registry())
    await restarted.start()
    with pytest.raises(ImageAccessDenied):
        await restarted.admit(IMAGE, None)
    await restarted.admit(IMAGE, RIGHT)  # the hash matches: the same salt was kept


async def test_a_pull_without_credentials_makes_the_repository_public_again(
    service: JobService, fake: FakeRuntime, private: Registry
) -> None:
    await pull_then_run(service, fake, "public", None)
    assert isinstance(await service.launch(launch("anyone")), Started)


async def test_the_check_turned_off_runs_it_for_anyone(
    fake: FakeRuntime, settings: NodeSettings, clock: FakeClock, private: Registry
) -> None:
    off = ImageKeeper(
        settings.model_copy(update={"private_image_check": False}),
        credentials=None,
        clock=clock,
        check=private,
    )
    await off.start()
    await off.admit(IMAGE, None)


async def test_an_unreadable_record_stops_the_start(
    settings: NodeSettings, clock: FakeClock
) -> None:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    (settings.state_dir / RECORD_FILE).write_text('{"salt": "zz"}')
    keeper = ImageKeeper(settings, credentials=None, clock=clock, check=Registry())
    with pytest.raises(ConfigError, match=r"TUNEPLANE_NODE_STATE_DIR: .* not a private-image"):
        await keeper.start()


class NodeFile:
    """The node's registry auth file, as the keeper sees it."""

    def __init__(self, found: RegistryAuth | None) -> None:
        self.found = found
        self.asked: list[str] = []

    def lookup(self, registry: str) -> RegistryAuth | None:
        self.asked.append(registry)
        return self.found


async def test_the_launchs_credentials_come_first_then_the_node_files(
    settings: NodeSettings, clock: FakeClock
) -> None:
    node_file = NodeFile(OTHER)
    keeper = ImageKeeper(settings, credentials=node_file, clock=clock, check=Registry())
    assert await keeper.credentials(launch("own", auth=RIGHT)) == RIGHT
    assert await keeper.credentials(launch("none")) == OTHER
    assert node_file.asked == ["registry.test"]
    node_file.found = None
    assert await keeper.credentials(launch("anonymous")) is None


async def test_pull_policy_always_pulls_a_present_tag_and_never_a_digest(
    service: JobService, fake: FakeRuntime
) -> None:
    assert isinstance(await service.launch(launch("a", policy=ALWAYS)), Pulling)
    await fake.pulling.wait()
    fake.pull_of(IMAGE).finish()
    await settle()
    pinned = f"registry.test/trainer@sha256:{'b' * 64}"
    fake.images.add(pinned)
    assert isinstance(await service.launch(launch("b", image=pinned, policy=ALWAYS)), Started)
    assert [pull.image for pull in fake.pulls] == [IMAGE]


def test_a_credential_shows_nowhere_in_a_repr() -> None:
    request = launch("r", auth=RIGHT)
    for shown in (repr(RIGHT), str(RIGHT), repr(request), f"{request}"):
        assert RIGHT.password not in shown and RIGHT.username not in shown
    assert "source='launch'" in repr(RIGHT)


def test_the_record_file_is_json_of_hashes(tmp_path: Path) -> None:
    auth = RegistryAuth(identity_token="tok")
    assert auth.fingerprint(b"a") != auth.fingerprint(b"b")  # salted
    assert len(auth.fingerprint(b"a")) == 64 and json.dumps(auth.fingerprint(b"a"))


async def test_a_record_the_disk_refuses_still_holds_until_a_restart(
    service: JobService,
    fake: FakeRuntime,
    settings: NodeSettings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await service.images.start()
    # Where the record's temporary file goes, a directory: the write fails (even as root).
    (settings.state_dir / f".{RECORD_FILE}.{os.getpid()}.tmp").mkdir(parents=True)
    await pull_then_run(service, fake, "first", RIGHT)  # the launch still runs
    assert "private-image record" in caplog.text and "not written" in caplog.text
    assert not (settings.state_dir / RECORD_FILE).exists()
    with pytest.raises(ImageAccessDenied):
        await service.launch(launch("second"))
