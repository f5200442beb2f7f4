"""The wire's parsers: what a console written for 0.3.15 sends is read, every field is
checked and bounded, and a bad one is refused by name."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import pytest

from tests.support.console import console_0315
from tuneplane_node.errors import InvalidField
from tuneplane_node.jobs import retries
from tuneplane_node.wire.container import CHECKED, CONTAINER
from tuneplane_node.wire.fields import Field
from tuneplane_node.wire.requests import parse_launch
from tuneplane_node.wire.values import LABEL_RUN_ID, Mount, RegistryAuth
from tuneplane_node.wire.verbs import (
    LOGS,
    MAX_TAIL,
    parse_drain,
    parse_follow,
    parse_grace,
    parse_logs,
    parse_max_age,
    parse_observe,
    parse_query,
    parse_reap,
    parse_ref,
    parse_refs,
    parse_remove,
    parse_signal_body,
    parse_since,
    parse_stop_body,
    parse_tail,
    parse_uncordon,
)

# --- what 0.3.15 consoles send -------------------------------------------------------------

CONSOLE_0315_EMPTY = console_0315("r-123")


def test_a_0315_spec_with_every_field_and_empty_strings_is_accepted() -> None:
    request = parse_launch(CONSOLE_0315_EMPTY)

    spec = request.container
    assert (request.run_id, request.requested_gpus, request.ref) == ("r-123", 2, "tuneplane-r-123")
    assert spec.command == ("python", "-m", "train") and spec.image == "registry/trainer:1"
    assert spec.network == "host"
    assert (spec.workdir, spec.user, spec.shm_size, spec.memory_limit) == (None,) * 4
    assert spec.cpu_limit is None
    assert spec.labels == {LABEL_RUN_ID: "r-123"}


def container(**fields: Any) -> dict[str, Any]:
    return {**CONSOLE_0315_EMPTY, "container": {**CONSOLE_0315_EMPTY["container"], **fields}}


@pytest.mark.parametrize(
    ("given", "cpus"),
    [("", None), ("2", 2.0), ("0.5", 0.5), (" 4 ", 4.0), (8, 8.0), (1.5, 1.5), (None, None)],
)
def test_cpu_limit_is_a_number_or_0315s_string(given: object, cpus: float | None) -> None:
    assert parse_launch(container(cpu_limit=given)).container.cpu_limit == cpus


@pytest.mark.parametrize("given", ["two", "-1", "0", 0, -2.5, "1e400", "inf", "nan", True, [2]])
def test_a_bad_cpu_limit_names_the_field(given: object) -> None:
    with pytest.raises(InvalidField, match=r"^container\.cpu_limit: "):
        parse_launch(container(cpu_limit=given))


def test_a_full_0315_spec_reaches_the_container() -> None:
    request = parse_launch(
        container(
            name="tuneplane-custom",
            env={"EPOCHS": 3, "LR": "0.1"},
            mounts=[["/data/r-123", "/work", False], {"host": "/models", "container": "/m"}],
            labels={"tuneplane.user": "alice"},
            workdir="/work",
            shm_size="16g",
            memory_limit="64G",
            network="bridge",
            user="1000:1000",
        )
    )
    spec = request.container
    assert spec.name == "tuneplane-custom"
    assert spec.env == {"EPOCHS": "3", "LR": "0.1"}
    assert spec.mounts == (Mount("/data/r-123", "/work", False), Mount("/models", "/m", False))
    assert spec.labels == {"tuneplane.user": "alice", LABEL_RUN_ID: "r-123"}
    assert (spec.workdir, spec.shm_size, spec.memory_limit) == ("/work", "16g", "64g")
    assert (spec.network, spec.user) == ("bridge", "1000:1000")


@pytest.mark.parametrize("field", CONTAINER.fields, ids=lambda field: field.name)
def test_each_container_field_is_refused_by_the_name_it_is_declared_with(field: Field) -> None:
    with pytest.raises(InvalidField) as refused:
        parse_launch(container(**{field.name: {"k": {"deep": 1}}}))
    assert refused.value.field.split(".")[:2] == ["container", field.name]


def test_of_two_bad_fields_the_one_checked_first_is_named() -> None:
    """Which of two bad fields a 422 names does not move: gpus, labels, then the table."""
    assert [field.name for field in CHECKED][:2] == ["labels", "name"]
    bad = {"gpus": 2, "labels": {"com.docker.x": "1"}, "name": "a/b", "user": "a b"}
    for name in ("gpus", "labels", "name", "user"):
        with pytest.raises(InvalidField, match=rf"^container\.{name}\b"):
            parse_launch(container(**bad))
        del bad[name]


def test_requested_gpus_falls_back_to_the_length_of_container_gpus() -> None:
    body = {"run_id": "a", "container": {"image": "x", "gpus": [5, 6, 7]}}
    assert parse_launch(body).requested_gpus == 3
    assert parse_launch({**body, "requested_gpus": 1}).requested_gpus == 1
    assert (
        parse_launch({"run_id": "a", "container": {"image": "x", "gpus": ""}}).requested_gpus == 0
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"container": {"image": "x"}}, "run_id"),
        ({"run_id": "a"}, "container"),
        ({"run_id": "a", "container": []}, "container"),
        ({"run_id": "a", "container": {}}, "container.image"),
        ({"run_id": "a" * 201, "container": {"image": "x"}}, "run_id"),
        ({"run_id": "a", "container": {"image": "x", "command": "rm -rf /"}}, "container.command"),
        ({"run_id": "a", "container": {"image": "x", "command": ["a", 1]}}, "container.command"),
        ({"run_id": "a", "requested_gpus": -1, "container": {"image": "x"}}, "requested_gpus"),
        ({"run_id": "a", "requested_gpus": 1.5, "container": {"image": "x"}}, "requested_gpus"),
        ({"run_id": "a", "requested_gpus": True, "container": {"image": "x"}}, "requested_gpus"),
        ({"run_id": "a", "requested_gpus": 10**30, "container": {"image": "x"}}, "requested_gpus"),
        ({"run_id": "a", "container": {"image": "x", "gpus": 2}}, "container.gpus"),
        (
            {"run_id": "a", "container": {"image": "x", "mounts": [["rel", "/x"]]}},
            "container.mounts[0]",
        ),
        ({"run_id": "a", "container": {"image": "x", "mounts": [["/a"]]}}, "container.mounts[0]"),
        (
            {"run_id": "a", "container": {"image": "x", "mounts": [["/a", "/b", "yes"]]}},
            "container.mounts[0]",
        ),
        ({"run_id": "a", "container": {"image": "x", "mounts": {"/a": "/b"}}}, "container.mounts"),
        (
            {"run_id": "a", "container": {"image": "x", "labels": {"tuneplane.gpus": "0"}}},
            "container.labels",
        ),
        (
            {"run_id": "a", "container": {"image": "x", "labels": {"tuneplane.run-id": "b"}}},
            "container.labels",
        ),
        ({"run_id": "a", "container": {"image": "x", "env": {"A": None}}}, "container.env.A"),
        ({"run_id": "a", "container": {"image": "x", "env": ["A=1"]}}, "container.env"),
        (
            {"run_id": "a", "container": {"image": "x", "memory_limit": "lots"}},
            "container.memory_limit",
        ),
        ({"run_id": "a", "container": {"image": "x", "shm_size": "1g\n"}}, "container.shm_size"),
        ({"run_id": "a", "container": {"image": "x", "name": "abc\n"}}, "container.name"),
        ({"run_id": "a", "container": {"image": "x", "name": "-abc"}}, "container.name"),
        ({"run_id": "a", "container": {"image": "x", "name": "a/b"}}, "container.name"),
        ({"run_id": "a", "container": {"image": "x\x00"}}, "container.image"),
        ({"run_id": "a", "container": {"image": "x", "comand": ["/bin/true"]}}, "container.comand"),
        ({"run_id": "a", "privileged": True, "container": {"image": "x"}}, "privileged"),
        (
            {"run_id": "a", "container": {"image": "x", "devices": ["/dev/sda"]}},
            "container.devices",
        ),
        ({"run_id": "a", "container": {"image": "x", "cap_add": ["ALL"]}}, "container.cap_add"),
        (
            {"run_id": "a", "container": {"image": "x", "name": "a" * 12 + "0" * 52}},
            "container.name",
        ),
        ({"run_id": "a", "container": {"image": "x", "name": "deadbeef0123"}}, "container.name"),
        (
            {"run_id": "a", "container": {"image": "x", "network": "container:abc"}},
            "container.network",
        ),
        ({"run_id": "a", "container": {"image": "x", "network": "Host"}}, "container.network"),
        (
            {"run_id": "a", "container": {"image": "x", "mounts": [["/a/../etc", "/b"]]}},
            "container.mounts[0]",
        ),
        (
            {"run_id": "a", "container": {"image": "x", "mounts": [["/a", "/b/.."]]}},
            "container.mounts[0]",
        ),
        (
            {"run_id": "a", "container": {"image": "x", "mounts": [["/a", "/b"]] * 65}},
            "container.mounts",
        ),
        ({"run_id": "a", "container": {"image": "x", "workdir": "relative"}}, "container.workdir"),
        ({"run_id": "a", "container": {"image": "x", "user": "root; rm -rf /"}}, "container.user"),
        (
            {"run_id": "a", "container": {"image": "x", "memory_limit": "1k"}},
            "container.memory_limit",
        ),
        (
            {"run_id": "a", "container": {"image": "x", "shm_size": "2000000g"}},
            "container.shm_size",
        ),
        (
            {"run_id": "a", "container": {"image": "x", "shm_size": -(10**400)}},
            "container.shm_size",  # hypothesis found it: min() kept it, float() overflowed
        ),
        ({"run_id": "a", "container": {"image": "x", "env": {"A=B": "1"}}}, "container.env.A=B"),
        (
            {
                "run_id": "a",
                "container": {"image": "x", "env": {f"V{i}": "1" for i in range(1001)}},
            },
            "container.env",
        ),
        ({"run_id": "a", "container": {"image": "x", "command": ["a\x00b"]}}, "container.command"),
        ({"run_id": "a\nb", "container": {"image": "x"}}, "run_id"),
    ],
)
def test_a_bad_launch_is_refused_naming_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidField) as refused:
        parse_launch(body)
    assert refused.value.field == field
    assert refused.value.message.startswith(f"{field}: ")


@pytest.mark.parametrize(
    "image",
    [
        "UPPER/Case:1",
        "a b",
        "--help",
        "../containers/tuneplane-x",
        "/abs/path",
        "http://registry/x",
        "x:",
        "x@sha256:short",
        "x@sha256:" + "AB" * 32,  # the engines take lower-case hex only
        "x@md5:" + "ab" * 16,  # nor a hash they do not have (a 400, once a 502)
        "registry:5000//x",
        "x" * 256,
        "[::1]:5000/x:1",  # docker 20.10 refuses a bracketed IPv6 host: a 502, once
        "[A]:01/x:1",  # the fuzz's find on /node/v1/images/pull
        # 251 characters, 261 once docker.io/ is added: the engines count that (a 502, once)
        "a/" + "b" * 249 + ":1",
        "b" * 240,  # docker.io/library/ makes it 258
        "r.io:65536/x",  # no such port
        "r.io:1127293092/x",
    ],
)
def test_an_image_that_is_not_a_reference_is_refused_before_the_engine(image: str) -> None:
    with pytest.raises(InvalidField, match=r"^container\.image: must be an image reference"):
        parse_launch({"run_id": "a", "container": {"image": image}})


@pytest.mark.parametrize(
    "image",
    [
        "busybox",
        "tuneplane-test/busybox:1",
        "127.0.0.1:5000/tuneplane-test/big:1",
        "registry.example.com/team/trainer:v1.2-cuda12",
        "localhost/a__b.c-d/e",
        "UPPER.example.com/x",
        "x@sha256:" + "ab" * 32,
        "x:1@sha256:" + "ab" * 32,
        "a/" + "b" * 243,  # docker.io/a/...: 255 characters, the engines' most
        "b" * 237,  # docker.io/library/...: 255
        "r.io/" + "b" * 250,  # a host of its own: counted as given
        "r.io:65535/x",
    ],
)
def test_image_references_of_the_grammar_are_accepted(image: str) -> None:
    assert parse_launch({"run_id": "a", "container": {"image": image}}).container.image == image


@pytest.mark.parametrize("network", ["host", "bridge", "none", ""])
def test_networks_a_job_may_have(network: str) -> None:
    spec = parse_launch({"run_id": "a", "container": {"image": "x", "network": network}}).container
    assert spec.network == (network or "host")


def test_a_name_that_only_starts_like_hex_is_a_name() -> None:
    body = {"run_id": "a", "container": {"image": "x", "name": "abc123def456-run"}}
    assert parse_launch(body).container.name == "abc123def456-run"


def test_a_run_id_the_name_cannot_hold_gets_a_safe_name() -> None:
    request = parse_launch({"run_id": "user/run 1", "container": {"image": "x"}})
    assert request.ref.startswith("tuneplane-user-run-1-")
    assert request.container.labels[LABEL_RUN_ID] == "user/run 1"


@pytest.mark.parametrize(
    ("body", "ok"),
    [
        ({"refs": []}, True),
        ({"refs": ["a", "b"]}, True),
        ({"refs": "a"}, False),
        ({"refs": ["a", ""]}, False),
        ({"refs": ["a", 1]}, False),
        ({"refs": ["x" * 301]}, False),
        ({"refs": ["a"] * 10_001}, False),
        ({}, False),
    ],
)
def test_refs(body: dict[str, Any], ok: bool) -> None:
    if ok:
        assert parse_refs(body) == body["refs"]
    else:
        with pytest.raises(InvalidField, match=r"^refs: "):
            parse_refs(body)


def test_a_ref_is_a_non_empty_string() -> None:
    assert parse_ref({"ref": "tuneplane-a"}) == "tuneplane-a"
    for body in ({}, {"ref": ""}, {"ref": 5}, {"ref": "x" * 301}):
        with pytest.raises(InvalidField, match=r"^ref: "):
            parse_ref(body)


@pytest.mark.parametrize(
    "value", [-1, "10", True, math.inf, math.nan, 1e308, 10**401, 3650 * 86400 + 1, [1]]
)
def test_bad_ages_name_the_field(value: object) -> None:
    with pytest.raises(InvalidField, match=r"^max_age_s: "):
        parse_max_age({"max_age_s": value})


@pytest.mark.parametrize("value", [-0.5, 1e308, 30 * 86400 + 1, "5", None.__class__])
def test_bad_grace_periods_name_the_field(value: object) -> None:
    with pytest.raises(InvalidField, match=r"^timeout: must be"):
        parse_grace({"timeout": value})


def test_seconds_within_their_bounds() -> None:
    assert parse_grace({}) is None
    assert parse_grace({"timeout": 0}) == 0.0
    assert parse_grace({"timeout": 1_000_000}) == 1_000_000.0  # 11.6 days: allowed
    assert parse_max_age({"max_age_s": 2.5}) == 2.5


@pytest.mark.parametrize("value", ["0", "100001", "ten", "-1", "²", "1.5", " 5"])
def test_a_bad_tail_names_the_field(value: str) -> None:
    with pytest.raises(InvalidField, match=r"^tail: "):
        parse_tail(value)


def test_tail() -> None:
    assert parse_tail(None) == parse_tail("") == 2000
    assert parse_tail("1") == 1 and parse_tail(str(MAX_TAIL)) == MAX_TAIL


@pytest.mark.parametrize(
    ("value", "moment"),
    [
        ("2026-11-30T12:00:00Z", datetime(2026, 11, 30, 12, tzinfo=timezone.utc)),
        (
            "2026-11-30T13:00:00.5+01:00",
            datetime(2026, 11, 30, 12, 0, 0, 500000, tzinfo=timezone.utc),
        ),
        ("1796040000", datetime(2026, 11, 30, 12, tzinfo=timezone.utc)),
        ("1796040000.25", datetime(2026, 11, 30, 12, 0, 0, 250000, tzinfo=timezone.utc)),
        ("1.79604e9", datetime(2026, 11, 30, 12, tzinfo=timezone.utc)),  # a JSON number's
        ("2026-11-30", datetime(2026, 11, 30, tzinfo=timezone.utc)),  # a date: its midnight
        ("2026-11-30T12:00:00", datetime(2026, 11, 30, 12, tzinfo=timezone.utc)),  # UTC
        ("", None),
        (None, None),
    ],
)
def test_since_is_an_rfc3339_time_or_epoch_seconds(value: str | None, moment: Any) -> None:
    assert parse_since(value) == moment


@pytest.mark.parametrize(
    "value",
    ["yesterday", "-5", "inf", "nan", "1_0", " 10", "2026-13-40T00:00:00Z", "9" * 41, "²"],
)
def test_a_bad_since_names_the_field(value: str) -> None:
    with pytest.raises(InvalidField, match=r"^since: "):
        parse_since(value)


@pytest.mark.parametrize(
    ("given", "wanted"),
    [
        (None, False),
        ("", False),
        ("1", True),
        ("true", True),
        ("TRUE", True),
        ("0", False),
        ("false", False),
    ],
)
def test_follow_is_a_yes_or_a_no(given: str | None, wanted: bool) -> None:
    assert parse_follow(given) is wanted


@pytest.mark.parametrize("given", ["yes", "2", "on", "1.0", "tru"])
def test_any_other_follow_is_refused_by_name(given: str) -> None:
    with pytest.raises(InvalidField) as refused:
        parse_follow(given)
    assert refused.value.field == "follow"


# --- the job is untrusted: what a launch may not ask for ----------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "com.docker.compose.project",
        "io.containers.autoupdate",
        "org.opencontainers.x",
        "io.podman.x",
    ],
)
def test_a_label_in_an_engines_namespace_is_refused_by_name(key: str) -> None:
    with pytest.raises(InvalidField) as refused:
        parse_launch(container(labels={"team": "a", key: "registry"}))
    assert refused.value.field == f"container.labels.{key}"
    assert refused.value.reason == "the engines' own namespace"


def test_the_nodes_network_label_is_the_nodes() -> None:
    with pytest.raises(InvalidField, match=r"^container\.labels: .*tuneplane\.network"):
        parse_launch(container(labels={"tuneplane.network": "host"}))


@pytest.mark.parametrize(
    "target",
    ["/", "//", "/etc", "/etc/", "/./etc", "/proc", "/proc/1/root", "//proc/sys", "/sys/fs/cgroup",
     "/dev", "/dev/shm", "/run/nvidia-persistenced", "/run/nvidia/driver"],
)  # fmt: skip
def test_a_mount_onto_the_engines_paths_is_refused(target: str) -> None:
    with pytest.raises(InvalidField) as refused:
        parse_launch(container(mounts=[["/data", "/ok", True], ["/data", target, False]]))
    assert refused.value.field == "container.mounts[1]"
    assert refused.value.reason == (
        f"{target}: a job may not mount onto /, /etc, nor under /proc, /sys, /dev, /run/nvidia*"
    )


@pytest.mark.parametrize(
    "target", ["/etc/trainer", "/run/secrets", "/devices", "/data/proc", "/sysroot"]
)
def test_a_mount_onto_other_paths_is_kept(target: str) -> None:
    spec = parse_launch(container(mounts=[["/data", target, True]])).container
    assert spec.mounts == (Mount("/data", target, True),)


def test_a_query_parameter_given_twice_or_unknown_is_refused_by_name() -> None:
    pairs = [("ref", "a"), ("tail", "5"), ("tail", "9"), ("tial", "x")]
    with pytest.raises(InvalidField) as refused:
        parse_query(pairs, LOGS)
    assert (refused.value.field, refused.value.reason) == ("tail", "given more than once")
    assert [(e.field, e.code) for e in refused.value.errors] == [
        ("tail", "repeated_field"),
        ("tial", "unknown_field"),
    ]
    assert parse_query(pairs[:2], LOGS) == {"ref": "a", "tail": "5"}


# --- a launch's registry credentials and pull policy -------------------------------------------


@pytest.mark.parametrize(
    ("given", "auth"),
    [
        ({"username": "ci", "password": "pw"}, RegistryAuth("ci", "pw")),
        ({"identity_token": "tok"}, RegistryAuth(identity_token="tok")),
        ("", None),
        (None, None),
    ],
)
def test_registry_auth_is_a_password_or_a_token_kept_out_of_the_spec(
    given: object, auth: RegistryAuth | None
) -> None:
    request = parse_launch(container(registry_auth=given))
    assert request.auth == auth
    assert "pw" not in repr(request.container) and "tok" not in repr(request)


@pytest.mark.parametrize(
    ("given", "field"),
    [
        ({"username": "ci"}, "container.registry_auth"),
        ({"username": "ci", "password": "pw", "identity_token": "t"}, "container.registry_auth"),
        ("user:password", "container.registry_auth"),
        ({"username": "ci", "password": 7}, "container.registry_auth.password"),
        ({"username": "", "password": "pw"}, "container.registry_auth.username"),
        ({"username": "ci", "password": "p\nw"}, "container.registry_auth.password"),
        ({"identity_token": "t" * 8193}, "container.registry_auth.identity_token"),
    ],
)
def test_a_bad_registry_auth_names_the_field_and_never_its_value(given: object, field: str) -> None:
    with pytest.raises(InvalidField) as refused:
        parse_launch(container(registry_auth=given))
    assert refused.value.field == field
    assert "pw" not in refused.value.message and "user:password" not in refused.value.message


@pytest.mark.parametrize(
    ("given", "policy"), [(None, "if_not_present"), ("", "if_not_present"), ("always", "always")]
)
def test_pull_policy_defaults_to_if_not_present(given: object, policy: str) -> None:
    assert parse_launch(container(pull_policy=given)).pull_policy == policy


def test_an_unknown_pull_policy_is_refused_by_name() -> None:
    with pytest.raises(InvalidField, match=r"^container\.pull_policy: must be one of"):
        parse_launch(container(pull_policy="never"))


# --- every bad field of a request, in one refusal ------------------------------------------


def refusal(parse: Any, body: Any) -> InvalidField:
    with pytest.raises(InvalidField) as refused:
        parse(body)
    return refused.value


def listed(error: InvalidField) -> list[tuple[str, str]]:
    return [(each.field, each.code) for each in error.errors]


def test_the_spec_fingerprint_covers_every_container_field_a_console_gives() -> None:
    """A field added to the contract and left out of the fingerprint would let a retry
    change it unseen; the cards are counted by ``requested_gpus``."""
    given = {field.name for field in CONTAINER.fields if field.read is not None}
    assert set(retries.CONTAINER_FIELDS) == given


def test_a_launch_with_many_bad_fields_lists_each_and_says_the_first_as_before() -> None:
    body = {
        **container(
            comand=["x"],
            image="UPPER/Case",
            cpu_limit=0,
            env={"A=B": "1", "OK": "fine", "BAD": [1]},
            mounts=[["/data", "/data"], ["relative", "/x"], ["/d", "/proc/x"]],
        ),
        "colour": "red",
        "requested_gpus": 5000,
    }
    error = refusal(parse_launch, body)
    assert error.message.startswith("colour: unknown field; known: run_id, requested_gpus")
    assert error.code == "unknown_field"
    assert listed(error) == [
        ("colour", "unknown_field"),
        ("container.comand", "unknown_field"),
        ("requested_gpus", "out_of_range"),
        ("container.image", "invalid_field"),
        ("container.env.BAD", "invalid_field"),
        ("container.env.A=B", "invalid_field"),
        ("container.mounts[1]", "invalid_field"),
        ("container.mounts[2]", "invalid_field"),
        ("container.cpu_limit", "out_of_range"),
    ]
    assert error.errors[0].detail == error.message


def test_the_first_bad_field_is_the_one_a_single_refusal_named() -> None:
    """0.3.15's consoles read ``detail``: it is the sentence they read before."""
    error = refusal(parse_launch, container(labels={"io.podman.x": "1"}, user="-bad"))
    assert error.message == "container.labels.io.podman.x: the engines' own namespace"
    assert listed(error) == [
        ("container.labels.io.podman.x", "invalid_field"),
        ("container.user", "invalid_field"),
    ]


