"""The OpenAPI document (`wire.schema`, of the routes' declarations): the committed copy
is the generated one, it names every route the daemon serves, and its request schemas
say what the parsers accept, at every bound (a table, then hypothesis near the bounds)."""

from __future__ import annotations

import json
import runpy
from collections.abc import Callable
from typing import Any, get_args, get_origin, get_type_hints

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from tests.support.console import console_0315
from tests.support.daemons import REPO
from tuneplane_node.daemon.routes import OPERATIONS, document, routes
from tuneplane_node.errors import InvalidField, UnknownField
from tuneplane_node.sizes import MAX_SIZE
from tuneplane_node.wire import (
    container,
    images,
    maps,
    mounts,
    readers,
    requests,
    schema,
    verbs,
    volumes,
)
from tuneplane_node.wire.stats import parse_stats
from tuneplane_node.wire.values import MAX_WAIT_S, LaunchContainer

COMMITTED = REPO / "contrib" / "openapi.json"
DOCUMENT = document()
API_DOCS = runpy.run_path(str(REPO / "contrib" / "dev" / "api_docs.py"), run_name="api_docs")
QUICK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_the_committed_document_is_the_generated_one() -> None:
    assert COMMITTED.read_text() == schema.render(DOCUMENT), (
        "contrib/openapi.json is stale: .venv/bin/python contrib/dev/api_docs.py"
    )


def test_every_field_table_in_docs_api_md_is_written_from_the_declarations() -> None:
    """Each request body and query of the routes has one table, and it is the one its
    fields' declarations make: a field declared and not shown, or shown and not declared,
    fails here."""
    assert API_DOCS["table_problems"](API_DOCS["API_DOCS"].read_text()) == []
    assert API_DOCS["stale"]() == [], "run .venv/bin/python contrib/dev/api_docs.py"


def test_a_field_left_out_of_the_docs_or_added_to_them_by_hand_is_caught() -> None:
    text = API_DOCS["API_DOCS"].read_text()
    row = "| `container.user` | no | "
    assert row in text
    dropped = "".join(line for line in text.splitlines(True) if not line.startswith(row))
    added = text.replace(row, "| `container.priority` | no | Higher first. |\n" + row)
    for edited in (dropped, added):
        assert API_DOCS["with_tables"](edited) == text
    unknown = text + "\n<!-- fields: PriorityBody -->\n<!-- end fields -->\n"
    assert API_DOCS["table_problems"](unknown) == [
        "docs/api.md: a table of PriorityBody, which no route declares"
    ]
    missing = text.replace("<!-- fields: StopBody -->", "<!-- fields: RefBody -->")
    assert API_DOCS["table_problems"](missing) == [
        "docs/api.md: no table of StopBody",
        "docs/api.md: two tables of RefBody",
    ]


def test_every_route_the_daemon_serves_is_documented_and_nothing_else() -> None:
    served = {(route.method.lower(), route.path) for route in routes}  # type: ignore[attr-defined]
    documented = {(method, path) for path, ops in DOCUMENT["paths"].items() for method in ops}
    assert documented == served


@pytest.mark.slow
def test_every_schema_is_valid_json_schema_2020_12() -> None:
    assert DOCUMENT["openapi"] == "3.1.0"
    for definition in DOCUMENT["components"]["schemas"].values():
        Draft202012Validator.check_schema(definition)


def test_every_api_path_needs_the_token_and_the_protocol_header() -> None:
    for path, operations in DOCUMENT["paths"].items():
        for operation in operations.values():
            guarded = path.startswith("/node/v1/")
            assert ({"$ref": "#/components/parameters/protocol"} in operation.get(
                "parameters", [])) == guarded  # fmt: skip
            assert ("security" in operation) == (guarded or path == "/metrics")
            assert {"400", "401", "409"} <= set(operation["responses"]) or not guarded


def test_the_followed_log_is_documented_as_text() -> None:
    answer = DOCUMENT["paths"]["/node/v1/logs"]["get"]["responses"]["200"]["content"]
    assert set(answer) == {"application/json", "text/plain"}


