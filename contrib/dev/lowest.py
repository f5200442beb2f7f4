#!/usr/bin/env python3
"""Print pip constraints that pin every runtime dependency to its lowest allowed release.

CI installs the package with these into a second venv and runs the fast suite there, so a
lower bound in setup.cfg is one the code was tested with, not a guess:
    pip install -c <(python3 contrib/dev/lowest.py) '.[test]'
A runtime dependency without a `>=` bound is an error: its lowest release is unknown.
The test tools come at their newest, but for those the suite's configuration relies on
(`FLOORED_TOOLS`): their floors in the `test` extra are tested the same way.
"""

from __future__ import annotations

import configparser
import re
import sys
from pathlib import Path

SETUP_CFG = Path(__file__).resolve().parents[2] / "setup.cfg"
FLOORED_TOOLS = frozenset({"pytest-timeout"})
"""The `test` extra's tools pinned at their floor too: pyproject.toml's `timeout` is theirs."""
FLOOR = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*[^;]*?>=\s*([^,;\s]+)")


def lowest(requirements: list[str]) -> list[str]:
    """`name==floor` for each requirement; ValueError naming the first without a floor."""
    pins = []
    for requirement in requirements:
        match = FLOOR.match(requirement)
        if match is None:
            raise ValueError(f"{requirement!r} has no lower bound (>=)")
        pins.append(f"{match[1]}=={match[2]}")
    return pins


def declared(path: Path = SETUP_CFG) -> list[str]:
    """The runtime requirements of setup.cfg's `install_requires`, one a line."""
    lines = _options(path)["options"]["install_requires"].splitlines()
    return [line.strip() for line in lines if line.strip()]


def floored_tools(path: Path = SETUP_CFG) -> list[str]:
    """The `test` extra's requirements of `FLOORED_TOOLS`, one a line."""
    found = []
    for line in _options(path)["options.extras_require"]["test"].splitlines():
        match = FLOOR.match(line)
        if match is not None and match[1] in FLOORED_TOOLS:
            found.append(line.strip())
    return found


def _options(path: Path) -> configparser.ConfigParser:
    # No interpolation: a `%` in a requirement is text. Comment lines never reach a value.
    config = configparser.ConfigParser(interpolation=None)
    config.read_string(path.read_text())
    return config


def main() -> int:
    try:
        print("\n".join(lowest(declared() + floored_tools())))
    except ValueError as exc:
        print(f"lowest.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
