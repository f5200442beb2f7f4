"""Each unit test module is named after the module it tests (issue 55: 21 of 69 named
modules that had moved): ``test_X.py`` names ``tuneplane_node/X``, its underscores read
as folders where there are folders (``test_runtime_engines_networks_egress.py``), a
module's name perhaps followed by the aspect tested (``test_jobs_launcher_pending.py``).
A module that moves leaves its test's name pointing nowhere, and this fails; the few that
test a concept rather than a module are listed, each with what it tests."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

from tests.support.daemons import REPO

UNIT = Path(__file__).parent
PACKAGE = REPO / "tuneplane_node"

CONCEPTS = {
    "bench_scripts": "bench/'s scripts still import",
    "client_contract": "the consoles' client against the wire contract, every answer",
    "dev_engines": "the engines of a development machine (contrib/dev/engines.sh)",
    "docs": "the docs as a reader follows them",
    "docs_examples": "the docs' console examples, read",
    "layers": "the package's floors, rooms and bounds",
    "light_imports": "what the clients load",
    "packaging": "the package as an operator installs it",
    "unit_names": "these names",
}


def spellings(words: list[str]) -> Iterator[str]:
    """``words`` joined by a folder's ``/`` or a name's ``_`` between each two."""
    for joints in itertools.product("/_", repeat=len(words) - 1):
        pairs = zip(joints, words[1:], strict=True)
        yield words[0] + "".join(joint + word for joint, word in pairs)


def named(stem: str) -> Path | None:
    """The module (or, by its whole name, the package) of the package that ``stem``
    names, or the module it starts with, the rest being the aspect tested."""
    words = stem.split("_")
    for cut in range(len(words), 0, -1):
        for path in spellings(words[:cut]):
            if (module := PACKAGE / f"{path}.py").is_file():
                return module
            if cut == len(words) and (package := PACKAGE / path / "__init__.py").is_file():
                return package
    return None


def test_every_unit_test_module_names_a_module_of_the_package() -> None:
    stems = [path.stem.removeprefix("test_") for path in sorted(UNIT.glob("test_*.py"))]
    nowhere = [f"test_{stem}.py" for stem in stems if stem not in CONCEPTS and not named(stem)]
    assert not nowhere, f"named after no module of tuneplane_node/: {nowhere}"
    assert len(stems) >= 60  # the walk saw the unit tests


def test_a_concept_listed_is_a_test_module_here_named_after_no_module() -> None:
    for stem in CONCEPTS:
        assert (UNIT / f"test_{stem}.py").is_file(), f"test_{stem}.py is listed, and gone"
        assert named(stem) is None, f"test_{stem}.py names {named(stem)}: unlist it"


def test_a_name_is_read_as_folders_a_module_and_an_aspect() -> None:
    engines = PACKAGE / "runtime" / "engines"
    assert named("runtime_engines_networks_egress") == engines / "networks" / "egress.py"
    assert named("jobs_launcher_pending") == PACKAGE / "jobs" / "launcher.py"
    assert named("runtime_cache") == PACKAGE / "runtime" / "cache" / "__init__.py"
    # A package's name and an aspect says nothing: the old names of moved modules.
    assert named("runtime_egress") is None
    assert named("jobs_launch") is None