# --- the request schemas against the parsers ------------------------------------------------


def validator(name: str) -> Draft202012Validator:
    root = {"$ref": f"#/components/schemas/{name}", "components": DOCUMENT["components"]}
    return Draft202012Validator(root)


LAUNCH = validator("LaunchBody")


def accepts(parse: Callable[[Any], object], value: Any) -> bool:
    """Whether the parser takes ``value``; a refusal must be an InvalidField (a 422)."""
    try:
        parse(value)
    except InvalidField:
        return False
    return True


def parser_accepts(body: dict[str, Any]) -> bool:
    return accepts(requests.parse_launch, body)


def launch(**container: Any) -> dict[str, Any]:
    return console_0315("r-1", 0, **container)


LONG_PATH = "/" + "a" * (readers.MAX_PATH - 1)
CASES: list[tuple[str, dict[str, Any], bool]] = [
    ("0.3.15's empty strings", launch(), True),
    ("run_id at its limit", {**launch(), "run_id": "r" * 200}, True),
    ("run_id over it", {**launch(), "run_id": "r" * 201}, False),
    ("run_id empty", {**launch(), "run_id": ""}, False),
    ("run_id with a tab", {**launch(), "run_id": "a\tb"}, False),
    ("requested_gpus at its limit", {**launch(), "requested_gpus": container.MAX_GPUS}, True),
    ("requested_gpus over it", {**launch(), "requested_gpus": container.MAX_GPUS + 1}, False),
    ("requested_gpus negative", {**launch(), "requested_gpus": -1}, False),
    ("requested_gpus true", {**launch(), "requested_gpus": True}, False),
    ("an unknown field", {**launch(), "priority": 1}, False),
    ("an unknown container field", launch(privileged=True), False),
    ("no container", {"run_id": "r-1"}, False),
    ("no image", launch(image=""), False),
    ("an upper-case path", launch(image="registry/Trainer:1"), False),
    ("an image with a unicode tag", launch(image="busybox:\u00e9"), False),  # the engine's 5xx
    # The engines' longest name (255, counted after a docker.io/ they would add) and tag.
    ("an image at its limits", launch(image="r.io/" + "b" * 250 + ":" + "t" * 127), True),
    ("a name", launch(name="job-1"), True),
    ("a name at its limit", launch(name="z" * 201), True),
    ("a name over it", launch(name="z" * 202), False),
    ("a name like an id", launch(name="abcdef012345"), False),
    ("a name with a slash", launch(name="a/b"), False),
    ("command at its count", launch(command=["x"] * container.MAX_ARGS), True),
    ("command over it", launch(command=["x"] * (container.MAX_ARGS + 1)), False),
    ("an argument at its length", launch(command=["x" * maps.MAX_VALUE]), True),
    ("an argument over it", launch(command=["x" * (maps.MAX_VALUE + 1)]), False),
    ("an argument with NUL", launch(command=["a\x00"]), False),
    ("command as a string", launch(command="python -m train"), False),
    ("an empty program", launch(command=[""]), False),  # was docker's 502
    ("an empty argument", launch(command=["echo", ""]), True),
    ("env at its count", launch(env={f"K{i}": "v" for i in range(maps.MAX_ENV)}), True),
    ("env over it", launch(env={f"K{i}": "v" for i in range(maps.MAX_ENV + 1)}), False),
    ("env with a number", launch(env={"EPOCHS": 3, "LR": 0.1}), True),
    ("env with true", launch(env={"X": True}), False),
    ("env with null", launch(env={"X": None}), False),
    ("env with '=' in a name", launch(env={"A=B": "1"}), False),
    ("env with an empty name", launch(env={"": "1"}), False),
    ("env name at its length", launch(env={"K" * maps.MAX_KEY: "1"}), True),
    ("env name over it", launch(env={"K" * (maps.MAX_KEY + 1): "1"}), False),
    ("env value over its length", launch(env={"K": "v" * (maps.MAX_VALUE + 1)}), False),
    (
        "labels at their count",
        launch(labels={f"l{i}": "v" for i in range(maps.MAX_LABELS)}),
        True,
    ),
    (
        "labels over it",
        launch(labels={f"l{i}": "v" for i in range(maps.MAX_LABELS + 1)}),
        False,
    ),
    ("gpus at its count", {**launch(gpus=[0] * container.MAX_GPUS), "requested_gpus": None}, True),
    ("gpus over it", launch(gpus=[0] * (container.MAX_GPUS + 1)), False),
    ("mounts at their count", launch(mounts=[["/a", "/b"]] * mounts.MAX_MOUNTS), True),
    ("mounts over it", launch(mounts=[["/a", "/b"]] * (mounts.MAX_MOUNTS + 1)), False),
    ("a mount read-only", launch(mounts=[["/a", "/b", True]]), True),
    ("a mount with null", launch(mounts=[["/a", "/b", None]]), False),
    ("a mount of four", launch(mounts=[["/a", "/b", True, 1]]), False),
    ("a mount object", launch(mounts=[{"host": "/a", "container": "/b"}]), True),
    ("a mount object without host", launch(mounts=[{"container": "/b"}]), False),
    ("a relative mount", launch(mounts=[["a", "/b"]]), False),
    ("a mount with ..", launch(mounts=[["/a/../etc", "/b"]]), False),
    ("a mount with ..x", launch(mounts=[["/a/..x/.y/./", "/b"]]), True),
    ("a path at its length", launch(workdir=LONG_PATH), True),
    ("a path over it", launch(workdir=LONG_PATH + "a"), False),
    ("a workdir ending in ..", launch(workdir="/a/.."), False),
    ("shm_size 1 byte", launch(shm_size=1), True),
    ("shm_size 0", launch(shm_size=0), False),
    ("shm_size 1 PiB", launch(shm_size=MAX_SIZE), True),
    ("shm_size over it", launch(shm_size=MAX_SIZE + 1), False),
    ("shm_size 16g", launch(shm_size="16g"), True),
    ("shm_size in Arabic-Indic digits", launch(shm_size="\u0661\u0666g"), False),
    ("shm_size 16 GiB", launch(shm_size="16 GiB"), False),
    ("memory_limit at 6 MiB", launch(memory_limit=container.MIN_MEMORY), True),
    ("memory_limit under it", launch(memory_limit=container.MIN_MEMORY - 1), False),
    ("cpu_limit at its limit", launch(cpu_limit=container.MAX_CPUS), True),
    ("cpu_limit over it", launch(cpu_limit=container.MAX_CPUS + 0.5), False),
    ("cpu_limit 0", launch(cpu_limit=0), False),
    ("cpu_limit as 0.3.15 says it", launch(cpu_limit=" 0.5 "), True),
    ("cpu_limit two", launch(cpu_limit="two"), False),
    ("cpu_limit true", launch(cpu_limit=True), False),
    ("network bridge", launch(network="bridge"), True),
    ("network of a container", launch(network="container:x"), False),
    ("a user and group", launch(user="1000:1000"), True),
    ("a user with a space", launch(user="a b"), False),
]