def test_a_missing_field_says_so() -> None:
    assert listed(refusal(parse_launch, {"container": {}})) == [
        ("run_id", "missing_field"),
        ("container.image", "missing_field"),
    ]
    assert listed(refusal(parse_launch, {"run_id": "r"})) == [("container", "missing_field")]


def test_a_body_of_thousands_of_typos_lists_the_first_hundred() -> None:
    body = {**CONSOLE_0315_EMPTY, **{f"typo{i}": 1 for i in range(5000)}}
    error = refusal(parse_launch, body)
    assert len(error.errors) == 100
    assert error.errors[-1].field == "typo99"


@pytest.mark.parametrize(
    ("parse", "body", "errors"),
    [
        (parse_stop_body, {"ref": "a", "timout": 600}, [("timout", "unknown_field")]),
        (
            parse_stop_body,
            {"timeout": -1, "signal": "SIGFOO", "warn_s": 5},
            [
                ("ref", "missing_field"),
                ("timeout", "out_of_range"),
                ("signal", "invalid_field"),
                ("warn_s", "missing_field"),
            ],
        ),
        (parse_drain, {"grace": 1}, [("grace", "unknown_field")]),
        (parse_signal_body, {"ref": ""}, [("ref", "missing_field"), ("signal", "missing_field")]),
        (parse_observe, {"ref": ["a"]}, [("ref", "unknown_field"), ("refs", "missing_field")]),
        (parse_reap, {"max_age": 5}, [("max_age", "unknown_field")]),
        (parse_remove, {"refs": ["a"]}, [("refs", "unknown_field"), ("ref", "missing_field")]),
        (parse_uncordon, {"reason": "x"}, [("reason", "unknown_field")]),
    ],
)
def test_every_verb_refuses_unknown_and_bad_fields_together(
    parse: Any, body: dict[str, Any], errors: list[tuple[str, str]]
) -> None:
    assert listed(refusal(parse, body)) == errors


@pytest.mark.parametrize(
    ("parse", "body"),
    [
        (parse_stop_body, {"ref": "tuneplane-a", "timeout": 30}),
        (parse_remove, {"ref": "tuneplane-a"}),
        (parse_observe, {"refs": ["tuneplane-a", "tuneplane-b"]}),
        (parse_reap, {"max_age_s": 3600}),
        (parse_reap, {}),
        (parse_uncordon, {}),
    ],
)
def test_0315s_bodies_are_still_read(parse: Any, body: dict[str, Any]) -> None:
    parse(body)


def test_a_logs_query_lists_every_bad_parameter() -> None:
    error = refusal(parse_logs, [("ref", "a"), ("tail", "0"), ("follow", "yes"), ("tial", "5")])
    assert listed(error) == [
        ("tial", "unknown_field"),
        ("tail", "out_of_range"),
        ("follow", "invalid_field"),
    ]
    assert parse_logs([("ref", "a"), ("tail", "5")]) == ("a", 5, None, False)
