"""The audit trail: one INFO line per verb that changes something, saying who asked
(the client's address, and its certificate's subject under mutual TLS), what, and how it
ended, and the name of the token it used (never the token). Lines carry ``run_id``,
``ref``, ``image``, ``gpus`` and ``token`` as fields for JSON logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tuneplane_node.daemon.access.guard import TOKEN_KEY
from tuneplane_node.errors import NodeError

log = logging.getLogger("tuneplane_node.audit")


@dataclass
class Outcome:
    """Filled in by the handler: what was done, and facts learnt on the way."""

    result: str = "ok"
    gpus: tuple[int, ...] | None = None


@contextmanager
def audited(request: web.Request, action: str, **facts: Any) -> Iterator[Outcome]:
    """Log the verb when it ends: its result, or the refusal and its status."""
    outcome = Outcome()
    try:
        yield outcome
    except NodeError as exc:
        _write(request, action, "refused", facts, status=exc.status, reason=exc.message)
        raise
    if outcome.gpus is not None:
        facts["gpus"] = list(outcome.gpus)
    _write(request, action, outcome.result, facts, status=200)


def refused_for_scope(request: web.Request, error: NodeError) -> None:
    """A verb its token's scope does not buy (``403 insufficient_scope``): the token that
    asked past its scope is named, as every verb's line names its token. The action is
    the verb's path (``cordon``, ``images pull``): the route was never reached."""
    action = request.path.removeprefix("/node/v1/").replace("/", " ") or request.path
    _write(request, action, "refused", {}, status=error.status, reason=error.message)


def _write(
    request: web.Request, action: str, result: str, facts: dict[str, Any], **more: Any
) -> None:
    client, subject = who(request)
    token = request.get(TOKEN_KEY)
    name = token.name if token is not None else "-"
    shown = {k: v for k, v in facts.items() if v not in (None, "")}
    about = " ".join(f"{k}={v}" for k, v in shown.items())
    why = f": {more['reason']}" if more.get("reason") else ""
    log.info(
        "audit: %s %s by %s%s with token %s: %s%s",
        action,
        about or "-",
        client,
        f" ({subject})" if subject else "",
        name,
        result,
        why,
        extra={
            "action": action,
            "client": client,
            "subject": subject,
            "token": name,
            "result": result,
        }
        | shown
        | more,
    )


def node_action(action: str, result: str, **facts: Any) -> None:
    """The audit line of something the node did by itself (the image GC's removals):
    no request, so the client is ``node``."""
    shown = {k: v for k, v in facts.items() if v not in (None, "")}
    about = " ".join(f"{k}={v}" for k, v in shown.items())
    log.info(
        "audit: %s %s by node: %s",
        action,
        about or "-",
        result,
        extra={"action": action, "client": "node", "result": result} | shown,
    )


def who(request: web.Request) -> tuple[str, str | None]:
    """The peer's address, and the subject of the certificate it presented (mTLS)."""
    client = request.remote or "unknown"
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    return client, _subject(cert) if cert else None


def _subject(cert: dict[str, Any]) -> str | None:
    """``CN=console,O=tuneplane`` from the ssl module's nested tuples."""
    parts = [f"{k}={v}" for rdn in cert.get("subject", ()) for k, v in rdn]
    return ",".join(parts) or None
