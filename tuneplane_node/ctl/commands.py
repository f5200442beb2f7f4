"""The verbs of ``tuneplane-node ctl``: ask the node, show the answer (rich tables;
``--json``: the answer as the API gave it). Their command line is `options`'.

A client of the HTTP API only: nothing here imports daemon, jobs or runtime code, so
what an operator sees is what a console would get.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.live import Live

from tuneplane_node.client import ClientError, JobState, NodeClient, NodeError, Tls
from tuneplane_node.ctl import render, stores
from tuneplane_node.ctl.client import DEFAULT_URL, URL_ENV, CtlError, exit_code, read_token
from tuneplane_node.printable import printable
from tuneplane_node.wire.container import CONTAINER

NOT_OK = 4
"""``health``'s exit code: the node answered, and it is not ok (``ok: false``)."""
NO_CARD_JOBS = 5
"""``health``'s exit code: the node is ok, and a launch asking for cards would be a 409
(``gpu_ready: false``)."""
POLL_S = 0.5
PIPE_WIDTH = 10_000
"""Columns of ctl's output in a pipe: no line of a table is cut or wrapped."""
WATCH_WAIT_S = 60.0  # the node's default: an idle watch asks once a minute
NO_LIVE = contextlib.nullcontext(None)
DONE = {"ok": True}  # the answer of stop, signal and remove
NAME_PREFIX = "tuneplane-"  # the node's own default, so ctl's jobs read like a console's
_PLAIN_RUN_ID = re.compile(r"[a-zA-Z0-9_.-]{1,120}")

Verb = Callable[["Ctl", argparse.Namespace], int]


@dataclass(frozen=True)
class Ctl:
    client: NodeClient
    out: Console
    json: bool

    def show(self, answer: Any, human: Callable[[Console, Any], None]) -> int:
        if self.json:
            self.raw(answer)
        else:
            human(self.out, answer)
        return 0

    def raw(self, answer: Any) -> None:
        print(json.dumps(answer, indent=2), flush=True)

    def line(self, answer: Any) -> None:
        """One answer of a stream of them: one line each."""
        print(json.dumps(answer, separators=(",", ":")), flush=True)


