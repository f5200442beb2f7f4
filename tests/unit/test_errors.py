"""The error tree: every kind has its own stable code, and the docstring's tree says it."""

from __future__ import annotations

import re

import pytest

from tuneplane_node import errors
from tuneplane_node.errors import FIELD_CODES, MAX_FIELD_ERRORS, InvalidField, NodeError

SNAKE = re.compile(r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*")


def every_kind() -> list[type[NodeError]]:
    """NodeError and every subclass of it, however deep (new ones included)."""
    found, todo = [], [NodeError]
    while todo:
        kind = todo.pop()
        if kind not in found:
            found.append(kind)
            todo.extend(kind.__subclasses__())
    return found


@pytest.mark.parametrize("kind", every_kind(), ids=lambda kind: kind.__name__)
def test_every_error_class_declares_its_own_snake_case_code(kind: type[NodeError]) -> None:
    assert "code" in vars(kind), f"{kind.__name__} inherits its code: give it its own"
    assert SNAKE.fullmatch(kind.code), kind.code


def test_the_codes_the_issue_names_are_the_kinds_it_names() -> None:
    codes = {kind.__name__: kind.code for kind in every_kind()}
    named = {
        "NoCapacity": "no_capacity",
        "NodeCordoned": "cordoned",
        "NameTaken": "name_held",
        "ProtocolMismatch": "protocol_mismatch",
        "InvalidField": "invalid_field",
        "UnknownField": "unknown_field",
        "NotRunning": "not_running",
        "EngineUnavailable": "engine_unavailable",
        "EngineRefused": "engine_refused",
        "ImageAccessDenied": "forbidden_image",
        "TooManyFollows": "too_many_requests",
    }
    assert {name: codes.get(name) for name in named} == named


def test_four_kinds_of_409_are_four_codes() -> None:
    """What a console's retry rule reads: no cards now, cordoned, a name held, a mismatch."""
    kinds = (errors.NoCapacity, errors.NodeCordoned, errors.NameTaken, errors.ProtocolMismatch)
    assert {kind.status for kind in kinds} == {409}
    assert len({kind.code for kind in kinds}) == 4


def test_the_docstring_tree_names_each_class_of_this_package_with_its_code() -> None:
    """The tree is the package's docstring; its classes are in the package's modules."""
    doc = errors.__doc__ or ""
    ours = [kind for kind in every_kind() if kind.__module__.startswith(f"{errors.__name__}.")]
    for kind in ours:
        assert re.search(rf"\b{kind.__name__}\b.*\b{kind.code}\b", doc), kind.__name__
    assert len(ours) >= 30  # the walk saw the package's classes


def test_many_bad_fields_are_one_error_naming_the_first_and_listing_at_most_100() -> None:
    found = [InvalidField(f"env.K{i}", "must be a string") for i in range(150)]
    joined = InvalidField.of(found)
    assert (joined.message, joined.code) == ("env.K0: must be a string", "invalid_field")
    assert len(joined.errors) == MAX_FIELD_ERRORS
    assert [error.field for error in joined.errors[:2]] == ["env.K0", "env.K1"]
    assert {error.code for error in joined.errors} <= set(FIELD_CODES)
