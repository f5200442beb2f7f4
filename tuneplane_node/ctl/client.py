"""How ctl reaches the node: `tuneplane_node.client.NodeClient`, the consoles' own
client, so what an operator sees is what a console gets. Here: where the URL and the
token come from, and the exit code each failure ends the command with::

    2  this side cannot even ask: no token, a bad TLS file, a bad URL
       (CtlError, tuneplane_node.client.ConfigError)
    1  the node refused (4xx; RequestError): its ``detail`` is the sentence
    3  no answer, a failed TLS handshake, or a 5xx (Unreachable, ServerError)

``health`` adds its verdict: 4 not ok, 5 cannot run the card jobs it has (commands.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from tuneplane_node.client import ClientError, ConfigError, NodeClient, RequestError, Tls

DEFAULT_URL = "http://127.0.0.1:8470"
URL_ENV = "TUNEPLANE_CTL_URL"
TOKEN_ENV = "TUNEPLANE_NODE_TOKEN"

__all__ = ["DEFAULT_URL", "TOKEN_ENV", "URL_ENV", "CtlError", "NodeClient", "Tls", "exit_code"]


class CtlError(Exception):
    """ctl's own failure: a usage error (the token) is exit code 2; a kind of its own
    (a waited launch that failed) may say another."""

    exit_code = 2


def exit_code(error: ClientError | CtlError) -> int:
    if isinstance(error, CtlError):
        return error.exit_code
    if isinstance(error, ConfigError):
        return 2
    return 1 if isinstance(error, RequestError) else 3


def read_token(token_file: Path | None) -> str:
    """The token: the first word of the file's first line that is neither blank nor a #
    comment (the daemon's token file works as it is, ``name=`` and ``scope=`` after the
    token), else ``TUNEPLANE_NODE_TOKEN``. Never echoed, not even in an error."""
    if token_file is None:
        token = os.environ.get(TOKEN_ENV, "").strip()
        if not token:
            raise CtlError(f"no token: give --token-file or set {TOKEN_ENV}")
        return token
    try:
        lines = token_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CtlError(f"--token-file {token_file}: cannot read it: {reason}") from None
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            return line.split()[0]
    raise CtlError(f"--token-file {token_file}: holds no token")