def run(args: argparse.Namespace) -> int:
    """Run the verb; every failure is one line on stderr and its exit code."""
    try:
        with NodeClient(
            args.url or os.environ.get(URL_ENV) or DEFAULT_URL,
            token=read_token(args.token_file),
            tls=Tls(args.cacert, args.cert, args.key),
        ) as client:
            verb: Verb = args.ctl_run
            return verb(Ctl(client, console(), args.json), args)
    except (CtlError, ClientError) as exc:
        # One line whatever the node's words hold (a log reader takes a line per failure),
        # its controls escaped: a registry's or engine's words, onto a terminal.
        said = json.dumps(failure_json(exc)) if args.json else " ".join(str(exc).splitlines())
        print(f"tuneplane-node ctl: {printable(said)}" if not args.json else said, file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader (head, less) went away: nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error
        return 0


def console() -> Console:
    """Rich's console: a terminal's width, or, in a pipe, as wide as a line is (a table
    cut at 80 columns loses the ends of names). No emoji codes either: ":skull:" in a
    registry's words stays text."""
    width = None if sys.stdout.isatty() else PIPE_WIDTH
    return Console(highlight=False, emoji=False, width=width)


def failure_json(exc: CtlError | ClientError) -> dict[str, Any]:
    """``--json``'s failure: the node's own ``{detail, code, errors}``; for a failure of
    this side (``usage``) or no answer (``unreachable``), the sentence and a word."""
    if isinstance(exc, NodeError):
        errors = [{"field": e.field, "code": e.code, "detail": e.detail} for e in exc.errors]
        return {"detail": exc.detail, "code": exc.code, "errors": errors}
    code = "usage" if exit_code(exc) == 2 else "failed"
    return {"detail": " ".join(str(exc).splitlines()), "code": code, "errors": []}


def _warning(args: argparse.Namespace) -> dict[str, Any]:
    return {"warn_signal": args.warn_signal, "warn_s": args.warn}


# --- the verbs ------------------------------------------------------------------------


def health(ctl: Ctl, args: argparse.Namespace) -> int:
    """The table (or the JSON); the exit code says the verdict, for a script or a probe:
    `NOT_OK` when the node is not ok, `NO_CARD_JOBS` when it has cards and cannot run
    card jobs (``gpu_ready: false``)."""
    answer = ctl.client.health().raw
    ctl.show(answer, render.show_health)
    if answer.get("ok") is not True:
        return NOT_OK
    return NO_CARD_JOBS if answer.get("gpu_ready") is False else 0


def inventory(ctl: Ctl, args: argparse.Namespace) -> int:
    return ctl.show(ctl.client.inventory().raw, render.show_inventory)


def observe(ctl: Ctl, args: argparse.Namespace) -> int:
    answer = {"states": raw(ctl.client.observe(args.refs))}
    return ctl.show(answer, lambda out, body: render.show_states(out, body["states"]))


def jobs(ctl: Ctl, args: argparse.Namespace) -> int:
    """The table of every job; ``--watch``: again at each change, from blocking queries
    (a terminal redraws it in place; a pipe gets it anew; ``--json`` each answer as a
    line of its own)."""
    listing = ctl.client.jobs()  # a node that cannot answer ends the command here
    if not args.watch:
        return ctl.show(listing.raw, lambda out, a: render.show_states(out, a["jobs"]))
    jobs: dict[str, JobState] = {}
    live = ctl.out.is_terminal and not ctl.json
    try:  # how a watch ends, from its first line or draw on: not a failure
        listing.apply(jobs)
        if ctl.json:
            ctl.line(listing.raw)
        table = _jobs_table(jobs)
        with Live(table, console=ctl.out, auto_refresh=False) if live else NO_LIVE as shown:
            if not live and not ctl.json:
                ctl.out.print(table)
            # From here the client rides out an engine outage or a daemon restart.
            for answer in ctl.client.watch(wait=WATCH_WAIT_S, index=listing.index):
                answer.apply(jobs)
                if ctl.json:
                    ctl.line(answer.raw)
                elif shown is not None:
                    shown.update(_jobs_table(jobs), refresh=True)
                else:
                    ctl.out.print(_jobs_table(jobs))
    except KeyboardInterrupt:
        pass
    return 0


def _jobs_table(jobs: Mapping[str, JobState]) -> Any:
    return render.states_table({ref: state.raw for ref, state in sorted(jobs.items())})


def raw(states: Mapping[str, Any]) -> dict[str, Any]:
    """Typed answers by ref as the API gave them."""
    return {ref: state.raw for ref, state in states.items()}


def stats(ctl: Ctl, args: argparse.Namespace) -> int:
    """``--json``: the answer once. A terminal: the table redrawn every ``--interval``
    until Ctrl-C, as `docker stats`; a pipe: the table once."""
    refs = args.refs or None
    answer = {"stats": raw(ctl.client.stats(refs))}
    if ctl.json or not ctl.out.is_terminal:
        return ctl.show(answer, lambda out, a: out.print(render.stats_table(a["stats"])))
    try:  # how a live view ends, even during its first draw: not a failure
        with Live(render.stats_table(answer["stats"]), console=ctl.out, auto_refresh=False) as live:
            while True:
                time.sleep(max(0.1, args.interval))
                answer = {"stats": raw(ctl.client.stats(refs))}
                live.update(render.stats_table(answer["stats"]), refresh=True)
    except KeyboardInterrupt:
        return 0


def stop(ctl: Ctl, args: argparse.Namespace) -> int:
    ctl.client.stop(args.ref, timeout=args.timeout, signal=args.signal, **_warning(args))
    return ctl.show(DONE, lambda out, _: out.print(f"stopped {args.ref}"))


def signal(ctl: Ctl, args: argparse.Namespace) -> int:
    ctl.client.signal(args.ref, args.signal)
    return ctl.show(DONE, lambda out, _: out.print(f"sent {args.signal} to {args.ref}"))


def remove(ctl: Ctl, args: argparse.Namespace) -> int:
    ctl.client.remove(args.ref)
    return ctl.show(DONE, lambda out, _: out.print(f"removed {args.ref}"))


def reap(ctl: Ctl, args: argparse.Namespace) -> int:
    answer = {"removed": ctl.client.reap(max_age_s=args.max_age)}
    return ctl.show(answer, lambda out, a: out.print(f"removed {a['removed']} exited job(s)"))


def gc(ctl: Ctl, args: argparse.Namespace) -> int:
    return ctl.show(ctl.client.image_gc().raw, stores.show_image_gc)


def cordon(ctl: Ctl, args: argparse.Namespace) -> int:
    return ctl.show(ctl.client.cordon(args.reason).raw, render.show_node_state)


def gpus(ctl: Ctl, args: argparse.Namespace) -> int:
    """``gpus reset-breaker``: the GPU circuit breaker reset, and how it stands after."""
    return ctl.show(ctl.client.reset_breaker().raw, render.show_breaker)


def uncordon(ctl: Ctl, args: argparse.Namespace) -> int:
    return ctl.show(ctl.client.uncordon().raw, render.show_node_state)


def drain(ctl: Ctl, args: argparse.Namespace) -> int:
    answer = ctl.client.drain(args.reason, grace_s=args.grace, **_warning(args))
    return ctl.show(answer.raw, render.show_node_state)


def logs(ctl: Ctl, args: argparse.Namespace) -> int:
    if args.follow:
        for text in ctl.client.follow(args.ref, tail=args.tail):
            sys.stdout.write(text)
            sys.stdout.flush()
        return 0
    answer = ctl.client.logs(args.ref, tail=args.tail)
    if ctl.json:
        ctl.raw(answer.raw)
        return 0
    sys.stdout.write(answer.logs)
    if answer.truncated:
        print("(older output was cut: the node caps a logs answer)", file=sys.stderr)
    return 0


# --- images ---------------------------------------------------------------------------


def images(ctl: Ctl, args: argparse.Namespace) -> int:
    return ctl.show(ctl.client.images().raw, stores.show_images)


def pull(ctl: Ctl, args: argparse.Namespace) -> int:
    """A prefetch; ``--wait``: its bar until the image is here (0) or the pull failed
    or went (1)."""
    answer = ctl.client.pull_image(args.image, **pull_body(args))
    image = render.as_text(args.image)  # the registry's words and the image's are text
    phase = render.as_text(answer.phase)
    ctl.show(answer.raw, lambda out, _: out.print(f"{image}: [cyan]{phase}[/]"))
    if not args.wait or answer.phase == "present":
        return 0
    found = _await_prefetch(ctl, args.image)
    if found.get("phase") == "failed":
        ctl.show(
            found,
            lambda out, p: out.print(f"{image}: [red]failed[/]: {render.as_text(p['error'])}"),
        )
        return 1
    if not found.get("id"):
        ctl.show(found, lambda out, _: out.print(f"{image}: [red]gone[/] (not pulled)"))
        return 1
    ctl.show(found, lambda out, _: out.print(f"{image}: [green]present[/]"))
    return 0


def pull_body(args: argparse.Namespace) -> dict[str, Any]:
    """The prefetch's fields beside its image: the pull policy and the credentials."""
    body: dict[str, Any] = {"pull_policy": args.pull_policy or ""}
    if args.password_stdin and not args.username:
        raise CtlError("--password-stdin needs --username")
    if args.username:
        password = sys.stdin.readline().rstrip("\r\n") if args.password_stdin else ""
        if not password:
            raise CtlError("--username needs its password: --password-stdin")
        body["registry_auth"] = {"username": args.username, "password": password}
    return body


def _await_prefetch(ctl: Ctl, image: str) -> Mapping[str, Any]:
    """Read the node's images until the image's pull ends: the image as listed, or the
    failed pull (or {} when neither: the pull went without the image), as the node's JSON."""
    with render.PullProgress(ctl.out, image, shown=not ctl.json) as bar:
        while True:
            answer = ctl.client.images()
            pulls = [p for p in answer.pulls if p.image == image]
            running = [p for p in pulls if p.phase == "pulling"]
            if running:
                bar.update(running[0].raw, prefix="")
                time.sleep(POLL_S)
                continue
            listed = [i for i in answer.images if i.image == image]
            found = (pulls or listed or [None])[0]
            return {} if found is None else found.raw


# --- volumes --------------------------------------------------------------------------


def volumes(ctl: Ctl, args: argparse.Namespace) -> int:
    return ctl.show(ctl.client.volumes().raw, stores.show_volumes)


def pull_volume(ctl: Ctl, args: argparse.Namespace) -> int:
    """A volume prefetch; ``--wait``: the node answers when the fill has ended (its
    error: exit 1, as every refusal)."""
    answer = ctl.client.pull_volume(args.source, args.sha256, wait=args.wait)
    return ctl.show(answer.raw, stores.show_volume_pull)


def volume_gc(ctl: Ctl, args: argparse.Namespace) -> int:
    return ctl.show(ctl.client.volume_gc().raw, stores.show_volume_gc)


# --- launch ---------------------------------------------------------------------------


def launch(ctl: Ctl, args: argparse.Namespace) -> int:
    ref = args.name or default_name(args.run_id)
    body = launch_body(args, name=ref)
    answer = ctl.client.launch(
        body["run_id"], body["container"], requested_gpus=body["requested_gpus"]
    ).raw
    ctl.show(answer, lambda out, _: out.print(launched(ref, answer)))
    if not args.wait or answer.get("phase") == "running":
        return 0
    state = _await_pull(ctl, ref, answer.get("image", args.image))
    if _code(state):  # a failure: one line on stderr, as every other (the JSON still out)
        if ctl.json:
            ctl.raw(state)
        raise LaunchFailed(failure(ref, state))
    ctl.show(state, lambda out, _: out.print(ended(ref, state)))
    return 0


def default_name(run_id: str) -> str:
    """``tuneplane-<run id>``, the name the node would give; a run id that would not
    make a name as it is has to come with ``--name``."""
    if not _PLAIN_RUN_ID.fullmatch(run_id):
        raise CtlError(f"--run-id {run_id!r} does not make a container name: give --name")
    return NAME_PREFIX + run_id


def launch_body(args: argparse.Namespace, *, name: str) -> dict[str, Any]:
    """The whole launch as a 0.3.15 console sends it: every container field in the
    contract's order, "" for the ones left empty."""
    own = {
        "name": name,
        "image": args.image,
        "command": args.command,
        "env": dict(args.env),
        "gpus": [],
        "mounts": args.mount,
        "labels": dict(args.label),
    }
    container = {field: own.get(field, getattr(args, field, "")) for field in CONTAINER.names}
    relaunch = not getattr(args, "no_relaunch", False)
    body = {"run_id": args.run_id, "requested_gpus": args.gpus, "container": container}
    return {**body, "relaunch": relaunch}


def launched(ref: str, answer: Mapping[str, Any]) -> str:
    ref, answer = render.as_text(ref), render.as_text(answer)
    phase = answer.get("phase")
    again = "already " if answer.get("idempotent") else ""
    if phase == "running":
        container = f", container {answer['container_id']}" if "container_id" in answer else ""
        return f"{ref}: {again}[green]running[/] on cards {answer.get('gpus')}{container}"
    if phase == "exited":
        return f"{ref}: already exited ({answer.get('exit_code')}), not launched again"
    return f"{ref}: {again}[cyan]{phase}[/] {answer.get('image', '')}"


def _await_pull(ctl: Ctl, ref: str, image: str) -> Mapping[str, Any]:
    """Observe the pending launch until it is a container or has failed."""
    with render.PullProgress(ctl.out, image, shown=not ctl.json) as bar:
        while True:
            state: Mapping[str, Any] = ctl.client.observe([ref])[ref].raw
            if state.get("pending_phase") in (None, "failed"):
                return state
            bar.update(state)
            time.sleep(POLL_S)


class LaunchFailed(CtlError):
    exit_code = 1


def ended(ref: str, state: Mapping[str, Any]) -> str:
    ref, state = render.as_text(ref), render.as_text(state)
    return f"{ref}: {render.status(state)}"


def failure(ref: str, state: Mapping[str, Any]) -> str:
    """Why a waited launch came to nothing, as plain text (no markup: stderr)."""
    if state.get("pending_phase") == "failed":
        return f"{ref}: failed: {state.get('pending_error')}"
    return f"{ref}: gone (stopped or removed while it was pending)"


def _code(state: Mapping[str, Any]) -> int:
    """1 when the launch came to nothing: it failed, or it is gone."""
    return 1 if state.get("pending_phase") == "failed" or not state.get("exists") else 0
