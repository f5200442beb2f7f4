"""`tuneplane-node check`: the node's settings and machine, fact by fact, before a serve.

One module per concern: the steps and the node's own (run.py), the engine and what jobs
get on it (engine.py), the cards and fabrics (gpus.py), the disks and mounts
(storage.py); a finding's shape (findings.py). `cli.py` parses the arguments and calls
`check`. Each step starts no daemon.
"""

from tuneplane_node.checks.findings import FAIL, OK, WARN, Finding
from tuneplane_node.checks.run import check

__all__ = ["FAIL", "OK", "WARN", "Finding", "check"]
