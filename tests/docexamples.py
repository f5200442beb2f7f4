"""The shell examples of README.md and docs/*.md, as a test runs them.

An example is a fenced ``console`` block: each ``$ `` line is a command (a line ending
in ``\\``, or inside a single quote, goes on with the next), and the lines up to the next
command are what it printed.
Every example runs by default (`tests/engines/test_docs_examples_engines.py`, against a
real daemon on the suite's engine); one that must not run says why in a comment on the
line before its fence: ``<!-- example: not run: <reason> -->``. A ``sh`` block naming
``curl`` or ``ctl`` is set-up or a listing, not an example: it carries a marker that says
which (the operator path's, or the same ``not run`` with its reason).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOURCES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NOT_RUN = re.compile(r"^<!-- example: not run: (?P<reason>.*\S) -->$")
MARKED = re.compile(r"^<!-- (example: not run: .*\S|operator path: .*) -->$")
FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")
# What changes from one run to the next, on both sides of a comparison.
VARYING = [
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z?"), "<time>"),
    (re.compile(r"sha256:[0-9a-f]{64}"), "<digest>"),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r"\b[0-9a-f]{64}\b|\b[0-9a-f]{12}\b"), "<id>"),
    # The machine's figures, and the engine's: sizes, ages, counts of the shared engine.
    (
        re.compile(
            r'"(\w*(?:bytes|_age_s|_pct|_gib|ratio|elapsed_s|containers|cpu_count|inodes_\w+))"'
            r": ?[\d.]+"
        ),
        r'"\1": <n>',
    ),
    (re.compile(r'"(hostname|agent_version|runtime)": ?"[^"]*"'), r'"\1": "<machine>"'),
    # ctl's tables say the same figures in words, and how long ago.
    (re.compile(r"\b\d+(\.\d+)? ?(GiB|MiB|KiB|%)"), "<size>"),
    (re.compile(r"\b\d+ containers\b"), "<n> containers"),
    (re.compile(r"\b\d+(\.\d+)?[smhd]\b"), "<age>"),
]


@dataclass(frozen=True)
class Command:
    text: str  # as bash runs it: continuation lines joined
    printed: tuple[str, ...]


@dataclass(frozen=True)
class Example:
    path: Path
    line: int  # of the fence, 1-based
    commands: tuple[Command, ...]
    not_run: str | None  # the reason, when the docs exclude it
    length: int  # lines between the fences

    @property
    def name(self) -> str:
        return f"{shown(self.path)}:{self.line}"


@dataclass(frozen=True)
class Block:
    lang: str
    line: int
    body: tuple[str, ...]
    marker: str | None  # the comment line before the fence


def blocks(path: Path) -> list[Block]:
    found: list[Block] = []
    lines = path.read_text().splitlines()
    start: int | None = None
    for number, line in enumerate(lines):
        if not FENCE.match(line):
            continue
        if start is None:
            start = number
            continue
        before = lines[start - 1] if start > 0 else ""
        lang = FENCE.match(lines[start])
        assert lang is not None
        marker = before if before.startswith("<!--") else None
        found.append(Block(lang["lang"], start + 1, tuple(lines[start + 1 : number]), marker))
        start = None
    return found


def python_blocks(path: Path) -> list[Block]:
    """The ``python`` blocks of ``path``: code a console author copies."""
    return [block for block in blocks(path) if block.lang == "python"]


def examples(path: Path) -> list[Example]:
    """The console blocks of ``path``, each parsed into its commands."""
    found = []
    for block in blocks(path):
        if block.lang != "console":
            continue
        reason = NOT_RUN.match(block.marker or "")
        commands = parse(block.body)
        not_run = reason["reason"] if reason else None
        found.append(Example(path, block.line, commands, not_run, len(block.body)))
    return found


def parse(body: tuple[str, ...]) -> tuple[Command, ...]:
    commands: list[Command] = []
    text: list[str] = []
    printed: list[str] = []
    going_on = False
    for line in body:
        if going_on:
            text.append(line)
        elif line.startswith("$ "):
            if text:
                commands.append(Command("\n".join(text), tuple(printed)))
            text, printed = [line[2:]], []
        else:
            printed.append(line)
            continue
        # A command goes on past a line ending in a backslash, or inside a quote.
        going_on = bool(text) and (line.endswith("\\") or "\n".join(text).count("'") % 2 == 1)
    if text:
        commands.append(Command("\n".join(text), tuple(printed)))
    return tuple(commands)


def unmarked_listings(path: Path) -> list[str]:
    """The non-console blocks naming curl or ctl that carry no marker saying why."""
    return [
        f"{shown(path)}:{block.line}"
        for block in blocks(path)
        if block.lang in ("sh", "bash", "shell")
        and re.search(r"\bcurl\b|\bctl\b", "\n".join(block.body))
        and not MARKED.match(block.marker or "")
    ]


def shown(path: Path) -> str:
    """The path as a reader names it: from the repository's root, else its name."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else path.name


def normalised(text: str) -> str:
    for pattern, placeholder in VARYING:
        text = pattern.sub(placeholder, text)
    # A table's column is as wide as its longest cell: `5s` or `12s` redraws its rules.
    text = re.sub(r"[━─]+", "─", re.sub(r" {2,}", " ", text))
    return "\n".join(line.rstrip() for line in text.splitlines())


def rewritten(path: Path, printed: dict[int, list[str]]) -> str:
    """``path``'s text with each example's output (by its fence's line) as ``printed``
    gives it, one string per command: how the docs are brought up to date by hand
    (``TUNEPLANE_DOCS_UPDATE=1``), the diff then read before it is committed."""
    lines = path.read_text().splitlines()
    for example in sorted(examples(path), key=lambda e: e.line, reverse=True):
        if example.line not in printed:
            continue
        body: list[str] = []
        for command, output in zip(example.commands, printed[example.line], strict=True):
            body += f"$ {command.text}".splitlines() + (output.splitlines() if output else [])
        lines[example.line : example.line + example.length] = body
    return "\n".join(lines) + "\n"