@pytest.mark.parametrize(("case", "body", "accepted"), CASES, ids=[c[0] for c in CASES])
def test_the_launch_schema_and_the_parser_agree_at_every_bound(
    case: str, body: dict[str, Any], accepted: bool
) -> None:
    assert (LAUNCH.is_valid(body), parser_accepts(body)) == (accepted, accepted)


SECONDS = [
    ("StopBody", "timeout", verbs.parse_stop_body, verbs.MAX_GRACE_S),
    ("ReapBody", "max_age_s", verbs.parse_reap, verbs.MAX_AGE_S),
    ("DrainBody", "grace_s", verbs.parse_drain, verbs.MAX_GRACE_S),
]


@pytest.mark.parametrize(("model", "field", "parse", "most"), SECONDS)
@pytest.mark.parametrize("value", [0, 1.5, "most", "over", -1, -0.5, True, "10", None])
def test_seconds_agree_with_their_parser(
    model: str, field: str, parse: Any, most: float, value: Any
) -> None:
    value = {"most": most, "over": most + 1}.get(value, value) if isinstance(value, str) else value
    body = {**({"ref": "x"} if model == "StopBody" else {}), field: value}
    assert validator(model).is_valid(body) == accepts(parse, body)


# Each verb's parser, and the least body it takes.
VERBS = [
    ("RefsBody", verbs.parse_observe, {"refs": ["a"]}),
    ("StatsBody", parse_stats, {}),
    ("StopBody", verbs.parse_stop_body, {"ref": "a"}),
    ("SignalBody", verbs.parse_signal_body, {"ref": "a", "signal": "SIGUSR1"}),
    ("RefBody", verbs.parse_remove, {"ref": "a"}),
    ("ReapBody", verbs.parse_reap, {}),
    ("CordonBody", verbs.parse_cordon, {}),
    ("DrainBody", verbs.parse_drain, {}),
    ("UncordonBody", verbs.parse_uncordon, {}),
    ("ResetBreakerBody", verbs.parse_reset_breaker, {}),
    ("PrefetchBody", images.parse_prefetch, {"image": "registry/trainer:1"}),
    ("ImageGcBody", images.parse_image_gc, {}),
    ("VolumePullBody", volumes.parse_volume_pull, {"source": "https://h/w", "sha256": "a" * 64}),
    ("VolumeGcBody", volumes.parse_volume_gc, {}),
]


