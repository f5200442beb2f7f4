"""Private images, pull policy and the pull's credentials against the in-memory engine:
every rule, no registry, no sleeps (the registry's answer is a function of the test's,
and the recheck period passes on the fake clock)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import IMAGE, fake_settings
from tests.fakes.clock import FakeClock
from tests.fakes.gpu import FakeProbe
from tests.fakes.runtime import FakeRuntime
from tests.support.nodes import fake_node_of
from tests.support.waiting import settle, wait_until
from tests.volumeserver import LOOPBACK, FileServer
from tuneplane_node.errors import (
    ConfigError,
    ImageAccessDenied,
    InvalidField,
    PrivateRecordUnwritable,
)
from tuneplane_node.jobs import Node, PendingView, Pulling, Started
from tuneplane_node.jobs.images.keeper import RECORD_FILE, RETRY_S, ImageKeeper
from tuneplane_node.jobs.launcher import launch_request
from tuneplane_node.runtime.facts import STAGED, ImageInfo
from tuneplane_node.runtime.spec import ContainerSpec
from tuneplane_node.settings import NodeSettings
from tuneplane_node.wire.values import (
    ALWAYS,
    LABEL_RUN_ID,
    Launch,
    PrefetchRequest,
    RegistryAuth,
    Volume,
    container_name,
)

RIGHT = RegistryAuth(username="ci", password="s3cret-right")
OTHER = RegistryAuth(username="ci", password="s3cret-other")
REPOSITORY = "registry.test/trainer"


def fake_id(image: str) -> str:
    return FakeRuntime().image_id(image)


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
) -> Launch:
    spec = ContainerSpec(name=container_name(run_id), image=image, labels={LABEL_RUN_ID: run_id})
    request = Launch(run_id, 1, spec, auth=auth)
    return replace(request, pull_policy=policy) if policy else request


async def pull_then_run(
    node: Node, fake: FakeRuntime, run_id: str, auth: RegistryAuth | None
) -> None:
    """A launch whose image the engine lacks, its pull finished, its container started."""
    fake.images.discard(IMAGE)
    fake.pulling.clear()
    assert isinstance(await node.jobs.launch(launch(run_id, auth=auth)), Pulling)
    await fake.pulling.wait()
    record = node.pending.get(container_name(run_id))
    assert record is not None and record.task is not None
    fake.pull_of(IMAGE).finish()
    await record.task  # the pull recorded, the container made
    assert node.pending.get(container_name(run_id)) is None


@pytest.fixture
async def private(node: Node, fake: FakeRuntime) -> Registry:
    """A node that pulled IMAGE with RIGHT; its registry accepts RIGHT only."""
    await node.images.start()
    registry = node.images.check = Registry(RIGHT)
    await pull_then_run(node, fake, "first", RIGHT)
    registry.asked.clear()
    return registry


async def test_the_pull_gets_the_launchs_credentials(node: Node, fake: FakeRuntime) -> None:
    fake.images.discard(IMAGE)
    await node.jobs.launch(launch("r1", auth=RIGHT))
    await fake.pulling.wait()
    assert fake.pull_of(IMAGE).auth == RIGHT
    fake.pull_of(IMAGE).finish()
    await settle()


async def test_launches_with_other_credentials_do_not_share_a_pull(
    node: Node, fake: FakeRuntime
) -> None:
    fake.images.discard(IMAGE)
    for run_id, auth in (("a", RIGHT), ("b", OTHER), ("c", RIGHT), ("d", None)):
        await node.jobs.launch(launch(run_id, auth=auth))
    await settle()
    assert sorted(str(pull.auth and pull.auth.password) for pull in fake.pulls) == [
        "None", "s3cret-other", "s3cret-right",
    ]  # fmt: skip


async def test_a_cached_private_image_is_refused_without_credentials_and_nothing_is_made(
    node: Node, fake: FakeRuntime, private: Registry
) -> None:
    with pytest.raises(ImageAccessDenied, match=f"private image {IMAGE}") as refused:
        await node.jobs.launch(launch("second"))
    assert refused.value.status == 403
    assert not (await node.jobs.observe(["tuneplane-second"]))["tuneplane-second"].exists
    assert (await node.allocator.occupancy()).reserved == frozenset()
    assert private.asked == []  # no credentials: nothing to ask


async def test_the_credentials_that_pulled_it_run_it_without_asking_the_registry(
    node: Node, private: Registry
) -> None:
    assert isinstance(await node.jobs.launch(launch("again", auth=RIGHT)), Started)
    assert private.asked == []


async def test_other_credentials_run_it_when_the_registry_accepts_them_and_the_yes_is_kept(
    node: Node, private: Registry, clock: FakeClock
) -> None:
    private.accepts.add(OTHER)
    assert isinstance(await node.jobs.launch(launch("o1", auth=OTHER)), Started)
    assert isinstance(await node.jobs.launch(launch("o2", auth=OTHER)), Started)
    assert private.asked == [OTHER]  # once: the yes is kept

    private.accepts.discard(OTHER)  # revoked at the registry
    clock.advance(3600 + 1)
    with pytest.raises(ImageAccessDenied, match="does not accept"):
        await node.jobs.launch(launch("o3", auth=OTHER))


async def test_the_kept_yes_is_for_the_credentials_it_was_said_for_alone(
    node: Node, private: Registry
) -> None:
    """Issue 52: a yes kept by repository alone let any credentials run the private
    image for the recheck period once one other credential had been accepted."""
    private.accepts.add(OTHER)
    assert isinstance(await node.jobs.launch(launch("o1", auth=OTHER)), Started)
    third = RegistryAuth(username="ci", password="s3cret-third")
    with pytest.raises(ImageAccessDenied, match="does not accept"):
        await node.jobs.launch(launch("t1", auth=third))
    assert private.asked == [OTHER, third]  # asked for the third, not taken on the yes


async def test_credentials_the_registry_refuses_or_cannot_judge_are_refused(
    node: Node, private: Registry
) -> None:
    with pytest.raises(ImageAccessDenied, match="does not accept"):
        await node.jobs.launch(launch("wrong", auth=OTHER))
    private.down = True
    with pytest.raises(ImageAccessDenied, match="could not be asked"):
        await node.jobs.launch(launch("unknown", auth=OTHER))


async def test_a_relaunch_refused_its_private_image_keeps_the_exited_job(
    node: Node, fake: FakeRuntime, private: Registry
) -> None:
    """Issue 52: a relaunch is refused before the run's exited container goes (it went
    first: a relaunch without credentials left the run with nothing)."""
    exited = fake.containers["tuneplane-first"]
    fake.exit("tuneplane-first", 3)
    with pytest.raises(ImageAccessDenied):
        await node.jobs.launch(launch("first", auth=OTHER))
    assert fake.containers["tuneplane-first"] is exited and exited.exit_code == 3
    assert isinstance(await node.jobs.launch(launch("first", auth=RIGHT)), Started)


async def test_every_tag_and_digest_of_a_private_repository_is_private(
    node: Node, fake: FakeRuntime, private: Registry
) -> None:
    for image in (f"{REPOSITORY}:2", f"{REPOSITORY}@sha256:{'a' * 64}"):
        fake.images.add(image)  # however it got here
        with pytest.raises(ImageAccessDenied):
            await node.jobs.launch(launch("other-tag", image=image))


async def test_an_image_the_node_did_not_pull_is_not_checked(node: Node, private: Registry) -> None:
    elsewhere = launch("operator", image="registry.test/operators-own:1")
    node.runtime.images.add(elsewhere.container.image)  # type: ignore[attr-defined]
    assert isinstance(await node.jobs.launch(elsewhere), Started)


async def test_the_record_survives_a_restart_and_holds_no_secret(
    node: Node, private: Registry, settings: NodeSettings, clock: FakeClock
) -> None:
    text = (settings.state_dir / RECORD_FILE).read_text()
    assert RIGHT.password not in text and REPOSITORY in text

    restarted = ImageKeeper(settings.images, credentials=None, clock=clock, check=Registry())
    await restarted.start()
    info = ImageInfo(fake_id(IMAGE))
    with pytest.raises(ImageAccessDenied):
        await restarted.admit(IMAGE, info, None)
    await restarted.admit(IMAGE, info, RIGHT)  # the hash matches: the same salt was kept
    with pytest.raises(ImageAccessDenied):  # the id is recorded: any name of it
        await restarted.admit("registry.test/public:1", info, None)


async def test_a_pull_without_credentials_makes_the_repository_public_again(
    node: Node, fake: FakeRuntime, private: Registry
) -> None:
    await pull_then_run(node, fake, "public", None)
    assert isinstance(await node.jobs.launch(launch("anyone")), Started)


async def test_the_check_turned_off_runs_it_for_anyone(
    fake: FakeRuntime, settings: NodeSettings, clock: FakeClock, private: Registry
) -> None:
    off = ImageKeeper(
        settings.model_copy(update={"private_image_check": False}).images,
        credentials=None,
        clock=clock,
        check=private,
    )
    await off.start()
    await off.admit(IMAGE, ImageInfo(fake_id(IMAGE)), None)


async def test_an_unreadable_record_stops_the_start(
    settings: NodeSettings, clock: FakeClock
) -> None:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    (settings.state_dir / RECORD_FILE).write_text('{"salt": "zz"}')
    keeper = ImageKeeper(settings.images, credentials=None, clock=clock, check=Registry())
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
    keeper = ImageKeeper(settings.images, credentials=node_file, clock=clock, check=Registry())
    assert await keeper.credentials(launch_request(launch("own", auth=RIGHT))) == RIGHT
    assert await keeper.credentials(launch_request(launch("none"))) == OTHER
    assert node_file.asked == ["registry.test"]
    node_file.found = None
    assert await keeper.credentials(launch_request(launch("anonymous"))) is None


async def test_pull_policy_always_pulls_a_present_tag_and_never_a_digest(
    node: Node, fake: FakeRuntime
) -> None:
    assert isinstance(await node.jobs.launch(launch("a", policy=ALWAYS)), Pulling)
    await fake.pulling.wait()
    fake.pull_of(IMAGE).finish()
    await settle()
    pinned = f"registry.test/trainer@sha256:{'b' * 64}"
    fake.images.add(pinned)
    assert isinstance(await node.jobs.launch(launch("b", image=pinned, policy=ALWAYS)), Started)
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


async def test_a_private_pull_whose_record_cannot_be_written_is_refused_before_it_starts(
    node: Node, fake: FakeRuntime, settings: NodeSettings
) -> None:
    await node.images.start()
    fake.images.discard(IMAGE)
    # Where the record's temporary file goes, a directory: the write fails (even as root).
    (settings.state_dir / f".{RECORD_FILE}.{os.getpid()}.tmp").mkdir(parents=True)
    with pytest.raises(PrivateRecordUnwritable) as refused:
        await node.jobs.launch(launch("first", auth=RIGHT))
    assert (refused.value.status, refused.value.code) == (507, "insufficient_storage")
    assert (
        fake.pulls == []
        and not (await node.jobs.observe(["tuneplane-first"]))["tuneplane-first"].exists
    )
    assert (await node.allocator.occupancy()).reserved == frozenset()


async def test_a_record_the_disk_refuses_after_the_pull_admits_only_its_credentials_until_written(
    node: Node,
    fake: FakeRuntime,
    settings: NodeSettings,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await node.images.start()
    node.images.check = Registry(RIGHT, OTHER)  # the registry would say yes to both
    fake.images.discard(IMAGE)
    assert isinstance(await node.jobs.launch(launch("first", auth=RIGHT)), Pulling)
    await fake.pulling.wait()
    blocker = settings.state_dir / f".{RECORD_FILE}.{os.getpid()}.tmp"
    blocker.mkdir(parents=True)  # the write after the pull fails
    record = node.pending.get(container_name("first"))
    assert record is not None and record.task is not None
    fake.pull_of(IMAGE).finish()
    await record.task  # the launch still runs: the image is here
    assert caplog.text.count("not written") == 1
    with pytest.raises(ImageAccessDenied, match="not written yet"):
        await node.jobs.launch(launch("other", auth=OTHER))
    assert isinstance(await node.jobs.launch(launch("again", auth=RIGHT)), Started)

    blocker.rmdir()
    clock.advance(RETRY_S)
    await wait_until(lambda: not node.images.unwritten)
    recorded = json.loads((settings.state_dir / RECORD_FILE).read_text())["images"]
    assert recorded[REPOSITORY]["ids"] == [fake.image_id(IMAGE)]
    assert isinstance(await node.jobs.launch(launch("other", auth=OTHER)), Started)
    await node.images.close()


# --- by identity: what the engine runs, however it is spelt ----------------------------


async def test_the_container_is_made_from_the_id_its_reference_resolved_to(
    node: Node, fake: FakeRuntime
) -> None:
    assert isinstance(await node.jobs.launch(launch("by-id")), Started)
    spec = fake.containers[container_name("by-id")].spec
    assert spec.image == fake.image_id(IMAGE)  # nothing can re-point it after the check


@pytest.mark.parametrize(
    "spelling",
    ["registry.test/public:1", "registry.test/trainer:other-tag"],
    ids=["re-tagged-by-the-operator", "another-tag-of-the-id"],
)
async def test_another_name_of_a_recorded_id_is_private_too(
    node: Node, fake: FakeRuntime, private: Registry, spelling: str
) -> None:
    fake.tag(IMAGE, spelling)
    with pytest.raises(ImageAccessDenied):
        await node.jobs.launch(launch("renamed", image=spelling))
    assert container_name("renamed") not in fake.containers
    assert isinstance(await node.jobs.launch(launch("owner", image=spelling, auth=RIGHT)), Started)


async def test_registry_is_asked_about_the_recorded_repository_not_the_launchs_spelling(
    node: Node, fake: FakeRuntime, private: Registry
) -> None:
    fake.tag(IMAGE, "registry.test/public:1")
    private.accepts.add(OTHER)
    asked: list[str] = []
    check = node.images.check

    def asking(image: str, auth: RegistryAuth) -> bool:
        asked.append(image)
        return check(image, auth)

    node.images.check = asking
    assert isinstance(
        await node.jobs.launch(launch("o", image="registry.test/public:1", auth=OTHER)), Started
    )
    assert asked == [IMAGE]


async def test_credentials_for_one_registry_never_go_to_the_registry_that_holds_the_image(
    node: Node, fake: FakeRuntime, private: Registry
) -> None:
    """Issue 49, finding 3: a public registry's name resolving (podman: by digest alone) to
    another tenant's private image must not send that name's credentials (a launch's, or
    the node file's Docker Hub entry) to the private image's registry."""
    fake.tag(IMAGE, "docker.io/library/anything:1")
    private.accepts.add(OTHER)  # the other registry would say yes: it must not be asked

    with pytest.raises(ImageAccessDenied, match="another registry than the one"):
        await node.jobs.launch(launch("spelt", image="docker.io/library/anything:1", auth=OTHER))

    assert private.asked == []
    assert container_name("spelt") not in fake.containers


async def test_docker_hubs_other_spellings_are_one_repository(
    node: Node, fake: FakeRuntime
) -> None:
    await node.images.start()
    node.images.check = Registry(RIGHT)
    hub = "docker.io/tenant/private:1"
    fake.images.discard(hub)
    assert isinstance(await node.jobs.launch(launch("hub", image=hub, auth=RIGHT)), Pulling)
    await fake.pulling.wait()
    fake.pull_of(hub).finish()
    await settle()
    for spelling in ("index.docker.io/tenant/private:1", "registry-1.docker.io/tenant/private:1",
                     "tenant/private:1"):  # fmt: skip
        with pytest.raises(ImageAccessDenied):
            await node.jobs.launch(launch("spelt", image=spelling))
    assert fake.pulls[-1].image == hub  # the engine is told the canonical name


@pytest.mark.parametrize("spelling", ["d0", "0123456789ab", "cafe"])
async def test_a_hex_string_that_names_no_repository_the_node_pulled_is_refused(
    node: Node, fake: FakeRuntime, spelling: str
) -> None:
    with pytest.raises(InvalidField, match=r"container\.image: .*not an image id"):
        await node.jobs.launch(launch("hex", image=spelling))
    with pytest.raises(InvalidField, match=r"^image: "):
        await node.catalog.prefetch(PrefetchRequest(spelling))
    assert fake.calls["image_info"] == fake.calls["image_exists"] == 0  # no oracle
    assert fake.pulls == []


async def test_a_hex_name_the_node_pulled_a_repository_by_stays_a_name(
    node: Node, fake: FakeRuntime
) -> None:
    fake.images.discard("cafe")
    first = launch("first", image="docker.io/library/cafe:latest")  # spelt in full once
    assert isinstance(await node.jobs.launch(first), Pulling)
    await fake.pulling.wait()
    fake.pull_of("docker.io/library/cafe:latest").finish()
    await settle()
    assert isinstance(await node.jobs.launch(launch("again", image="cafe")), Started)


async def test_a_prefetch_of_a_private_image_without_credentials_is_403_never_present(
    node: Node, fake: FakeRuntime, private: Registry
) -> None:
    fake.tag(IMAGE, "registry.test/public:1")
    for image in (IMAGE, "registry.test/public:1"):
        with pytest.raises(ImageAccessDenied):
            await node.catalog.prefetch(PrefetchRequest(image))
    present = await node.catalog.prefetch(PrefetchRequest(IMAGE, auth=RIGHT))
    assert present.phase == "present"


async def test_the_images_list_names_an_image_by_the_reference_it_was_pulled_by(
    node: Node, fake: FakeRuntime, private: Registry
) -> None:
    fake.tag(IMAGE, "registry.test/alias:1")
    await node.jobs.launch(launch("alias", image="registry.test/alias:1", auth=RIGHT))
    (listed,) = [i for i in (await node.catalog.view()).images if i.id == fake.image_id(IMAGE)]
    assert listed.image == IMAGE and listed.private


async def test_at_start_an_image_the_ledger_says_was_pulled_privately_is_private(
    node: Node, fake: FakeRuntime, settings: NodeSettings, clock: FakeClock
) -> None:
    await node.ledger.load()
    node.ledger.record_pull(IMAGE, fake.image_id(IMAGE), clock.now(), prefetch=False, private=True)
    await node.ledger.flush()
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    leftover = settings.state_dir / f".{RECORD_FILE}.4242.tmp"
    leftover.write_text("{half")
    keeper = ImageKeeper(
        settings.images, credentials=None, clock=clock, check=Registry(RIGHT), ledger=node.ledger
    )
    await keeper.start()
    assert not leftover.exists()
    info = ImageInfo(fake.image_id(IMAGE))
    with pytest.raises(ImageAccessDenied):
        await keeper.admit("registry.test/public:1", info, None)
    await keeper.admit(IMAGE, info, RIGHT)  # its registry's yes still admits


async def test_a_pending_launch_is_made_from_the_id_its_pull_resolved_to(
    node: Node, fake: FakeRuntime
) -> None:
    """Issue 52: the pending path created its container from the image's name (what a
    tag says at create, not what was pulled and checked), and no test failed."""
    await node.images.start()
    await pull_then_run(node, fake, "pulled", None)
    assert fake.containers[container_name("pulled")].spec.image == fake.image_id(IMAGE)


@pytest.mark.slow  # a volume server on a socket
async def test_a_name_re_pointed_while_the_volumes_fill_is_admitted_again(
    fake: FakeRuntime, clock: FakeClock, probe: FakeProbe, tmp_path: Path, file_server: FileServer
) -> None:
    """A launch whose image is here waits for its volumes, then runs what its image's
    name names then: a tag re-pointed meanwhile at a private image (the operator's
    ``docker tag``) is that image, refused without its credentials (issue 52: the
    pending path resolved the name again and skipped the private rule)."""
    reach = {"volume_insecure_hosts": [file_server.host], "volume_allowed_networks": LOOPBACK}
    fake.mount_mode = STAGED  # an engine that takes volumes (none is bound here: refused)
    node = fake_node_of(fake, fake_settings(tmp_path, **reach), probe=probe, clock=clock)
    await node.start()
    try:
        node.images.check = Registry(RIGHT)
        await pull_then_run(node, fake, "owner", RIGHT)  # IMAGE is private now
        public = "registry.test/public:1"
        fake.arrived(public)
        url = file_server.add("weights", b"w" * 4096)
        file_server.stall["weights"] = held = asyncio.Event()
        request = launch("late", image=public)
        volume = Volume(url, "/models/w", hashlib.sha256(b"w" * 4096).hexdigest())
        request = replace(request, container=replace(request.container, volumes=(volume,)))
        assert isinstance(await node.jobs.launch(request), Pulling)
        fake.tag(IMAGE, public)  # re-pointed while the fill runs
        held.set()
        view = await wait_for_end(node, "tuneplane-late")
        assert view.error is not None and "private image" in view.error, view
        assert "tuneplane-late" not in fake.containers
    finally:
        for name in list(fake.containers):  # a failure's container lets its binds go
            await node.jobs.remove(name)
        await node.close()


async def wait_for_end(node: Node, ref: str) -> PendingView:
    async def ended() -> PendingView | None:
        view = (await node.jobs.observe([ref]))[ref]
        return view if isinstance(view, PendingView) and view.failed else None

    for _ in range(500):
        if (view := await ended()) is not None:
            return view
        await asyncio.sleep(0.01)
    raise AssertionError(f"{ref}: the pending launch did not end")
