"""The docs' examples as tests/docexamples.py reads them: every console block of README.md
and docs/*.md is an example or says why not. tests/engines/test_docs_examples_engines.py runs
them against a real daemon."""

from __future__ import annotations

import ast
import dataclasses
import textwrap
from pathlib import Path

import pytest

from tests.docexamples import (
    REPO,
    SOURCES,
    Block,
    examples,
    normalised,
    python_blocks,
    shown,
    unmarked_listings,
)
from tuneplane_node.client import Container

# --- what the extractor finds (no engine) ---------------------------------------------------


def test_every_console_block_is_an_example_or_says_why_not() -> None:
    for path in SOURCES:
        for example in examples(path):
            assert example.commands, f"{example.name}: a console block without a `$ ` command"
            assert example.not_run is None or len(example.not_run) > 10, example.name


def test_every_listing_naming_curl_or_ctl_is_marked() -> None:
    unmarked = [name for path in SOURCES for name in unmarked_listings(path)]
    assert not unmarked, f"mark these as examples (console) or say why not: {unmarked}"


def test_the_extractor_reads_commands_their_output_and_exclusions(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n```console\n$ curl -s x \\\n  -d '{}'\n{\"ok\":true}\n$ echo a\na\nb\n```\n\n"
        "<!-- example: not run: it needs a GPU driver -->\n```console\n$ nvidia-smi\n```\n\n"
        "```sh\ncurl -s y\n```\n"
    )
    run, excluded = examples(page)
    assert [c.text for c in run.commands] == ["curl -s x \\\n  -d '{}'", "echo a"]
    assert [c.printed for c in run.commands] == [('{"ok":true}',), ("a", "b")]
    assert run.not_run is None and excluded.not_run == "it needs a GPU driver"
    assert unmarked_listings(page) == ["page.md:17"]
    assert normalised('{"id":"1e3ad4e2c7f8","at":"2026-12-01T13:23:04.290542Z"}') == (
        '{"id":"<id>","at":"<time>"}'
    )


# --- the Python examples, under mypy --strict -----------------------------------------------

PYTHON_SOURCES = [*SOURCES, REPO / "clients/python/README.md"]
CONSOLES = sorted((REPO / "clients/python/examples").glob("*.py"))
# What the docs' snippets take as given: the console's token.
GIVEN = 'token = "change-me-to-a-long-secret"\n'


def as_module(block: Block) -> str:
    """A snippet as a module mypy reads: as written where it compiles, else (an
    ``await`` or ``async with`` at its top, as a console's coroutine runs it) the body
    of a coroutine."""
    code = "\n".join(block.body) + "\n"
    try:
        compile(code, "example", "exec", dont_inherit=True)
    except SyntaxError:
        code = "async def example() -> None:\n" + textwrap.indent(code, "    ")
    return GIVEN + code


# Once: mypy is the dev extra's, which the lowest-dependencies and newest-Python runs do
# not install; what it checks does not depend on their releases.
@pytest.mark.slow
@pytest.mark.once
def test_the_python_examples_of_the_docs_and_the_consoles_pass_mypy_strict(
    tmp_path: Path,
) -> None:
    """What a console author copies type-checks as a console's own code would: a
    snippet that does not (``jobs = {}`` untyped) fails here, named by file and line."""
    import mypy.api  # the dev extra's (above)

    files = list(CONSOLES)
    for path in PYTHON_SOURCES:
        for block in python_blocks(path):
            name = f"{shown(path).replace('/', '_').replace('.', '_')}_{block.line}.py"
            (tmp_path / name).write_text(as_module(block))
            files.append(tmp_path / name)
    assert len(files) >= 5  # the README's, api.md's, the client README's, two consoles
    options = ["--strict", "--python-version", "3.10", "--ignore-missing-imports"]
    cache = ["--cache-dir", str(tmp_path / "cache")]
    said, errors, status = mypy.api.run([*options, *cache, *map(str, files)])
    assert status == 0, said + errors


def test_the_every_field_console_sets_every_field_of_the_container() -> None:
    """clients/python/examples/every_field.py is the console that proves each typed
    field type-checks: a field the Container gains and this launch does not set fails."""
    (console,) = [path for path in CONSOLES if path.name == "every_field.py"]
    calls = [
        node
        for node in ast.walk(ast.parse(console.read_text()))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Container"
    ]
    given = {keyword.arg for call in calls for keyword in call.keywords}
    fields = {field.name for field in dataclasses.fields(Container)} - {"fields"}
    assert sorted(fields - given) == []