@pytest.mark.parametrize(("model", "parse", "least"), VERBS)
def test_every_verb_refuses_a_field_it_does_not_have_as_its_schema_does(
    model: str, parse: Any, least: dict[str, Any]
) -> None:
    assert validator(model).is_valid(least) and accepts(parse, least)
    typo = {**least, "timout": 600}
    assert not validator(model).is_valid(typo)
    with pytest.raises(UnknownField) as refused:
        parse(typo)
    assert refused.value.field == "timout"


def test_every_body_a_route_reads_has_a_verb_parser_here() -> None:
    """A body added to a route without a row above would go unchecked for typos."""
    bodies = {op.body.name for op in OPERATIONS if op.body is not None} - {"LaunchBody"}
    assert bodies == {model for model, _, _ in VERBS}


REF_CASES = [["a"], ["a" * verbs.MAX_REF], ["a" * (verbs.MAX_REF + 1)], [""], [1], "a", []]


@pytest.mark.parametrize("refs", REF_CASES)
def test_refs_agree_with_their_parser(refs: Any) -> None:
    body = {"refs": refs}
    assert validator("RefsBody").is_valid(body) == accepts(verbs.parse_observe, body)


def test_refs_are_counted_as_the_parser_counts_them() -> None:
    body = validator("RefsBody").schema["components"]["schemas"]["RefsBody"]
    assert body["properties"]["refs"]["maxItems"] == verbs.MAX_REFS


@pytest.mark.parametrize("reason", ["", "r" * verbs.MAX_REASON, "r" * (verbs.MAX_REASON + 1), 3])
def test_a_reason_agrees_with_its_parser(reason: Any) -> None:
    body = {"reason": reason}
    assert validator("CordonBody").is_valid(body) == accepts(verbs.parse_cordon, body)


def query(name: str, path: str = "/node/v1/logs") -> Draft202012Validator:
    parameters = DOCUMENT["paths"][path]["get"]["parameters"]
    (found,) = [p for p in parameters if p.get("name") == name]
    return Draft202012Validator(found["schema"])


@pytest.mark.parametrize("value", ["", "1", "TRUE", "False", "0", "yes", "2"])
def test_follow_agrees_with_its_parser(value: str) -> None:
    assert query("follow").is_valid(value) == accepts(verbs.parse_follow, value)


@pytest.mark.parametrize("tail", [0, 1, verbs.MAX_TAIL, verbs.MAX_TAIL + 1])
def test_tail_agrees_with_its_parser(tail: int) -> None:
    assert query("tail").is_valid(tail) == accepts(verbs.parse_tail, str(tail))


