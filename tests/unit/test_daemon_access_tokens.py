"""The token file and the guard's answers to a guessing peer, in this process (issue 52:
the mutants of `daemon/access/tokens.py` and `guard.py` the other tests let live).

What an operator reads when a token file goes wrong (the line, the path), where a name's
length ends, a reload that keeps the last good set and forgets a token taken out, and a
guessing peer's delayed answers: how many wait at once, and that none is left counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path

import pytest

from tests.conftest import fake_settings
from tests.fakes.clock import FakeClock
from tuneplane_node.daemon.access.tokens import (
    MAX_MATCHED,
    MAX_NAME_CHARS,
    WATCH_S,
    TokenSet,
    fingerprint,
    parse_line,
)
from tuneplane_node.errors import ConfigError

A, B = "a" * 20, "b" * 20
HEADER = "Bearer {}".format


def test_a_tokens_name_by_default_is_its_fingerprint_never_the_token() -> None:
    assert fingerprint(A) == "sha256:" + hashlib.sha256(A.encode()).hexdigest()[:8]
    assert parse_line(A, 1).name == fingerprint(A)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("tok\x7fen-0123456789abc", "token 4 is not printable ASCII without spaces"),
        (f"{A} name=", "token 4: 'name' is not name=... or scope=..."),
        (f"{A} scope=full scope=observe", "token 4: 'scope' is not name=... or scope=..."),
        (f"{A} name={'n' * (MAX_NAME_CHARS + 1)}", f"a name is {MAX_NAME_CHARS} characters"),
    ],
)
def test_a_bad_line_is_refused_naming_its_number_never_the_token(line: str, why: str) -> None:
    with pytest.raises(ValueError) as refused:
        parse_line(line, 4)
    assert why in str(refused.value) and A not in str(refused.value)


def test_a_name_of_the_longest_length_is_taken() -> None:
    assert parse_line(f"{A} name={'n' * MAX_NAME_CHARS}", 1).name == "n" * MAX_NAME_CHARS


def tokens_of(tmp_path: Path, text: str) -> TokenSet:
    path = tmp_path / "tokens"
    path.write_text(text)
    return TokenSet.from_settings(fake_settings(tmp_path, node_token=None, node_token_file=path))


async def test_a_reload_takes_the_new_set_and_forgets_a_token_taken_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tuneplane_node.daemon.access.tokens")
    tokens = tokens_of(tmp_path, f"{A} scope=observe\n{B}\n")
    assert tokens.match(HEADER(A)) is not None  # remembered as matched
    assert tokens.scopes() == {"full": 1, "observe": 1}

    (tmp_path / "tokens").write_text(f"# rotated\n{B} name=console\n")
    await tokens.reload()

    assert tokens.match(HEADER(A)) is None  # not from memory either
    assert tokens.match(HEADER(B)).name == "console"  # type: ignore[union-attr]
    assert tokens.scopes() == {"full": 1}
    said = f"token file {tmp_path / 'tokens'} read: 1 token(s) accepted"
    assert said in [record.getMessage() for record in caplog.records]


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("short\n", "unreadable (token 1: a token of 5 characters"),
        ("# nothing\n", "holds no token"),
    ],
)
async def test_a_bad_reload_keeps_the_last_good_set_and_names_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, said: str
) -> None:
    tokens = tokens_of(tmp_path, f"{A}\n")
    (tmp_path / "tokens").write_text(text)
    await tokens.reload()
    assert tokens.match(HEADER(A)) is not None
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert line.startswith(f"token file {tmp_path / 'tokens'} ") and said in line
    assert "keeping the last good tokens" in line


def test_the_environments_token_alone_is_the_full_token_named_env(tmp_path: Path) -> None:
    tokens = TokenSet.from_settings(fake_settings(tmp_path, node_token=A))
    token = tokens.match(HEADER(A))
    assert token is not None and (token.name, token.scope) == ("env", "full")
    assert (len(tokens), tokens.scopes()) == (1, {"full": 1})
    assert len(TokenSet(static=None, path=None)) == 0  # an empty set matches nothing
    assert TokenSet(static=None, path=None).match(HEADER(A)) is None


def test_scopes_counts_every_token_of_a_scope(tmp_path: Path) -> None:
    assert tokens_of(tmp_path, f"{A}\n{B}\n").scopes() == {"full": 2}


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"node_token": "x" * 15}, "TUNEPLANE_NODE_TOKEN: a token of 15 characters is too "),
        ({"node_token": None, "node_token_file": "short\n"}, "TUNEPLANE_NODE_TOKEN_FILE: token 1"),
        ({"node_token": None, "node_token_file": "#\n"}, "TUNEPLANE_NODE_TOKEN_FILE: {} holds no"),
        (  # ASCII only: a file in another encoding is refused whole, never read in part
            {"node_token": None, "node_token_file": f"# café\n{A}\n"},
            "TUNEPLANE_NODE_TOKEN_FILE: 'ascii' codec can't decode",
        ),
        (
            {"node_token": None},
            "neither TUNEPLANE_NODE_TOKEN nor TUNEPLANE_NODE_TOKEN_FILE is set: the node "
            "refuses to start without a token (16 characters at least: `openssl rand -hex 32`)",
        ),
    ],
)
def test_a_start_without_a_good_token_names_the_setting_at_fault(
    tmp_path: Path, settings: dict[str, str | None], why: str
) -> None:
    path = tmp_path / "tokens"
    if (text := settings.get("node_token_file")) is not None:
        path.write_bytes(text.encode())
        settings = {**settings, "node_token_file": str(path)}
    with pytest.raises(ConfigError) as refused:
        TokenSet.from_settings(fake_settings(tmp_path, **settings))
    assert refused.value.message.startswith(why.format(path))


def test_a_header_is_read_as_the_scheme_then_the_token_and_hostile_bytes_match_nothing(
    tmp_path: Path,
) -> None:
    tokens = tokens_of(tmp_path, f"{A}\n")
    assert tokens.match(f"Bearer  {A}") is not None  # two spaces: the token still
    assert tokens.match("Bearer \udcff" + A[1:]) is None  # undecodable bytes: no crash
    assert parse_line(f"{A} name=ci=1", 1).name == "ci=1"  # a name's own "=" is kept


def test_only_a_right_header_is_remembered_and_the_memory_is_bounded(tmp_path: Path) -> None:
    """A wrong header always takes the full comparison; a right one is kept, at most
    `MAX_MATCHED` of them (a header may be written in endless ways)."""
    tokens = tokens_of(tmp_path, f"{A}\n")
    tokens.match(HEADER(B))
    assert tokens._matched == {}
    token = tokens.match(HEADER(A))
    assert token is not None and tokens._matched == {HEADER(A): token}
    most = 0
    for spaces in range(MAX_MATCHED + 1):
        assert tokens.match("Bearer " + " " * spaces + A) is token
        most = max(most, len(tokens._matched))
    assert most == MAX_MATCHED


async def test_the_watch_reads_a_changed_file_and_a_set_without_file_waits(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    path = tmp_path / "tokens"
    path.write_text(f"{A}\n")
    settings = fake_settings(tmp_path, node_token=None, node_token_file=path)
    tokens = TokenSet.from_settings(settings, clock=clock)
    alone = TokenSet.from_settings(fake_settings(tmp_path, node_token=B), clock=clock)
    watches = [asyncio.create_task(t.watch()) for t in (tokens, alone)]
    try:
        path.write_text(f"{B} name=rotated\n")
        await clock.sleeping(WATCH_S)
        clock.advance(WATCH_S)
        for _ in range(200):  # the stat and the read run on a thread
            if tokens.match(HEADER(B)) is not None:
                break
            await asyncio.sleep(0.005)
        assert tokens.match(HEADER(B)).name == "rotated"  # type: ignore[union-attr]
        assert tokens.match(HEADER(A)) is None
        assert not any(watch.done() for watch in watches)  # neither has failed
    finally:
        for watch in watches:
            watch.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
