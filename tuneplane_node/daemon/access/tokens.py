"""TokenSet: the bearer tokens the node accepts, their names and scopes, and rotation.

``TUNEPLANE_NODE_TOKEN`` and every line of ``TUNEPLANE_NODE_TOKEN_FILE`` are accepted,
so an operator rotates by adding the new token to the file, moving the consoles over,
then removing the old one. A line is ``<token> [name=<name>] [scope=full|operate|observe|metrics]``
(a bare token is ``full``): the scraper gets a ``metrics`` token, a dashboard an
``observe`` one, an operator an ``operate`` one (images, cordon, drain), and only the
console the token that launches containers. The name is
what logs say of a token; an unnamed one is named by a fingerprint (``sha256:`` and 8 hex
digits of its hash), never by the token. The file is read again when it changes (watched
twice a second, off the loop) and on SIGHUP. A file that turns empty or unreadable keeps
the last good set: a typo must not lock every console out. A token never reaches a log.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from dataclasses import dataclass
from pathlib import Path

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import ConfigError
from tuneplane_node.settings import TOKEN_PATTERN, NodeSettings, env_name
from tuneplane_node.watched import FileStamp

log = logging.getLogger(__name__)
WATCH_S = 0.5
FULL, OPERATE, OBSERVE, METRICS = "full", "operate", "observe", "metrics"
GRANTS = {
    FULL: {FULL, OPERATE, OBSERVE, METRICS},
    OPERATE: {OPERATE, OBSERVE, METRICS},
    OBSERVE: {OBSERVE, METRICS},
    METRICS: {METRICS},
}
"""What each scope buys: a scope buys the narrower ones too."""
MIN_TOKEN_CHARS = 16
"""Shorter is guessable from outside; ``openssl rand -hex 32`` makes 64."""
MAX_NAME_CHARS = 64
MAX_MATCHED = 64
"""Authorization headers remembered as matched: the set's tokens, written a few ways."""
STATIC_NAME = "env"
"""The name of ``TUNEPLANE_NODE_TOKEN`` in logs."""
TOKEN_ENV, FILE_ENV = env_name("node_token"), env_name("node_token_file")


@dataclass(frozen=True)
class Token:
    """One accepted token: what logs call it and what it may do; the secret itself is
    never printed (``repr`` leaves it out)."""

    name: str
    scope: str
    secret: bytes

    def __repr__(self) -> str:
        return f"Token(name={self.name!r}, scope={self.scope!r})"

    def grants(self, scope: str) -> bool:
        return scope in GRANTS[self.scope]


def fingerprint(secret: str) -> str:
    return "sha256:" + hashlib.sha256(secret.encode()).hexdigest()[:8]


def too_short(secret: str) -> str | None:
    """Why a token is refused for its length; None when it is long enough."""
    if len(secret) >= MIN_TOKEN_CHARS:
        return None
    return (
        f"a token of {len(secret)} characters is too easy to guess: at least "
        f"{MIN_TOKEN_CHARS}; make one with `openssl rand -hex 32`"
    )


def parse_line(line: str, number: int) -> Token:
    """``<token> [name=<name>] [scope=<scope>]``; ValueError naming the line (never the
    token) when it is not that."""
    secret, *fields = line.split()
    if not TOKEN_PATTERN.fullmatch(secret):
        raise ValueError(f"token {number} is not printable ASCII without spaces")
    if (short := too_short(secret)) is not None:
        raise ValueError(f"token {number}: {short}")
    given: dict[str, str] = {}
    for field in fields:
        key, sep, value = field.partition("=")
        if not sep or key not in ("name", "scope") or key in given or not value:
            named = field.split("=")[0]
            raise ValueError(f"token {number}: {named!r} is not name=... or scope=...")
        given[key] = value
    scope = given.get("scope", FULL)
    if scope not in GRANTS:
        raise ValueError(f"token {number}: scope {scope!r} is not one of {', '.join(GRANTS)}")
    name = given.get("name", fingerprint(secret))
    if len(name) > MAX_NAME_CHARS:
        raise ValueError(f"token {number}: a name is {MAX_NAME_CHARS} characters at most")
    return Token(name, scope, secret.encode())


def bearer(authorization: str) -> bytes | None:
    """The credentials of a ``Bearer`` header, the scheme in any case (RFC 7235)."""
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    # surrogateescape: a header of hostile bytes is a wrong token, not a crash.
    return credentials.strip().encode("utf-8", "surrogateescape")


