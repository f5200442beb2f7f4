"""Properties of every wire parser, over whatever JSON a client can send (hypothesis).

Whatever arrives, a parser answers with the parsed value or `InvalidField` naming a
field: never another exception (a 500), never a value outside its stated bounds.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.console import console_0315
from tuneplane_node.errors import InvalidField
from tuneplane_node.jobs.launcher import launch_request
from tuneplane_node.wire import container, images, requests, verbs
from tuneplane_node.wire.values import LABEL_RUN_ID

# Slow: hypothesis generates hundreds of bodies a test.
pytestmark = pytest.mark.slow

QUICK = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([10**401, -(10**401), 2**63])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=40)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = ("name", "image", "command", "env", "gpus", "mounts", "labels", "workdir", "shm_size",
          "cpu_limit", "memory_limit", "network", "user")  # fmt: skip


def refused_by_name(error: InvalidField) -> bool:
    return bool(error.field) and error.message.startswith(f"{error.field}: ")


@QUICK
@given(st.dictionaries(st.text(max_size=20), JSON, max_size=5))
def test_any_body_is_a_launch_or_a_named_refusal(body: dict[str, Any]) -> None:
    try:
        requests.parse_launch(body)
    except InvalidField as error:
        assert refused_by_name(error)


@QUICK
@given(st.sampled_from(FIELDS), JSON, st.integers(min_value=0, max_value=4))
def test_one_hostile_field_in_a_0315_launch_is_read_or_refused_by_its_name(
    field: str, value: Any, gpus: int
) -> None:
    body = console_0315("r-1", gpus, **{field: value})  # requested=gpus
    try:
        request = requests.parse_launch(body)
    except InvalidField as error:
        assert error.field.startswith(f"container.{field}") or error.field == "requested_gpus"
        return
    spec = launch_request(request).spec
    assert spec.labels[LABEL_RUN_ID] == "r-1"
    assert spec.network in container.NETWORKS
    assert images.IMAGE_REFERENCE.fullmatch(spec.image)
    assert all(mount.host.startswith("/") and ".." not in mount.host for mount in spec.mounts)
    assert spec.cpu_limit is None or 0 < spec.cpu_limit <= container.MAX_CPUS


@QUICK
@given(JSON)
def test_refs_are_names_or_a_named_refusal(refs: Any) -> None:
    try:
        parsed = verbs.parse_refs({"refs": refs})
    except InvalidField as error:
        assert error.field == "refs"
        return
    assert all(0 < len(ref) <= verbs.MAX_REF for ref in parsed)


@QUICK
@given(JSON, JSON, JSON)
def test_seconds_are_within_their_bounds_or_refused(ref: Any, grace: Any, age: Any) -> None:
    for parse, field, most in (
        (verbs.parse_grace, "timeout", verbs.MAX_GRACE_S),
        (verbs.parse_max_age, "max_age_s", verbs.MAX_AGE_S),
    ):
        try:
            seconds = parse({field: grace if field == "timeout" else age})
        except InvalidField as error:
            assert error.field == field
            continue
        assert seconds is None or 0 <= seconds <= most
    try:
        verbs.parse_ref({"ref": ref})
    except InvalidField as error:
        assert error.field == "ref"


@QUICK
@given(st.text(max_size=12))
def test_a_tail_is_a_bounded_whole_number_or_refused(text: str) -> None:
    try:
        tail = verbs.parse_tail(text)
    except InvalidField as error:
        assert error.field == "tail"
        return
    assert 1 <= tail <= verbs.MAX_TAIL
