"""``tuneplane-node ctl``: an operator's client of the node's HTTP API (`client`), its
answers drawn with rich (`render`, `stores`), the verbs (`commands`) and their command
line (`options`). It imports nothing of the daemon, the job service or the runtimes:
only the wire's constants."""

from tuneplane_node.ctl.commands import run
from tuneplane_node.ctl.options import add_parser

__all__ = ["add_parser", "run"]