@pytest.mark.parametrize("wait", [0, 0.5, 300, 300.5, 301])
def test_wait_agrees_with_its_parser(wait: float) -> None:
    assert query("wait", "/node/v1/jobs").is_valid(wait) == accepts(verbs.parse_wait, f"{wait:g}")


@pytest.mark.parametrize(
    "text", ["1e1", "10.0", "1E+1", ".5", "300", "3e2", "3.01e2", "inf", "1_0", " 10", "0x10", "-1"]
)
def test_wait_as_a_query_writes_a_number_is_what_its_parser_reads(text: str) -> None:
    """schemathesis wrote ``wait=1e1`` for the document's number and the node refused it
    (issue 52, part 10): a JSON number's text is a number to the node too."""
    number = readers.NUMBER_TEXT.fullmatch(text) is not None
    in_range = number and 0 <= float(text) <= MAX_WAIT_S
    assert in_range == accepts(verbs.parse_wait, text)
    assert in_range == (text in ("1e1", "10.0", "1E+1", ".5", "300", "3e2"))


@pytest.mark.parametrize(
    "since",
    ["1.7e9", "1700000000", "2026-12-01T13:23:04Z", "2026-12-01T13:23:04.5+02:00", "2026-12-01",
     "2026-12-01 13:23", "", "yesterday", "inf", "-5", "1_0", "2026-12-01T13:23:04z"],
)  # fmt: skip
def test_since_agrees_with_its_parser(since: str) -> None:
    assert query("since").is_valid(since) == accepts(verbs.parse_since, since)


@pytest.mark.parametrize(
    "index", ["", "0123456789abcdef-0", "0123456789abcdef-" + "9" * 19, "0123456789abcdef", "x-1"]
)
def test_index_agrees_with_its_parser(index: str) -> None:
    assert query("index", "/node/v1/jobs").is_valid(index) == accepts(verbs.parse_index, index)


# --- hypothesis, near the bounds ------------------------------------------------------------

PATH_TEXT = st.text(alphabet="/.a\x00", max_size=12)


@pytest.mark.slow
@QUICK
@given(PATH_TEXT)
def test_the_absolute_path_pattern_is_the_parsers_rule(path: str) -> None:
    assert LAUNCH.is_valid(launch(workdir=path)) == parser_accepts(launch(workdir=path))


def around(bound: int) -> st.SearchStrategy[int]:
    return st.integers(min_value=bound - 2, max_value=bound + 2)


FIELD_VALUES = st.one_of(
    st.builds(lambda n: {"requested_gpus": n}, around(0) | around(container.MAX_GPUS)),
    st.builds(lambda n: {"run_id": "r" * n}, around(1) | around(200)),
    st.builds(lambda n: launch(shm_size=n), around(1) | around(MAX_SIZE)),
    st.builds(lambda n: launch(memory_limit=n), around(container.MIN_MEMORY)),
    st.builds(lambda n: launch(name="z" * n), around(201)),
    st.builds(lambda n: launch(user="u" * n), around(32)),
    st.builds(lambda n: launch(command=["x"] * n), around(container.MAX_ARGS)),
    st.builds(lambda n: launch(mounts=[["/a", "/b"]] * n), around(mounts.MAX_MOUNTS)),
    st.builds(lambda n: launch(gpus=[1] * n, name=""), around(container.MAX_GPUS)),
    st.builds(lambda x: launch(cpu_limit=x), st.floats(-1, 2) | st.floats(9999, 10001)),
    st.builds(lambda s: launch(cpu_limit=s), st.from_regex(r"\A ?[0-9.]{0,4} ?\Z")),
    st.builds(lambda s: launch(shm_size=s), st.from_regex(r"\A[0-9.]{1,4}[bkmgBKMGx]?\Z")),
    st.builds(lambda s: launch(user=s), st.from_regex(r"\A[a-z0-9_.:-]{0,6}\Z")),
    st.builds(lambda s: launch(name=s), st.from_regex(r"\A[a-f0-9_.-]{0,14}\Z")),
)


