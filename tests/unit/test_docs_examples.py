"""The docs' examples as tests/docexamples.py reads them: every console block of README.md
and docs/*.md is an example or says why not. tests/engines/test_docs_examples_engines.py runs
them against a real daemon."""

from __future__ import annotations

from pathlib import Path

from tests.docexamples import (
    SOURCES,
    examples,
    normalised,
    unmarked_listings,
)

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