class TokenSet:
    def __init__(
        self, *, static: str | None, path: Path | None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.static = static
        self.path = path
        self.clock = clock  # the watch's period
        self.stamp = FileStamp(path) if path is not None else None
        self._tokens: tuple[Token, ...] = ()
        self._matched: dict[str, Token] = {}  # Authorization headers that matched

    @classmethod
    def from_settings(cls, settings: NodeSettings, *, clock: Clock = SYSTEM_CLOCK) -> TokenSet:
        """The start-up set; no token at all, a short one or a bad file is a ConfigError."""
        static = settings.node_token.get_secret_value() if settings.node_token else None
        if static is not None and (short := too_short(static)) is not None:
            raise ConfigError(f"{TOKEN_ENV}: {short}")
        tokens = cls(static=static, path=settings.node_token_file, clock=clock)
        from_file: list[Token] = []
        if tokens.path is not None:
            try:
                from_file = tokens._read()
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{FILE_ENV}: {exc}") from None
            if not from_file:
                raise ConfigError(f"{FILE_ENV}: {tokens.path} holds no token")
        if static is None and not from_file:
            raise ConfigError(
                f"neither {TOKEN_ENV} nor {FILE_ENV} is set: "
                "the node refuses to start without a token (16 characters at least: "
                "`openssl rand -hex 32`)"
            )
        tokens._use(from_file)
        return tokens

    def match(self, authorization: str) -> Token | None:
        """The token of the set an Authorization header carries, or None. Every token is
        compared, in constant time, whatever matched: the timing tells nothing.

        A header that matched before is answered from memory (until the set changes): a
        console sends the same header on every request. Only a right header is kept, so
        a miss always takes the full comparison; the lookup's hash is keyed per process
        (SipHash), so its timing tells nothing either."""
        known = self._matched.get(authorization)  # pragma: no mutate (a miss compares: same answer)
        if known is not None:
            return known
        matched = self._compare(authorization)
        if matched is not None:
            if len(self._matched) >= MAX_MATCHED:
                self._matched.clear()
            self._matched[authorization] = matched
        return matched

    def _compare(self, authorization: str) -> Token | None:
        given = bearer(authorization)
        if given is None:
            return None
        matched: Token | None = None
        for token in self._tokens:
            if hmac.compare_digest(given, token.secret) and matched is None:
                matched = token
        return matched

    def __len__(self) -> int:
        return len(self._tokens)

    def scopes(self) -> dict[str, int]:
        """How many tokens of each scope: what ``check`` says."""
        counts = {scope: 0 for scope in GRANTS}
        for token in self._tokens:
            counts[token.scope] += 1
        return {scope: n for scope, n in counts.items() if n}

    async def watch(self, every: float = WATCH_S) -> None:
        """Read the file again whenever it changes; runs until cancelled."""
        while True:
            await self.clock.sleep(every)
            if self.stamp is not None and await asyncio.to_thread(self.stamp.changed):
                await self.reload()

    async def reload(self) -> None:
        """Read the file again now (SIGHUP); on failure keep the last good set."""
        if self.path is None:
            return
        try:
            tokens = await asyncio.to_thread(self._read)
        except (OSError, ValueError) as exc:
            log.error("token file %s unreadable (%s): keeping the last good tokens", self.path, exc)
            return
        if not tokens:
            log.error("token file %s holds no token: keeping the last good tokens", self.path)
            return
        self._use(tokens)
        log.info("token file %s read: %d token(s) accepted", self.path, len(self._tokens))

    def _use(self, from_file: list[Token]) -> None:
        static = [Token(STATIC_NAME, FULL, self.static.encode())] if self.static else []
        unique: dict[bytes, Token] = {}
        for token in static + from_file:  # the same token twice: its first line holds
            unique.setdefault(token.secret, token)
        self._tokens = tuple(unique.values())
        self._matched = {}  # a token removed must not match from memory

    def _read(self) -> list[Token]:
        assert self.path is not None and self.stamp is not None  # pragma: no mutate (for mypy)
        self.stamp.reading()
        lines = self.path.read_text(encoding="ascii").splitlines()
        kept = [line.strip() for line in lines]
        kept = [line for line in kept if line and not line.startswith("#")]
        return [parse_line(line, number) for number, line in enumerate(kept, start=1)]
