"""The benchmarks are run by hand, never in CI: this only checks that each script still
imports against the code it measures (a renamed module broke launch.py unnoticed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
# Wrappers that run another module as soon as they are loaded: checked by compiling.
WRAPPERS = {"fillthreads"}


@pytest.mark.slow
def test_every_benchmark_imports() -> None:
    if not BENCH.is_dir():
        pytest.skip("bench/ is left out of the sdist (MANIFEST.in)")
    scripts = sorted(path.stem for path in BENCH.glob("*.py"))
    for script in WRAPPERS:
        compile((BENCH / f"{script}.py").read_text(), script, "exec")
    imports = "; ".join(f"import {script}" for script in scripts if script not in WRAPPERS)
    done = subprocess.run(
        [sys.executable, "-c", imports],
        cwd=BENCH,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
