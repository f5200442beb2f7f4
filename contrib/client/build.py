#!/usr/bin/env python3
"""Build the tuneplane-node-client distribution (sdist and wheel) into ``dist/``.

Its sources are the repository's own (`tuneplane_node/__init__.py` and
`tuneplane_node/client/`), staged with this directory's metadata in a temporary
directory: setuptools builds only what lies under a project's root.
    python3 contrib/client/build.py [--out DIR] [--wheel-only]
No build isolation: the running Python's setuptools builds it, so no index is needed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
METADATA = ("pyproject.toml", "setup.cfg", "README.md")


def stage(root: Path) -> None:
    """The client's project: its metadata, the license, and the two source trees."""
    for name in METADATA:
        shutil.copy(HERE / name, root / name)
    shutil.copy(REPO / "LICENSE", root / "LICENSE")
    package = root / "tuneplane_node"
    shutil.copytree(REPO / "tuneplane_node" / "client", package / "client",
                    ignore=shutil.ignore_patterns("__pycache__", "*.py[cod]"))  # fmt: skip
    shutil.copy(REPO / "tuneplane_node" / "__init__.py", package / "__init__.py")


def build(out: Path, *, wheel_only: bool = False) -> list[Path]:
    """The built files, in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tuneplane-node-client-") as staged:
        stage(Path(staged))
        kinds = ["--wheel"] if wheel_only else ["--sdist", "--wheel"]
        command = [sys.executable, "-m", "build", *kinds, "--no-isolation", "-o", str(out)]
        subprocess.run([*command, staged], check=True, capture_output=True, timeout=300)
    return sorted(out.glob("tuneplane_node_client-*"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    parser.add_argument("--wheel-only", action="store_true")
    args = parser.parse_args()
    for path in build(args.out, wheel_only=args.wheel_only):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