@QUICK
@given(FIELD_VALUES)
@pytest.mark.slow
def test_near_its_bounds_a_field_is_allowed_exactly_when_the_parser_accepts_it(
    change: dict[str, Any],
) -> None:
    body = change if "container" in change else {**launch(), **change}
    if body.get("requested_gpus") is None and "requested_gpus" in change:
        body["requested_gpus"] = 0
    allowed, accepted = LAUNCH.is_valid(body), parser_accepts(body)
    if allowed and not accepted:  # what JSON Schema cannot say: a size or a count of CPUs
        asked = body["container"]  # given as text, whose value is out of range
        assert isinstance(asked["shm_size"] or asked["cpu_limit"], str), body
        return
    assert allowed == accepted, body


def test_the_document_is_json_the_daemon_can_send() -> None:
    assert json.loads(schema.render(DOCUMENT)) == DOCUMENT


# --- errors, statuses and phases as a generated client reads them -----------------------------


def responses(path: str, method: str = "post") -> dict[str, Any]:
    return DOCUMENT["paths"][path][method]["responses"]  # type: ignore[no-any-return]


def test_each_error_answer_lists_the_codes_it_may_carry() -> None:
    launch = responses("/node/v1/launch")
    assert launch["409"]["x-codes"] == [
        "cordoned",
        "driver_too_old",
        "engine_conflict",
        "gpu_not_ready",
        "memlock_unavailable",
        "name_held",
        "no_capacity",
        "no_rdma",
        "protocol_mismatch",
        "run_conflict",
        "sandbox_unavailable",
        "userns_unavailable",
    ]
    assert launch["422"]["x-codes"] == ["invalid_field", "spec_refused", "unknown_field"]
    assert "`no_capacity`" in launch["409"]["description"]
    assert responses("/node/v1/signal")["409"]["x-codes"] == ["not_running", "protocol_mismatch"]
    assert responses("/node/v1/logs", "get")["429"]["x-codes"] == [
        "too_many_auth_failures",
        "too_many_requests",
    ]
    assert responses("/healthz", "get").keys() == {"200", "500"}
    for path, operations in DOCUMENT["paths"].items():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                assert status.startswith("2") or answer["x-codes"], (method, path, status)


def test_every_route_declares_its_errors_as_classes_with_codes() -> None:
    """A bare status (``errors=(409,)``) would answer codes the document does not list."""
    for operation in OPERATIONS:
        assert all(not isinstance(kind, int) for kind in operation.errors), operation.path


def test_statuses_and_phases_are_enums_named_once() -> None:
    schemas = DOCUMENT["components"]["schemas"]
    assert schemas["JobStatus"]["enum"] == [
        "created", "running", "paused", "restarting", "removing", "stopping", "exited", "dead",
    ]  # fmt: skip
    assert schemas["LaunchPhase"]["enum"] == ["running", "exited", "pulling", "starting", "failed"]
    status = {"anyOf": [{"$ref": "#/components/schemas/JobStatus"}, {"type": "null"}]}
    assert schemas["StateJson"]["properties"]["status"] == status
    assert schemas["AbsentJson"]["properties"]["status"] == status
    for shape in ("StartedJson", "RunningJson", "PullingJson", "PendingJson"):
        phase = schemas[shape]["properties"]["phase"]
        assert phase == {"$ref": "#/components/schemas/LaunchPhase"}, shape
    words = ("status", "phase", "state", "pending_phase")
    inline = [
        name
        for name, shape in schemas.items()
        for key, field in shape.get("properties", {}).items()
        if key in words and "$ref" not in str(field)
    ]
    assert inline == ["CardStateJson"]  # a card's state is a sentence: "held by run r-1"


