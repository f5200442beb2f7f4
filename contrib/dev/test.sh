#!/usr/bin/env bash
# The test command: bring the engines up (idempotent), then run the whole suite.
# Extra arguments go to pytest, e.g. `contrib/dev/test.sh -k pull -x`.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [[ $(id -u) == 0 ]]; then
    contrib/dev/engines.sh up
else
    echo "test.sh: not root, using engines already running (sudo contrib/dev/engines.sh)" >&2
fi
exec python3 -m pytest "$@"
