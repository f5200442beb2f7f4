"""The command line of ``tuneplane-node ctl``: each verb, the options every verb takes,
and a launch's options, read from the contract's container table (`CONTAINER`) so that a
field added there is an option unwritten. The verbs themselves are `commands`'.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tuneplane_node.ctl.client import DEFAULT_URL, URL_ENV
from tuneplane_node.ctl.commands import (
    Verb,
    cordon,
    drain,
    gc,
    gpus,
    health,
    images,
    inventory,
    jobs,
    launch,
    logs,
    observe,
    pull,
    pull_volume,
    reap,
    remove,
    signal,
    stats,
    stop,
    uncordon,
    volume_gc,
    volumes,
)
from tuneplane_node.wire.container import CONTAINER
from tuneplane_node.wire.fields import Body, Field, Schema
from tuneplane_node.wire.readers import job_signal
from tuneplane_node.wire.values import PULL_POLICIES

STATS_S = 2.0


def add_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ctl = verbs.add_parser(
        "ctl",
        parents=[_common(defaults=True)],
        help="talk to a node's API: health, launch, observe, logs, stop, cordon...",
        description="A client of the node's HTTP API. Exit codes: 0 done, 1 the node "
        "refused (4xx), 2 usage, 3 node unreachable or failed (5xx); health: 4 the node is "
        "not ok, 5 it cannot run the card jobs it has.",
    )
    sub = ctl.add_subparsers(dest="ctl_verb", metavar="VERB", required=True)
    common = _common(defaults=False)

    def verb(name: str, run: Verb, help: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, parents=[common], help=help, description=help)
        parser.set_defaults(ctl_run=run)
        return parser

    verb("health", health, "the node's health: engine, cards, pending launches")
    verb("inventory", inventory, "what the machine has: cards, storage, fabrics")
    verb("observe", observe, "the state of jobs").add_argument("refs", nargs="+", metavar="REF")
    listing = verb("jobs", jobs, "every job of the node; --watch: redrawn as they change")
    listing.add_argument("-w", "--watch", action="store_true", help="until Ctrl-C")
    usage = verb("stats", stats, "what jobs use, refreshed live (none named: every running job)")
    usage.add_argument("refs", nargs="*", metavar="REF")
    usage.add_argument("--interval", type=float, default=STATS_S, help="seconds between redraws")
    _launch_options(verb("launch", launch, "launch a job container"))
    stopping = verb("stop", stop, "stop a job: its stop signal, then SIGKILL after the timeout")
    stopping.add_argument("ref", metavar="REF")
    stopping.add_argument("--timeout", type=float, help="seconds before SIGKILL (node default)")
    stopping.add_argument("--signal", type=_signal, help="the stop signal (the job's own)")
    _warning_options(stopping)
    signalling = verb("signal", signal, "send a running job a signal; it goes on")
    signalling.add_argument("ref", metavar="REF")
    signalling.add_argument("signal", metavar="SIGNAL", type=_signal, help="SIGUSR1, usr1, 10")
    verb("remove", remove, "remove a job's container, running or not").add_argument("ref")
    logs_parser = verb("logs", logs, "a job's output, stdout and stderr together")
    logs_parser.add_argument("ref", metavar="REF")
    logs_parser.add_argument("--tail", type=int, help="the last N lines (node default 2000)")
    logs_parser.add_argument("-f", "--follow", action="store_true", help="until the job exits")
    reaping = verb("reap", reap, "remove exited jobs older than the node's TTL")
    reaping.add_argument("--max-age", type=float, help="seconds; 0: every exited job")
    verb("images", images, "the images the node pulled or its jobs use, and its pulls")
    _pull_options(verb("pull", pull, "pull an image before the jobs that need it"))
    verb("gc", gc, "run the image GC now: what it removed, and the image store after")
    verb("volumes", volumes, "the volume store's entries, its fills, and the store")
    volume_pull = verb("volume-pull", pull_volume, "fill a volume before the jobs that name it")
    volume_pull.add_argument(
        "source", metavar="SOURCE", help="its https:// URL, or an OCI reference registry/repo:tag"
    )
    volume_pull.add_argument(
        "sha256", metavar="SHA256", nargs="?", default="",
        help="its sha256 (64 hex digits); an OCI reference's manifest digest, if given",
    )  # fmt: skip
    volume_pull.add_argument("--wait", action="store_true", help="until it is filled or fails")
    verb("volume-gc", volume_gc, "evict volumes now: what went, and the volume store after")
    verb("cordon", cordon, "take no new launches").add_argument("--reason", required=True)
    verb("uncordon", uncordon, "take launches again")
    cards = verb("gpus", gpus, "the cards: reset-breaker resets the GPU circuit breaker")
    cards.add_argument("action", choices=("reset-breaker",))
    draining = verb("drain", drain, "cordon, then stop every job after a grace period")
    draining.add_argument("--reason", required=True)
    draining.add_argument("--grace", type=float, help="seconds the jobs get before SIGKILL")
    _warning_options(draining)


def _pull_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("image", metavar="IMAGE")
    parser.add_argument("--wait", action="store_true", help="until it is pulled or fails")
    parser.add_argument("--pull-policy", choices=PULL_POLICIES, help="always: pull it again")
    parser.add_argument("--username", help="for the image's registry (else the node's file)")
    parser.add_argument(
        "--password-stdin", action="store_true", help="read --username's password from stdin"
    )


def _warning_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--warn-signal", type=_signal, help="a signal first, for the job to checkpoint"
    )
    parser.add_argument(
        "--warn", type=float, metavar="SECONDS", help="time the warning gives (the timeout)"
    )


def _signal(text: str) -> str:
    name = job_signal(text)
    if name is None:
        raise argparse.ArgumentTypeError(
            f"{text!r}: not a signal a job can be sent (SIGINT, SIGTERM, SIGUSR1, SIGUSR2, "
            "SIGHUP, SIGQUIT, SIGWINCH; SIGKILL and SIGSTOP are not)"
        )
    return name


def _common(*, defaults: bool) -> argparse.ArgumentParser:
    """The options every verb takes, before or after it. Given after the verb they must
    not reset what was given before it: there their default is to set nothing."""

    def default(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    options = argparse.ArgumentParser(add_help=False)
    options.add_argument(
        "--url", default=default(None), help=f"the node's API (${URL_ENV}, else {DEFAULT_URL})"
    )
    options.add_argument(
        "--token-file",
        type=Path,
        default=default(None),
        help="file whose first line that is not blank or # is the token "
        "(else $TUNEPLANE_NODE_TOKEN)",
    )
    options.add_argument("--cacert", type=Path, default=default(None), help="CA of the node's cert")
    options.add_argument("--cert", type=Path, default=default(None), help="client cert (mTLS)")
    options.add_argument("--key", type=Path, default=default(None), help="its key")
    options.add_argument(
        "--json", action="store_true", default=default(False), help="print the answer's JSON"
    )
    return options


# The container fields launch's own options below fill. Every other field of the launch's
# container (wire.container.CONTAINER) is an option of its name taking its text as the
# console would send it (`--shm-size 16g`), so a field added there reaches ctl unwritten.
_OWN_FIELDS = frozenset({"name", "image", "command", "env", "gpus", "mounts", "labels"})


def _text_fields() -> tuple[Field, ...]:
    """The container's fields that are a text option each. An object field (a secret's,
    as credentials) is not one: a command line is no place for it, and it is sent ""."""
    return tuple(
        field
        for field in CONTAINER.fields
        if field.name not in _OWN_FIELDS and not _an_object(field.schema)
    )


def _an_object(schema: Schema | Body) -> bool:
    """A nested body, or a value of which some form is an object (`registry_auth`)."""
    if isinstance(schema, Body):
        return True
    return any(form.get("type") == "object" for form in schema.get("anyOf", [schema]))


def _launch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-id", required=True, help="the run's id")
    parser.add_argument("--image", required=True, help="image reference")
    parser.add_argument("--name", help="container name, the job's ref (tuneplane-<run id>)")
    parser.add_argument("--gpus", type=int, default=0, help="cards to give it (default 0)")
    parser.add_argument("--env", type=_pair, action="append", default=[], metavar="K=V")
    parser.add_argument("--label", type=_pair, action="append", default=[], metavar="K=V")
    parser.add_argument(
        "--mount", type=_mount, action="append", default=[], metavar="HOST:CONTAINER[:ro]"
    )
    for field in _text_fields():
        option, doc = field.name.replace("_", "-"), _first_sentence(field.doc)
        if _is_boolean(field):  # --rdma / --no-rdma; neither: "" (the node's rule)
            parser.add_argument(
                f"--{option}", action=argparse.BooleanOptionalAction, default="", help=doc
            )
        else:
            parser.add_argument(f"--{option}", default="", help=doc)
    parser.add_argument("--wait", action="store_true", help="until it runs or fails")
    parser.add_argument(
        "--no-relaunch",
        action="store_true",
        help="an exited job of the run is the answer, never launched again (at most once)",
    )
    parser.add_argument("command", nargs="*", metavar="-- CMD", help="the argv (replaces the "
                        "image's ENTRYPOINT); none: the image's own")  # fmt: skip


def _is_boolean(field: Field) -> bool:
    forms = field.schema.get("anyOf", [field.schema]) if isinstance(field.schema, dict) else []
    return any(form.get("type") == "boolean" for form in forms)


def _first_sentence(doc: str) -> str:
    """A field's documentation cut to an option's help line (argparse formats with %)."""
    return doc.split(". ", 1)[0].replace("`", "").replace("%", "%%")


def _pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: must be NAME=VALUE")
    return name, value


def _mount(text: str) -> list[str | bool]:
    parts = text.split(":")
    if len(parts) == 3 and parts[2] in ("ro", "rw"):
        return [parts[0], parts[1], parts[2] == "ro"]
    if len(parts) != 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"{text!r}: must be HOST:CONTAINER or HOST:CONTAINER:ro")
    return [parts[0], parts[1], False]