@pytest.mark.parametrize(
    "body",
    [
        {"source": "https://models.example/w.bin"},
        {"source": "https://models.example/w.bin", "sha256": ""},
        {"source": "https://models.example/w.bin", "sha256": "ab" * 32},
        {"source": "http://models.example:8080/w.bin", "sha256": None},
        {"source": "registry.example/weights:7b"},
        {"source": "registry.example/weights:7b", "sha256": "ab" * 32},
    ],
)
def test_a_url_needs_its_sha256_in_the_document_as_in_the_parser(body: dict[str, Any]) -> None:
    """The document said ``sha256`` was optional; the node requires it for a URL (issue
    52, part 10): generated prefetches of a URL all stopped at a 422."""
    assert validator("VolumePullBody").is_valid(body) == accepts(volumes.parse_volume_pull, body)
    item = {**body, "path": "/models/w"}
    launch_body = launch(volumes=[item])
    assert LAUNCH.is_valid(launch_body) == parser_accepts(launch_body)


# --- what schemathesis found the document allowed and the node refused (issue 52) ------------


@pytest.mark.parametrize(
    "body",
    [
        {"ref": "j", "warn_s": 0.0},
        {"ref": "j", "warn_s": 5, "warn_signal": None},
        {"ref": "j", "warn_s": 5, "warn_signal": ""},
        {"ref": "j", "warn_s": 5, "warn_signal": "SIGUSR1"},
        {"ref": "j", "warn_s": None},
        {"ref": "j", "warn_signal": "SIGUSR1"},
        {"ref": "j", "warn_signal": "", "signal": ""},  # "": not given, as in 0.3.15
    ],
)
def test_warn_s_needs_its_signal_in_the_document_as_in_the_parser(body: dict[str, Any]) -> None:
    assert validator("StopBody").is_valid(body) == accepts(verbs.parse_stop_body, body)
    drain = {key: value for key, value in body.items() if key != "ref"}
    assert validator("DrainBody").is_valid(drain) == accepts(verbs.parse_drain, drain)


@pytest.mark.parametrize(
    "source",
    [
        "registry.test/weights:7b",
        f"registry.test/weights@sha256:{'a' * 64}",
        f"registry.test/weights@sha512:{'a' * 128}",
        f"registry.test/weights@sha384:{'a' * 96}",
    ],
)
def test_a_volumes_digest_is_a_sha256_in_the_document_as_in_the_parser(source: str) -> None:
    body = {"source": source}
    assert validator("VolumePullBody").is_valid(body) == accepts(volumes.parse_volume_pull, body)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("memory_limit", 873121664.0),
        ("disk_limit", 2.0e9),
        ("shm_size", 1048576.0),
        ("memory_limit", 873121664.5),
        ("scratch", {"path": "/scratch", "size": 1048576.0}),
    ],
)
def test_a_whole_number_written_as_a_float_is_that_number(field: str, value: Any) -> None:
    """JSON Schema's integer takes 947.0; a client's JSON may write a size so."""
    body = launch(**{field: value})
    assert LAUNCH.is_valid(body) == parser_accepts(body)
    for gpus in (2.0, 2.5):
        body = {"run_id": "r", "container": {"image": "a/b:1"}, "requested_gpus": gpus}
        assert LAUNCH.is_valid(body) == parser_accepts(body)


def _assignable(given: Any, declared: Any) -> bool:
    """A reader's type fits its attribute's: the same, or a ``dict`` for a ``Mapping``."""
    if given == declared:
        return True
    origin, wanted = get_origin(given), get_origin(declared)
    if origin is None or wanted is None or get_args(given) != get_args(declared):
        return False
    return issubclass(origin, wanted)


def test_each_container_field_is_the_typed_containers_attribute_of_its_reader_type() -> None:
    """A launch's container is read into `LaunchContainer` by the table's names: a field
    renamed on one side only, or a reader whose type is not its attribute's, fails here
    (the spec has the attributes by inheritance, so a type checker sees them there)."""
    declared = get_type_hints(LaunchContainer)
    read = {field.name: field.read for field in container.CONTAINER.fields if field.read}
    assert set(read) == set(declared)
    wrong = {
        name: (get_type_hints(reader)["return"], declared[name])
        for name, reader in read.items()
        if not _assignable(get_type_hints(reader)["return"], declared[name])
    }
    assert wrong == {}
