#!/usr/bin/env python3
"""Print pip constraints that pin every runtime dependency to its lowest allowed release.

CI installs the package with these into a second venv and runs the fast suite there, so a
lower bound in pyproject.toml is one the code was tested with, not a guess:
    pip install -c <(python3 contrib/dev/lowest.py) '.[test]'
A runtime dependency without a `>=` bound is an error: its lowest release is unknown.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # the lowest supported Python: the `test` extra brings tomli there
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
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


def main() -> int:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    try:
        print("\n".join(lowest(project["dependencies"])))
    except ValueError as exc:
        print(f"lowest.py: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
