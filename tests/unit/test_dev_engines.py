"""The engines of a development machine: those for people, those for the tests.

A daemon started from the README runs on the developer's Docker engine (or podman
service), with jobs holding (simulated) cards and its engine lock. Issue 36: the engine
tests ran there too, and that daemon's card jobs and lock failed five tests of a
concurrent suite (a `drain` or `reap` from it would have acted on the tests' containers).
The engine tests and their daemons run on the suite's own engines (`engines.sh` starts
them, and prints which is which); these tests fail when one points back.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.daemons import REPO
from tests.support.engines import (
    DEV_DOCKER_SOCK,
    DEV_PODMAN_SOCK,
    LANE,
    docker_host,
    engine_addresses,
    own_docker_host,
    podman_url,
)

# A test may name the developer's engines only to refuse them (a mount of the engine's
# socket) or to read an image from them (a base image, never changed there).
MAY_NAME = {
    "engines.py": "where they are defined (tests/support/engines.py)",
    "test_dev_engines.py": "this test",
    "test_daemon_attacks.py": "a job mounting the engine's socket is refused",
    "test_image.py": "a base image read from it, as engines.sh copies the test image",
    "test_settings.py": "podman's default address, as a setting (never reached)",
    "test_daemon_enginelock.py": "spellings of one address, as the lock names it (never reached)",
}
NAMES = re.compile(
    r"DEV_DOCKER_SOCK|DEV_PODMAN_SOCK|/run/tuneplane-dev/docker\.sock|/run/podman/podman\.sock"
)


def test_the_engine_tests_run_on_the_suites_engines(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TUNEPLANE_TEST_DOCKER_HOST", "TUNEPLANE_TEST_PODMAN_URL", "DOCKER_HOST"):
        monkeypatch.delenv(name, raising=False)
    developers = {f"unix://{DEV_DOCKER_SOCK}", f"unix://{DEV_PODMAN_SOCK}"}
    assert {docker_host(), podman_url(), own_docker_host()}.isdisjoint(developers)


def test_no_test_names_the_developers_engines_but_to_refuse_or_read_them() -> None:
    naming = {
        path.name
        for path in (REPO / "tests").rglob("*.py")
        if NAMES.search(path.read_text()) and path.name not in MAY_NAME
    }
    assert not naming, f"these tests name the developer's engines: {sorted(naming)}"


def test_engines_sh_says_which_engines_are_for_people_and_which_for_the_tests() -> None:
    script = (REPO / "contrib" / "dev" / "engines.sh").read_text()
    people, _, tests = script.partition("For the tests only")
    assert "For people" in people and "$DOCKER_SOCK" in people and "$PODMAN_SOCK" in people
    assert "$TESTS_SOCK" in tests and "$TESTS_PODMAN_SOCK" in tests
    assert Path("/run/tuneplane-dev/docker-tests.sock").name in script.replace(
        "$RUN_DIR/docker-tests.sock", "/run/tuneplane-dev/docker-tests.sock"
    )


@pytest.mark.parametrize(
    ("lane", "allowed"),
    [
        ("docker", {"docker"}),
        ("podman", {"podman"}),
        ("shared", {"docker", "podman"}),
        ("own", {"own"}),
        ("", {"docker", "podman", "own"}),
    ],
)
def test_each_lane_of_ci_reaches_its_engines_only(
    monkeypatch: pytest.MonkeyPatch, lane: str, allowed: set[str]
) -> None:
    """CI's three lanes run at once (.ci/run): a test of one on another's engine would
    meet that lane's jobs and cards there. A daemon's settings name both shared engines,
    asking for its own engine's only (`engine_addresses`)."""
    monkeypatch.setenv(LANE, lane)
    asked = {"docker": docker_host, "podman": podman_url, "own": own_docker_host}
    for name, ask in asked.items():
        if name in allowed:
            ask()
        else:
            with pytest.raises(pytest.fail.Exception, match=f"the {name!r} lane's tests"):
                ask()
    for engine in {"docker", "podman"} & allowed:
        assert engine_addresses(engine)["TUNEPLANE_LOCAL_RUNTIME"] == engine
