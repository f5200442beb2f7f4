"""The command line: ``serve`` runs the daemon, ``inventory`` prints what the machine has,
``check`` says whether the settings and the engine are usable. Settings are read once."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence

from tuneplane_node import __version__, inventory, logformat
from tuneplane_node.errors import ConfigError
from tuneplane_node.settings import NodeSettings, load_settings
from tuneplane_node.wire import answers

log = logging.getLogger("tuneplane_node")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="tuneplane-node",
        description="Node daemon of the TunePlane fine-tuning platform. "
        "Settings come from TUNEPLANE_* variables and .env (see README).",
    )
    top.add_argument("--version", action="version", version=f"tuneplane-node {__version__}")
    top.add_argument(
        "--log-level",
        type=str.upper,
        choices=logformat.LEVELS,
        help="least severe lines written (default TUNEPLANE_LOG_LEVEL, INFO)",
    )
    top.add_argument(
        "--log-format",
        type=str.lower,
        choices=logformat.FORMATS,
        help="text, or one JSON object per line (default TUNEPLANE_LOG_FORMAT, text)",
    )
    verbs = top.add_subparsers(dest="verb", metavar="COMMAND")
    serve = verbs.add_parser("serve", help="run the daemon's HTTP API")
    serve.add_argument("--host", help="listen address (default TUNEPLANE_NODE_HOST, 0.0.0.0)")
    serve.add_argument("--port", type=int, help="listen port (default TUNEPLANE_NODE_PORT, 8470)")
    verbs.add_parser("inventory", help="print what this machine has, as JSON")
    verbs.add_parser("check", help="check the settings and the container engine")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.verb is None:
        parser().print_help()
        return 2
    try:
        settings = load_settings()
        logformat.configure(
            args.log_level or settings.log_level, args.log_format or settings.log_format
        )
        if args.verb == "serve":
            return serve(settings, host=args.host, port=args.port)
        if args.verb == "inventory":
            return asyncio.run(print_inventory(settings))
        return asyncio.run(check(settings))
    except ConfigError as exc:
        print(f"tuneplane-node: {exc.message}", file=sys.stderr)
        return 2


def serve(settings: NodeSettings, *, host: str | None, port: int | None) -> int:
    from tuneplane_node.daemon.server import serve as run

    # SIGTERM/SIGINT stop it gracefully: no new connections, requests in flight finish,
    # then the app's cleanup cancels pulls and closes the engine's pool.
    asyncio.run(run(settings, host=host or settings.node_host, port=port or settings.node_port))
    return 0


async def print_inventory(settings: NodeSettings) -> int:
    from tuneplane_node.gpu.allocator import GpuAllocator
    from tuneplane_node.jobs import read_inventory
    from tuneplane_node.runtime import detect_runtime

    runtime = await detect_runtime(settings, cache=False)
    allocator = GpuAllocator(runtime, settings)
    try:
        facts = await read_inventory(runtime, allocator, settings)
    finally:
        allocator.close()
        await runtime.close()
    print(json.dumps(answers.inventory_json(facts), indent=2))
    return 0


async def check(settings: NodeSettings) -> int:
    from tuneplane_node.daemon.tokens import TokenSet
    from tuneplane_node.runtime import detect_runtime

    TokenSet.from_settings(settings)
    inventory.check_fabrics(settings.fabrics)
    runtime = await detect_runtime(settings, cache=False)
    try:
        engine = await runtime.health()
    finally:
        await runtime.close()
    print(f"runtime: {engine.engine} {engine.version or ''} {'ok' if engine.ok else engine.error}")
    return 0 if engine.ok else 1
