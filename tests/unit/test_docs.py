"""The docs as a reader follows them: every relative link lands, and the README stays short.

README.md is the front door (what the node is, set-up, run, test, where to read on); the
rest lives in docs/, one file per reader. A section moved between files leaves links
pointing at a file or a heading that is no longer there: these tests find them.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
README_MAX_LINES = 300  # issue 19: what it is, install, run, test, where to read on
SOURCES = [README, REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+).+?\1")
LINK = re.compile(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target "title")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:: not a file here


def prose(path: Path) -> Iterator[str]:
    """The lines of a Markdown file outside its fenced code blocks."""
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield line


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in ``path``; a repeated one gets ``-1``, ``-2``, as GitHub's."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path):
        match = HEADING.match(line)
        if match:
            base = anchor(match.group(1))
            repeats = seen.get(base, 0)
            seen[base] = repeats + 1
            found.add(base if repeats == 0 else f"{base}-{repeats}")
    return found


def links(path: Path) -> Iterator[str]:
    """The targets of the Markdown links in ``path``, outside code."""
    for line in prose(path):
        yield from LINK.findall(CODE_SPAN.sub("", line))


def broken_links(path: Path) -> list[str]:
    """Each relative link of ``path`` whose file, or whose ``#heading``, does not exist."""
    broken = []
    for target in links(path):
        if SCHEME.match(target):
            continue
        name, _, fragment = target.partition("#")
        landing = (path.parent / unquote(name)).resolve() if name else path
        if not landing.exists():
            broken.append(f"{target}: no {os.path.relpath(landing, path.parent)}")
        elif fragment and landing.suffix == ".md" and fragment not in anchors(landing):
            broken.append(f"{target}: no heading #{fragment} in {landing.name}")
    return broken


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_lands_on_a_file_and_a_heading(path: Path) -> None:
    assert not broken_links(path), f"{path.relative_to(REPO)}: {broken_links(path)}"


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines < README_MAX_LINES, f"README.md is {lines} lines: move a section to docs/"


def test_the_readme_links_every_reader_onward() -> None:
    targets = {target.partition("#")[0] for target in links(README)}
    wanted = {"docs/api.md", "docs/operating.md", "docs/design.md", "docs/reliability.md"}
    assert wanted | {"CHANGELOG.md", "bench/README.md"} <= targets


def test_anchors_are_the_ones_github_makes() -> None:
    assert anchor("The operator's client: `tuneplane-node ctl`") == (
        "the-operators-client-tuneplane-node-ctl"
    )
    assert anchor("`POST /node/v1/stats`") == "post-nodev1stats"
    assert anchor("Soak: 1,000 launch/stop/remove cycles") == "soak-1000-launchstopremove-cycles"


def test_a_moved_section_is_found_by_its_broken_links(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Settings\n\n```sh\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n## Here\n\n## Here\n\n"
        "[ok](#here) [ok](#here-1) [ok](other.md#settings) [ok](https://example.com/x#y)\n"
        "`[not a link](nowhere.md)`\n\n```\n[not a link](nowhere.md)\n```\n"
        "[gone](#settings) [gone](other.md#not-a-heading) [gone](missing.md)\n"
    )
    assert broken_links(page) == [
        "#settings: no heading #settings in page.md",
        "other.md#not-a-heading: no heading #not-a-heading in other.md",
        "missing.md: no missing.md",
    ]


def ctl_verbs() -> set[str]:
    """The verbs `tuneplane-node ctl` takes, from its own parser."""
    from tuneplane_node.cli import parser

    def choices(of: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        found: dict[str, argparse.ArgumentParser] = {}
        for action in of._actions:  # argparse has no public walk of its subcommands
            if isinstance(action, argparse._SubParsersAction):
                found.update(action.choices)
        return found

    return set(choices(choices(parser())["ctl"]))


def test_the_ctl_verb_table_lists_every_verb() -> None:
    """Issue 36, finding 9: the table lacked `jobs`, `signal` and `gc`."""
    text = (REPO / "docs" / "operating.md").read_text()
    table = text.partition("### Verbs")[2].partition("\n### ")[0]
    listed = set(re.findall(r"^\| `([a-z-]+)", table, re.MULTILINE))
    assert listed == ctl_verbs()


def test_the_design_names_every_verb_of_the_runtime_seam() -> None:
    """docs/design.md's Seams list `ContainerRuntime`'s verbs: read from the protocol,
    so a verb added or renamed fails here until the list says it (it was stale three
    times, issue 55)."""
    from tuneplane_node.runtime.base import ContainerRuntime

    verbs = [
        name
        for name, value in vars(ContainerRuntime).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    ]
    design = (REPO / "docs/design.md").read_text()
    seam = design[design.index("- `ContainerRuntime` (") :].split("\n- ", 1)[0]
    listed = re.findall(r"`(\w+)`", seam.split(":", 1)[1])
    assert listed == verbs, "docs/design.md's ContainerRuntime verbs, in the protocol's order"
