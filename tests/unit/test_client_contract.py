"""The consoles' client against the contract (`tuneplane_node.wire`, the node's one
definition of every answer): every field of every answer, both ways; the words of its
enums; its times; an exception class for every error code.

The client is hand-written, not generated (its classes keep a console's conveniences:
`Jobs.apply`, `JobState.pending`, tolerant reading) and ships alone, without `wire`
(docs/design.md, "The client and the contract"): this test is what keeps it from
drifting, as it once did (`JobState` lacked ``pending_rate_bytes_per_s``)."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import re
import types
import typing
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Any

import pytest

from tuneplane_node import errors as node_errors
from tuneplane_node.client import AsyncNodeClient, Container, NodeClient, words
from tuneplane_node.client import answers as client
from tuneplane_node.client import errors as client_errors
from tuneplane_node.client import images as client_images
from tuneplane_node.client import volumes as client_volumes
from tuneplane_node.wire import answers, container, images, requests, stats, volumes
from tuneplane_node.wire.fields import Words

# Each class of the client, and the shape(s) of the contract it reads (a launch answers
# one of five; observe's state is a container's, a stopped one's or a pending launch's).
SHAPES: dict[type[client.Answer], tuple[Any, ...]] = {
    client.JobState: (answers.StateJson, answers.StoppedStateJson, answers.PendingStateJson),
    client.Stopping: (answers.StoppingJson,),
    client.Launched: (
        answers.StartedJson,
        answers.RunningJson,
        answers.ExitedJson,
        answers.PullingJson,
        answers.PendingJson,
    ),
    client.NodeState: (answers.NodeStateJson,),
    client.Runtime: (answers.RuntimeJson,),
    client.ImageStore: (answers.ImageStoreJson,),
    client.Conditions: (answers.ConditionsJson,),
    client.JobDisk: (answers.JobDiskJson,),
    client.Isolation: (answers.IsolationJson,),
    client.Disk: (answers.DiskJson,),
    client.Cache: (answers.CacheJson,),
    client.PendingPull: (answers.PendingPullJson,),
    client.Process: (answers.ProcessJson,),
    client.Card: (answers.CardJson,),
    client.CardFault: (answers.CardFaultJson,),
    client.Breaker: (answers.BreakerJson,),
    client.CardState: (answers.CardStateJson,),
    client.Probe: (answers.ProbeJson,),
    client.Health: (answers.HealthJson,),
    client.Notice: (answers.NoticeJson,),
    client.NodeEvent: (answers.NodeEventJson,),
    client.Filesystem: (answers.FilesystemJson,),
    client.LocalDisk: (answers.LocalDiskJson,),
    client.Fabric: (answers.FabricJson,),
    client.Inventory: (answers.InventoryJson,),
    client.ProcessMemory: (stats.ProcessMemoryJson,),
    client.CardUsage: (stats.CardUsageJson,),
    client.Usage: (stats.AbsentJson, stats.UsageJson),
    client.Logs: (answers.LogsJson,),
    client.Jobs: (answers.JobsJson,),
    client_images.Image: (images.ImageJson,),
    client_images.ImagePull: (images.PullJson,),
    client_images.Images: (images.ImagesJson,),
    client_images.Prefetch: (images.PrefetchJson,),
    client_images.RemovedImage: (answers.RemovedImageJson,),
    client_images.ImageGc: (answers.ImageGcJson,),
    client.VolumeStore: (volumes.VolumeStoreJson,),
    client_volumes.VolumeEntry: (volumes.VolumeEntryJson,),
    client_volumes.VolumeFill: (volumes.VolumeFillJson,),
    client_volumes.Volumes: (volumes.VolumesJson,),
    client_volumes.VolumePull: (volumes.VolumePullJson,),
    client_volumes.EvictedVolume: (volumes.EvictedVolumeJson,),
    client_volumes.VolumeGc: (volumes.VolumeGcJson,),
}
# Shapes with no class of their own, and what the client makes of them instead.
NO_CLASS = {
    "ObserveJson": "states(): a dict of JobState",
    "StatsJson": "usages(): a dict of Usage",
    "ReapJson": "removed_count(): an int",
    "OkJson": "nothing(): None",
    "ErrorJson": "a NodeError of its code",
    "FieldErrorJson": "errors.FieldError",
    "GpuFieldsJson": "part of HealthJson",
}
TIMES = ("_at", "since", "deadline")  # the contract's RFC 3339 times, by their names


def shapes_of_the_contract() -> dict[str, Any]:
    """Every TypedDict of the contract's answers, by name (the private halves aside)."""
    found = {}
    for module in (answers, images, stats, volumes):
        for name, value in vars(module).items():
            if typing.is_typeddict(value) and not name.startswith("_"):
                found[name] = value
    return found


