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
import types
from pathlib import Path

import pytest

from tests.conftest import fake_settings
from tuneplane_node.daemon.access import guard
from tuneplane_node.daemon.access.guard import AuthFailures, refuse
from tuneplane_node.daemon.access.tokens import (
    MAX_NAME_CHARS,
    TokenSet,
    fingerprint,
    parse_line,
)
from tuneplane_node.errors import TooManyAuthFailures, Unauthorized

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
    assert f"token file {tmp_path / 'tokens'} read: 1 token(s) accepted" in caplog.text


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


async def test_a_guessing_peer_waits_four_answers_at_a_time_and_none_stays_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past `SLOW_AFTER` failures each answer waits its delay, at most `MAX_WAITING` of
    one peer's at once (a delayed answer holds a connection); the others are a 429 at
    once. Once they are answered the peer holds no waiting answer."""
    slept: list[float] = []
    release = asyncio.Event()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        await release.wait()

    # The guard's own asyncio only: the loop and this test sleep as ever.
    monkeypatch.setattr(guard, "asyncio", types.SimpleNamespace(sleep=sleep))
    failures = AuthFailures()
    for _ in range(guard.SLOW_AFTER):  # typos are free: no wait
        with pytest.raises(Unauthorized):
            await refuse(failures, "10.0.0.9")
    assert slept == []

    waiting = [asyncio.create_task(refuse(failures, "10.0.0.9")) for _ in range(guard.MAX_WAITING)]
    await asyncio.sleep(0)
    assert slept == [guard.delay_s(guard.SLOW_AFTER + n + 1) for n in range(guard.MAX_WAITING)]
    with pytest.raises(TooManyAuthFailures):
        await refuse(failures, "10.0.0.9")  # a fifth at once: not held

    release.set()
    answers = await asyncio.gather(*waiting, return_exceptions=True)
    assert all(isinstance(answer, Unauthorized) for answer in answers), answers
    assert failures.waiting == {}
