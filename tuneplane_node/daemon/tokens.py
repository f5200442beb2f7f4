"""TokenSet: the bearer tokens the node accepts, and their rotation.

``TUNEPLANE_NODE_TOKEN`` and every line of ``TUNEPLANE_NODE_TOKEN_FILE`` are accepted,
so an operator rotates by adding the new token to the file, moving the consoles over,
then removing the old one. The file is read again when it changes (watched twice a
second, off the loop) and on SIGHUP. A file that turns empty or unreadable keeps the
last good set: a typo must not lock every console out. A token never reaches a log.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from pathlib import Path

from tuneplane_node.clock import SYSTEM_CLOCK, Clock
from tuneplane_node.errors import ConfigError
from tuneplane_node.settings import TOKEN_PATTERN, NodeSettings, env_name
from tuneplane_node.watched import FileStamp

log = logging.getLogger(__name__)
WATCH_S = 0.5


class TokenSet:
    def __init__(
        self, *, static: str | None, path: Path | None, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.static = static
        self.path = path
        self.clock = clock  # the watch's period
        self.stamp = FileStamp(path) if path is not None else None
        self._expected: tuple[bytes, ...] = ()

    @classmethod
    def from_settings(cls, settings: NodeSettings, *, clock: Clock = SYSTEM_CLOCK) -> TokenSet:
        """The start-up set; no token at all, or a bad file, is a ConfigError."""
        static = settings.node_token.get_secret_value() if settings.node_token else None
        tokens = cls(static=static, path=settings.node_token_file, clock=clock)
        from_file: list[str] = []
        if tokens.path is not None:
            try:
                from_file = tokens._read()
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{env_name('node_token_file')}: {exc}") from None
            if not from_file:
                raise ConfigError(f"{env_name('node_token_file')}: {tokens.path} holds no token")
        if static is None and not from_file:
            raise ConfigError(
                f"{env_name('node_token')} is not set: the node refuses to start without a token"
            )
        tokens._use(from_file)
        return tokens

    def accepts(self, authorization: bytes) -> bool:
        """Whether the Authorization header carries a token of the set. Every token is
        compared, in constant time, whatever matched: the timing tells nothing."""
        matched = False
        for expected in self._expected:
            matched |= hmac.compare_digest(authorization, expected)
        return matched

    def __len__(self) -> int:
        return len(self._expected)

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
        log.info("token file %s read: %d token(s) accepted", self.path, len(self._expected))

    def _use(self, from_file: list[str]) -> None:
        tokens = ([self.static] if self.static else []) + from_file
        self._expected = tuple(f"Bearer {token}".encode() for token in dict.fromkeys(tokens))

    def _read(self) -> list[str]:
        assert self.path is not None and self.stamp is not None
        self.stamp.reading()
        lines = self.path.read_text(encoding="ascii").splitlines()
        tokens = [line.strip() for line in lines]
        tokens = [token for token in tokens if token and not token.startswith("#")]
        for number, token in enumerate(tokens, start=1):
            if not TOKEN_PATTERN.fullmatch(token):
                raise ValueError(f"token {number} is not printable ASCII without spaces")
        return tokens
