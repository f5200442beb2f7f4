"""The command line: ``serve`` runs the daemon, ``inventory`` prints what the machine has,
``check`` says whether the settings and the machine are usable, ``ctl`` talks to a
running node's API (it reads no settings: it is a client). Settings are read once."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

from tuneplane_node import __version__, ctl, logformat
from tuneplane_node.checks import check
from tuneplane_node.errors import ConfigError
from tuneplane_node.settings import NodeSettings, load_settings

log = logging.getLogger("tuneplane_node")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="tuneplane-node",
        description="Node daemon of the TunePlane fine-tuning platform. "
        "Settings come from TUNEPLANE_* variables, .env and --env-file (see "
        "docs/operating.md).",
    )
    top.add_argument(
        "--version",
        action=VersionAction,
        help="print the versions of the node, Python, the engine SDKs and NVML, and exit",
    )
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
    # The node's settings, as serve, inventory and check read them alike.
    settings = argparse.ArgumentParser(add_help=False)
    settings.add_argument(
        "--env-file",
        type=Path,
        metavar="PATH",
        help="read TUNEPLANE_* settings from this file of VARIABLE=value lines (the "
        "systemd unit's EnvironmentFile, /etc/tuneplane-node/env): over .env, under "
        "the environment's own variables",
    )
    verbs = top.add_subparsers(dest="verb", metavar="COMMAND")
    serve = verbs.add_parser("serve", parents=[settings], help="run the daemon's HTTP API")
    serve.add_argument("--host", help="listen address (default TUNEPLANE_NODE_HOST, 0.0.0.0)")
    serve.add_argument("--port", type=int, help="listen port (default TUNEPLANE_NODE_PORT, 8470)")
    verbs.add_parser("inventory", parents=[settings], help="print what this machine has, as JSON")
    verbs.add_parser(
        "check",
        parents=[settings],
        help="check the settings, the engine, the cards and the disks",
        description="One line per fact, starting ok, warn or FAIL; exit 1 on any FAIL.",
    )
    ctl.add_parser(verbs)
    return top


class VersionAction(argparse.Action):
    """``--version``: what a bug report needs, as node agents print it; asked only when
    given (NVML is started for it)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **options: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help=str(options.get("help", "")))

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print("\n".join(versions()))
        parser.exit()


def versions() -> list[str]:
    from importlib.metadata import PackageNotFoundError, version

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    try:
        from tuneplane_node.gpu.nvml import library_version

        nvml = library_version()
    except ImportError as exc:  # no nvidia-ml-py: the node runs without cards
        nvml = f"unavailable ({exc})"
    return [
        f"tuneplane-node {__version__}",
        f"Python {platform.python_version()} ({platform.python_implementation()})",
        f"docker SDK {of('docker')}",
        f"podman SDK {of('podman')}",
        f"nvidia-ml-py {of('nvidia-ml-py')}, NVML {nvml}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.verb is None:
        parser().print_help()
        return 2
    if args.verb == "ctl":
        return ctl.run(args)
    try:
        # Absolute: check may move to a serving node's working directory and read again.
        env_file = args.env_file.absolute() if args.env_file is not None else None
        settings = load_settings(env_file)
        logformat.configure(
            args.log_level or settings.log_level, args.log_format or settings.log_format
        )
        if args.verb == "serve":
            return serve(settings, host=args.host, port=args.port)
        if args.verb == "inventory":
            return asyncio.run(print_inventory(settings))
        return check(settings, env_file=env_file)
    except ConfigError as exc:
        print(f"tuneplane-node: {exc.message}", file=sys.stderr)
        return 2


def serve(settings: NodeSettings, *, host: str | None, port: int | None) -> int:
    from tuneplane_node.daemon.enginelock import EngineTaken
    from tuneplane_node.daemon.listener import CannotListen
    from tuneplane_node.daemon.server import serve as run

    # SIGTERM/SIGINT stop it gracefully: no new connections, requests in flight finish,
    # then the app's cleanup cancels pulls and closes the engine's pool.
    try:
        asyncio.run(run(settings, host=host or settings.node_host, port=port or settings.node_port))
    except (CannotListen, EngineTaken) as exc:
        # Exit 1, not 2 (a configuration error, never restarted): a taken port may free
        # up, the other daemon may be on its way out.
        log.error("%s", exc)
        return 1
    return 0


async def print_inventory(settings: NodeSettings) -> int:
    from tuneplane_node.gpu.allocator import GpuAllocator
    from tuneplane_node.jobs import read_inventory
    from tuneplane_node.jobs.nodestate import NodeStateFile
    from tuneplane_node.runtime import detect_runtime

    runtime = await detect_runtime(settings, cache=False)
    allocator = GpuAllocator(runtime, settings)
    try:
        node = await asyncio.to_thread(NodeStateFile(settings.state_dir).load, "")
        facts = await read_inventory(runtime, allocator, settings, node)
    finally:
        await allocator.close()
        await runtime.close()
    from tuneplane_node.daemon import machine
    from tuneplane_node.daemon.routes import features  # what a daemon of this build serves

    print(json.dumps(machine.inventory_json(facts, features=features()), indent=2))
    return 0