def contract_fields(shapes: tuple[Any, ...]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for shape in shapes:
        fields |= typing.get_type_hints(shape, include_extras=True)
    return fields


def client_fields(cls: type[client.Answer]) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {field.name: hints[field.name] for field in dataclasses.fields(cls)}  # type: ignore[arg-type]


@pytest.mark.parametrize("cls", list(SHAPES), ids=lambda cls: cls.__name__)
def test_each_class_has_every_field_of_its_shape_and_no_other(cls: type[client.Answer]) -> None:
    mine, theirs = set(client_fields(cls)), set(contract_fields(SHAPES[cls]))
    assert sorted(theirs - mine) == [], "fields of the contract the client lacks"
    assert sorted(mine - theirs) == [], "fields of the client the contract does not have"


def test_every_shape_of_the_contract_is_read_by_the_client() -> None:
    read = {shape.__name__ for shapes in SHAPES.values() for shape in shapes}
    assert set(shapes_of_the_contract()) == read | set(NO_CLASS)
    assert not read & set(NO_CLASS)


def words_of(annotation: Any) -> Words | None:
    """The `Words` of a contract annotation (``Annotated[str, Words]``, maybe ``| None``)."""
    if typing.get_origin(annotation) is typing.Annotated:
        return next((m for m in annotation.__metadata__ if isinstance(m, Words)), None)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return next(filter(None, map(words_of, typing.get_args(annotation))), None)
    return None


def enum_of(annotation: Any) -> type[Enum] | None:
    args = typing.get_args(annotation) or (annotation,)
    return next((a for a in args if isinstance(a, type) and issubclass(a, Enum)), None)


@pytest.mark.parametrize("cls", list(SHAPES), ids=lambda cls: cls.__name__)
def test_each_word_of_the_contract_is_an_enum_of_its_words(cls: type[client.Answer]) -> None:
    mine = client_fields(cls)
    for name, annotation in contract_fields(SHAPES[cls]).items():
        said = words_of(annotation)
        kind = enum_of(mine[name])
        if said is None:
            assert kind is None, f"{cls.__name__}.{name} is an enum the contract does not say"
            continue
        assert kind is not None, f"{cls.__name__}.{name}: the contract says {said.name}"
        assert kind.__name__ == said.name
        assert [member.value for member in kind] == list(said.values)


@pytest.mark.parametrize("cls", list(SHAPES), ids=lambda cls: cls.__name__)
def test_each_time_of_the_contract_is_a_datetime(cls: type[client.Answer]) -> None:
    for name, annotation in client_fields(cls).items():
        is_time = name.endswith(TIMES)
        assert (datetime in typing.get_args(annotation)) == is_time, f"{cls.__name__}.{name}"


def test_a_word_compares_as_its_string_and_a_newer_word_stays_a_string() -> None:
    state = client.build(client.JobState, {"status": "running", "pending_phase": "queued"})
    assert state.status == "running" and state.status is words.JobStatus.RUNNING
    assert f"{state.status}" == "running" and state.running
    assert state.pending_phase == "queued"  # a newer node's phase, as it sent it


@pytest.mark.parametrize(
    ("text", "when"),
    [
        ("2026-01-02T03:04:05Z", datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)),
        ("2026-01-02T03:04:05.123456789Z", datetime(2026, 1, 2, 3, 4, 5, 123456, timezone.utc)),
        ("2026-01-02T03:04:05.5+00:00", datetime(2026, 1, 2, 3, 4, 5, 500000, timezone.utc)),
        ("yesterday", None),
        ("2026-01-02T03:04:05", None),  # no zone: not RFC 3339, no guess
    ],
)
def test_times_are_read_as_aware_datetimes(text: str, when: datetime | None) -> None:
    state = client.build(client.JobState, {"created_at": text})
    assert state.created_at == when
    assert state.raw["created_at"] == text  # the node's text stays in raw


def node_codes() -> dict[str, set[int]]:
    """The node's code table: each code its errors carry, and their statuses."""
    found: dict[str, set[int]] = {}
    todo: list[type[node_errors.NodeError]] = [node_errors.NodeError]
    while todo:
        kind = todo.pop()
        todo.extend(kind.__subclasses__())
        if isinstance(kind.__dict__.get("code", kind.code), str):
            found.setdefault(kind.code, set()).add(kind.status)
    return found


