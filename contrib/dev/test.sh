#!/usr/bin/env bash
# The test command: bring the engines up (idempotent), then run the whole suite with the
# project's virtual environment (.venv, see the README), or python3 without one.
# Extra arguments go to pytest, e.g. `contrib/dev/test.sh -k pull -x`, or
# `contrib/dev/test.sh -m 'not engine'` for the fast tests that need no engine.
set -euo pipefail
cd "$(dirname "$0")/../.."
python=python3
[[ -x .venv/bin/python ]] && python=.venv/bin/python
if [[ $(id -u) == 0 ]]; then
    contrib/dev/engines.sh up
else
    echo "test.sh: not root, using engines already running (sudo contrib/dev/engines.sh)" >&2
fi
exec "$python" -m pytest "$@"
