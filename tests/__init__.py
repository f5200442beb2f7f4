"""The test suite (a package: the modules import `tests.support.*` and `tests.fakes.*`)."""

import sys

# pytest keeps a test module's assert-rewritten code only where bytecode may be written:
# under PYTHONDONTWRITEBYTECODE=1 (set on the machines here) it rewrote every assert of
# every module at each run, 7 s of the fast suite's collection. Imported before the
# first test module is.
sys.dont_write_bytecode = False