@pytest.mark.parametrize("code", sorted(node_codes()))
def test_every_code_of_the_node_has_its_class(code: str) -> None:
    cls = client_errors.BY_CODE.get(code)
    assert cls is not None, f"no client class for {code}"
    (status,) = node_codes()[code]
    family = client_errors.BY_STATUS.get(
        status, client_errors.RequestError if status < 500 else client_errors.ServerError
    )
    assert issubclass(cls, family), f"{cls.__name__} is not a {family.__name__}"
    error = client_errors.refusal(status, b'{"detail": "x", "code": "%s"}' % code.encode(), url="u")
    assert type(error) is cls and error.code == code


def test_the_codes_the_issue_named_have_classes() -> None:
    assert client_errors.BY_CODE["gpu_not_ready"] is client_errors.GpuNotReady
    assert client_errors.BY_CODE["insufficient_scope"] is client_errors.InsufficientScope
    assert client_errors.BY_CODE["run_conflict"] is client_errors.RunConflict


@pytest.mark.parametrize("cls", [NodeClient, AsyncNodeClient], ids=lambda cls: cls.__name__)
def test_every_public_method_says_what_it_does_with_an_example(cls: type) -> None:
    public = [name for name in vars(cls) if not name.startswith("_") and callable(vars(cls)[name])]
    assert len(public) >= 20  # the walk saw the verbs
    lacking = [name for name in public if "Example:" not in (getattr(cls, name).__doc__ or "")]
    assert lacking == []


# --- the launch's fields ------------------------------------------------------------------

# Launch fields of the contract the client carries under another name than its own.
CARRIED_ELSEWHERE = {
    "container.gpus": "launch(requested_gpus=...): the node reads container.gpus for its length",
}
CONSOLE = Path(__file__).resolve().parents[2] / "clients/python/examples/every_field.py"


def every_field() -> Container:
    """clients/python/examples/every_field.py's launch: a console's, every field set."""
    spec = importlib.util.spec_from_file_location("every_field", CONSOLE)
    assert spec is not None and spec.loader is not None
    console = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(console)
    made: Container = console.spec("every", "secret")
    return made


def test_the_container_carries_every_launch_field_of_the_contract_as_a_typed_field() -> None:
    """A field the contract gains fails here until `Container` carries it: a console
    then sets it typed, not through ``fields={...}``, which no type checker reads."""
    mine = {field.name for field in dataclasses.fields(Container)} - {"fields"}
    theirs = set(container.CONTAINER_FIELDS)
    elsewhere = {name.removeprefix("container.") for name in CARRIED_ELSEWHERE}
    assert sorted(theirs - mine - elsewhere) == [], "launch fields the client's Container lacks"
    assert sorted(mine - theirs) == [], "Container fields the contract does not have"
    said = set(inspect.signature(NodeClient.launch).parameters) - {"self"}
    assert said == set(requests.LAUNCH_FIELDS), "launch()'s parameters against the launch body"
    assert said == set(inspect.signature(AsyncNodeClient.launch).parameters) - {"self"}


def test_every_typed_field_reaches_the_node_as_it_reads_it() -> None:
    """The body a Container with every field set makes is a launch the node accepts
    (no 422), each field as the console gave it."""
    body = every_field().to_json()
    assert set(body) == set(container.CONTAINER_FIELDS) - {"gpus"}
    launch = requests.parse_launch({"run_id": "ft-every", "container": body, "relaunch": False})
    assert launch.pull_policy == "if_not_present" and launch.relaunch is False
    assert body["volumes"][1] == {
        "source": "registry.example/tokenizers:7b",
        "path": "/models/tokenizer",
    }
    assert body["volumes"][0]["sha256"] == "4f1c" * 16
    assert body["scratch"] == {"path": "/scratch", "size": "200g"}
    assert body["mounts"] == [["/srv/tuneplane/ckpt", "/ckpt", False]]
    assert body["disk_limit"] == "50g" and body["read_only_root"] is True


def test_a_field_left_at_its_default_is_not_sent() -> None:
    assert Container(image="trainer:1").to_json() == {"image": "trainer:1"}


def test_the_client_section_of_the_api_docs_names_every_public_method_and_launch_type() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs/api.md").read_text()
    section = doc[doc.index("## A client for consoles") : doc.index("## API reference")]
    public = {
        name
        for cls in (NodeClient, AsyncNodeClient)
        for name in vars(cls)
        if not name.startswith("_")
    }
    named = public | {"Mount", "Scratch", "Volume", "Container"}
    unnamed = [name for name in sorted(named) if not re.search(rf"[`.]{name}[`(]", section)]
    assert unnamed == [], "docs/api.md's client section does not name these"
