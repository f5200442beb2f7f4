"""``tuneplane-node ctl``: an operator's client of the node's HTTP API (`client`), its
answers drawn with rich (`render`), and the verbs (`commands`). It imports nothing of
the daemon, the job service or the runtimes: only the wire's constants."""

from tuneplane_node.ctl.commands import add_parser, run

__all__ = ["add_parser", "run"]
