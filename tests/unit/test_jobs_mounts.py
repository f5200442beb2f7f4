"""The mount walk (`jobs.mounts`): what it opens, what it refuses and why, in plain words.

No privilege needed: the walk only opens. What is bound, and the swap race against real
engines, is tests/engines/test_daemon_mounts.py's.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import pytest

from tests.conftest import fake_settings
from tuneplane_node.errors import InvalidField
from tuneplane_node.jobs.mounts.policy import MountPolicy, Refused, walk
from tuneplane_node.wire.values import Mount

RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True)


def policy(root: Path, *node_files: tuple[Path, str]) -> MountPolicy:
    never_a_root = fake_settings(root).never_a_root
    return MountPolicy([root], never_a_root=never_a_root, node_files=node_files)


def refusal(policy: MountPolicy, host: Path | str) -> str:
    with pytest.raises(InvalidField) as refused:
        policy.open([Mount("/ok", "/a"), Mount(str(host), "/b")][1:])
    assert refused.value.field == "container.mounts[0]"
    return refused.value.reason


def test_a_directory_is_opened_as_itself(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (opened,) = policy(tmp_path).open([Mount(str(tmp_path / "a" / "b") + "/", "/x", True)])
    try:
        assert os.path.samestat(os.fstat(opened.fd), os.stat(tmp_path / "a" / "b"))
        assert opened.directory and opened.mount.read_only
    finally:
        opened.close()


def test_a_symlink_anywhere_in_the_path_is_named(tmp_path: Path) -> None:
    (tmp_path / "real" / "ckpt").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    host = tmp_path / "link" / "ckpt"
    assert refusal(policy(tmp_path), host) == f"{host} is not its own real path: link is a symlink"


def test_dot_dot_missing_and_unreadable_are_422s_in_words(tmp_path: Path) -> None:
    assert "'..' is not allowed" in refusal(policy(tmp_path), f"{tmp_path}/a/../b")
    assert refusal(policy(tmp_path), tmp_path / "nope").endswith(" does not exist on the node")
    (tmp_path / "fifo").mkdir()
    os.mkfifo(tmp_path / "fifo" / "pipe")
    assert "pipe is neither a directory nor a file" in refusal(
        policy(tmp_path), tmp_path / "fifo" / "pipe"
    )


def test_a_step_onto_another_filesystem_is_refused() -> None:
    """/proc is another filesystem than /: the walk never crosses a mount point."""
    with pytest.raises(Refused, match="proc is on another filesystem than its mount root"):
        walk(Path("/"), ("proc",))


@pytest.mark.parametrize("what", ["token dir", "state dir", "engine data root"])
def test_the_nodes_own_files_under_a_root_are_never_mounted(tmp_path: Path, what: str) -> None:
    """Start-up refuses such a root (test_settings); the walk refuses them all the same,
    as they are, inside a mount, or holding one."""
    own = tmp_path / "own"
    (own / "inner").mkdir(parents=True)
    mounts = policy(tmp_path, (own, what))
    assert refusal(mounts, own).startswith(f"{own} is {own} ({what}), which a job may never mount")
    assert f"is in {own} ({what})" in refusal(mounts, own / "inner")
    assert f"{tmp_path} holds {own} ({what})" in refusal(mounts, tmp_path)


def test_an_engine_directory_named_through_a_link_is_refused_as_the_real_one(
    tmp_path: Path,
) -> None:
    """The engine may say its data root by a link (``/srv/docker`` to a directory under
    a mount root): the real directory is never mounted, nor one holding it (issue 52: a
    policy keeping the path as the engine said it let both be mounted, and no test
    failed)."""
    real = tmp_path / "data" / "docker"
    (real / "overlay2").mkdir(parents=True)
    link = tmp_path.parent / f"{tmp_path.name}-docker-link"
    link.symlink_to(real)
    try:
        mounts = policy(tmp_path)
        mounts.forbid([(link, "the docker engine's data root")])
        said = "(the docker engine's data root), which a job may never mount"
        assert refusal(mounts, real).startswith(f"{real} is {real} {said}")
        assert f"is in {real}" in refusal(mounts, real / "overlay2")
        assert f"{tmp_path / 'data'} holds {real}" in refusal(mounts, tmp_path / "data")
    finally:
        link.unlink()


@pytest.mark.slow  # 2.6 s: the swapping thread and the walk share two cores
def test_a_swap_in_a_loop_never_opens_the_other_tenants_directory(tmp_path: Path) -> None:
    """Tenant A swaps its ckpt with a link to B's (RENAME_EXCHANGE) as fast as it can:
    each open is A's directory or a refusal in words, never B's."""
    mine, theirs = tmp_path / "A" / "ckpt", tmp_path / "B" / "ckpt"
    mine.mkdir(parents=True)
    theirs.mkdir(parents=True)
    (tmp_path / "A" / "swap").symlink_to(theirs)
    stop = threading.Event()
    thread = threading.Thread(target=swap, args=(mine, tmp_path / "A" / "swap", stop))
    a_inode = os.stat(mine).st_ino
    seen = {"A": 0, "B": 0, "refused": 0}
    thread.start()
    try:
        for _ in range(200):
            try:
                (opened,) = policy(tmp_path).open([Mount(str(mine), "/ckpt")])
            except InvalidField as exc:
                assert "symlink" in exc.reason or "does not exist" in exc.reason, exc.reason
                seen["refused"] += 1
                continue
            seen["A" if os.fstat(opened.fd).st_ino == a_inode else "B"] += 1
            opened.close()
    finally:
        stop.set()
        thread.join()
    assert seen["B"] == 0 and seen["A"] > 0 and seen["refused"] > 0, seen


def swap(a: Path, b: Path, stop: threading.Event) -> None:
    while not stop.is_set():
        if _libc.renameat2(-100, bytes(a), -100, bytes(b), RENAME_EXCHANGE) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")


@pytest.mark.parametrize("setting", ["node_state_dir", "node_token_file", "registry_auth_file"])
def test_start_up_refuses_a_root_holding_the_nodes_own_files(tmp_path: Path, setting: str) -> None:
    from tuneplane_node.errors import ConfigError
    from tuneplane_node.settings import load_settings

    with pytest.raises(ConfigError) as refused:
        load_settings(node_token="t" * 16, storage_root=tmp_path, **{setting: tmp_path / "x"})
    (line,) = refused.value.message.splitlines()
    assert f"a mount root): {tmp_path} is or holds {tmp_path}" in line, line
    assert f"TUNEPLANE_{setting.upper()}" in line, line


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("/srv/elsewhere", "/srv/elsewhere is not under an allowed mount root; {} would allow it"),
        ("/etc", "/etc is /etc, which a job may never mount; no setting allows it"),
        ("/etc/ssl", "/etc/ssl is in /etc, which a job may never mount; no setting allows it"),
        ("/", "/ is /, which a job may never mount; no setting allows it"),
        ("/var/lib", "/var/lib holds /var/lib/docker, which a job may never mount; no setting "),
    ],
)
def test_a_mount_outside_the_roots_is_refused_offering_the_setting_only_where_it_helps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, host: str, why: str
) -> None:
    assert refusal(policy(tmp_path), host).startswith(why.format("TUNEPLANE_ALLOWED_MOUNT_ROOTS"))
    assert [r.getMessage() for r in caplog.records] == [
        f"refused a mount of {host}: outside the mount roots"
    ]


def test_each_refusal_under_a_root_is_logged_with_the_path_and_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    own = tmp_path / "own"
    own.mkdir()
    mounts = policy(tmp_path, (own, "token dir"))
    refusal(mounts, tmp_path / "nope")
    assert (
        refusal(mounts, own)
        == f"{own} is {own} (token dir), which a job may never mount; no setting allows it"
    )
    assert [r.getMessage() for r in caplog.records] == [
        f"refused a mount of {tmp_path / 'nope'}:  does not exist on the node",
        f"refused a mount of {own}: it is {own} (token dir)",
    ]


def test_the_walk_never_climbs_and_starts_from_a_directory(tmp_path: Path) -> None:
    """``..`` or ``.`` given to the walk itself (not only in a mount's path) is refused:
    ``..`` opened relative to the root is the root's parent."""
    for part in ("..", "."):
        with pytest.raises(Refused, match=f"^: '{part}' is not allowed in a mount$"):
            walk(tmp_path, (part,))
    (tmp_path / "file").touch()
    for root, why in ((tmp_path / "file", "Not a directory"), (tmp_path / "gone", "No such")):
        with pytest.raises(Refused) as refused:
            walk(root, ())
        assert refused.value.reason.startswith(f": its mount root {root} cannot be opened: {why}")


def test_vet_refuses_as_open_does_and_answers_the_paths_normalised(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    mounts = policy(tmp_path)
    given = Mount(f"{tmp_path}//a/./", "/x", True)
    assert mounts.vet([given]) == (Mount(str(tmp_path / "a"), "/x", True),)
    with pytest.raises(InvalidField):
        mounts.vet([Mount(str(tmp_path / "nope"), "/x")])


def test_a_root_holding_an_engines_directory_is_named_at_start(tmp_path: Path) -> None:
    mounts = policy(tmp_path)
    inside = tmp_path / "docker"
    assert mounts.root_holding(["/var/lib/docker"], engine="docker") is None
    assert mounts.root_holding(["/var/lib/docker", str(inside)], engine="docker") == (
        f"TUNEPLANE_ALLOWED_MOUNT_ROOTS: {tmp_path} is or holds {inside} (the docker engine's "
        "own directory), which a job may never mount; keep it out of the mount roots"
    )
