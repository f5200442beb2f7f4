"""An OCI volume's layers unpacked: whiteouts in layer order, and hostile tarballs refused
with nothing written outside the volume's directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.ocilayers import Item, file, tarball
from tuneplane_node.jobs.volumes.layers import MAX_DEPTH, Budget, HostileLayer, unpack


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that lost its directory descriptor would land in the working directory: in
    the test's own, never the run's (a mutation run's mutant once emptied mutmut's tree)."""
    monkeypatch.chdir(tmp_path)


def unpacked(tmp_path: Path, *layers: bytes, budget: Budget | None = None) -> Path:
    into = tmp_path / "tree"
    into.mkdir(parents=True)
    for i, layer in enumerate(layers):
        blob = tmp_path / f"layer{i}"
        blob.write_bytes(layer)
        unpack(blob, into, budget or Budget(entries=1000, bytes=2**20))
    return into


def listing(root: Path) -> dict[str, str]:
    """Every path under ``root``: a file's text, a link's target, a directory's "/"."""
    found: dict[str, str] = {}
    for top, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(top, name)
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = f"-> {os.readlink(path)}"
            elif path.is_dir():
                found[key] = "/"
            else:
                found[key] = path.read_text()
    return found


def test_layers_unpack_in_order_with_whiteouts_and_opaque_directories(tmp_path: Path) -> None:
    base = tarball(
        Item("models", kind="dir"),
        file("models/a.safetensors", "A"),
        file("models/b.safetensors", "B"),
        Item("data", kind="dir"),
        file("data/old.jsonl", "old"),
        file("data/keep.jsonl", "keep"),
        file("README", "v1"),
    )
    top = tarball(
        file("models/.wh.b.safetensors"),
        file("data/.wh..wh..opq"),
        file("data/new.jsonl", "new"),
        file("README", "v2"),
        Item("latest", kind="symlink", target="models/a.safetensors"),
        gzipped=False,
    )

    tree = unpacked(tmp_path, base, top)

    assert listing(tree) == {
        "models": "/",
        "data": "/",
        "models/a.safetensors": "A",
        "data/new.jsonl": "new",
        "README": "v2",
        "latest": "-> models/a.safetensors",
    }


def test_an_opaque_whiteout_keeps_what_its_own_layer_adds_before_it(tmp_path: Path) -> None:
    base = tarball(file("data/old", "old"))
    top = tarball(file("data/new", "new"), file("data/.wh..wh..opq"))

    assert listing(unpacked(tmp_path, base, top)) == {"data": "/", "data/new": "new"}


def test_setuid_and_group_write_bits_are_dropped_and_files_readable(tmp_path: Path) -> None:
    layer = tarball(Item("bin", kind="dir", mode=0o700), file("bin/tool", "#!", mode=0o6777),
                    file("key", mode=0))  # fmt: skip
    tree = unpacked(tmp_path, layer)

    assert (tree / "bin/tool").stat().st_mode & 0o7777 == 0o755
    assert (tree / "key").stat().st_mode & 0o7777 == 0o444
    assert (tree / "bin").stat().st_mode & 0o7777 == 0o755


def test_a_directory_entry_replaces_a_lower_layers_file_or_link(tmp_path: Path) -> None:
    base = tarball(file("data", "a file"), Item("lib", kind="symlink", target="/usr/lib"))
    top = tarball(Item("data", kind="dir"), file("data/x", "x"), Item("lib", kind="dir"))

    assert listing(unpacked(tmp_path, base, top)) == {"data": "/", "data/x": "x", "lib": "/"}


@pytest.mark.parametrize(
    ("items", "said"),
    [
        ((file("/etc/evil"),), "absolute path"),
        ((file("a/../../evil"),), "'..'"),
        ((file("../evil"),), "'..'"),
        ((Item("out", kind="symlink", target="/"), file("out/evil")), "through a link"),
        ((Item("out", kind="symlink", target="../.."), file("out/evil")), "through a link"),
        ((Item("sda", kind="char"),), "device node"),
        ((Item("pipe", kind="fifo"),), "FIFO"),
        ((Item("hard", kind="link", target="../outside"),), "'..'"),
        ((Item("hard", kind="link", target="/etc/passwd"),), "absolute path"),
        ((Item("s", kind="symlink", target="/etc/passwd"), Item("h", kind="link", target="s")),
         "no regular file"),
        ((file("f"), file("f/g")), "through a link or a file"),
    ],
)  # fmt: skip
def test_a_hostile_layer_is_refused_and_writes_nothing_outside(
    tmp_path: Path, items: tuple[Item, ...], said: str
) -> None:
    outside = tmp_path / "outside"
    outside.write_text("mine")

    with pytest.raises(HostileLayer, match=said):
        unpacked(tmp_path, tarball(*items))

    assert outside.read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layer0", "outside", "tree"]
    assert not Path("/etc/evil").exists()


def test_a_path_as_deep_as_the_bound_unpacks_and_one_deeper_is_refused(tmp_path: Path) -> None:
    """`MAX_DEPTH` components (each an open directory while the walk writes): one more is
    a hostile layer (issue 52: the bound moved fourfold and no test failed)."""
    deepest = "/".join(["d"] * (MAX_DEPTH - 1) + ["f"])
    tree = unpacked(tmp_path / "ok", tarball(file(deepest)))
    assert (tree / deepest).read_text() == "x"
    with pytest.raises(HostileLayer, match=f"a path deeper than {MAX_DEPTH} in a layer"):
        unpacked(tmp_path / "deeper", tarball(file("d/" + deepest)))


def test_a_whiteout_through_a_link_removes_nothing_outside(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("mine")
    base = tarball(Item("out", kind="symlink", target=str(victim)))

    with pytest.raises(HostileLayer, match="through a link"):
        unpacked(tmp_path, base, tarball(file("out/.wh.precious")))

    assert (victim / "precious").read_text() == "mine"


def test_zstd_layers_are_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(HostileLayer, match="zstd"):
        unpacked(tmp_path, b"\x28\xb5\x2f\xfd" + b"\0" * 64)


def test_a_layer_past_the_volumes_bytes_or_entries_is_refused(tmp_path: Path) -> None:
    bomb = tarball(file("zeros", b"\0" * 2**20))  # a MiB that gzip makes a kilobyte
    with pytest.raises(HostileLayer, match="more bytes"):
        unpacked(tmp_path, bomb, budget=Budget(entries=10, bytes=2**19))

    many = tarball(*(file(f"f{i}") for i in range(11)))
    with pytest.raises(HostileLayer, match="more entries"):
        unpacked(tmp_path / "again", many, budget=Budget(entries=10, bytes=2**20))


def test_a_truncated_layer_is_no_tar(tmp_path: Path) -> None:
    with pytest.raises(HostileLayer, match="not a readable tar"):
        unpacked(tmp_path, tarball(file("f", os.urandom(4096)))[:200])


def test_a_hard_link_names_a_file_the_tree_holds_and_replaces_a_lower_one(
    tmp_path: Path,
) -> None:
    base = tarball(
        Item("m", kind="dir"), Item("m/d", kind="dir"), file("m/d/w", "w"), file("m/x", "old")
    )
    top = tarball(Item("m/x", kind="link", target="m/d/w"), Item("y", kind="link", target="m/d/w"))
    tree = unpacked(tmp_path, base, top)
    assert listing(tree) == {"m": "/", "m/d": "/", "m/d/w": "w", "m/x": "w", "y": "w"}
    inode = (tree / "m/d/w").stat().st_ino
    assert (tree / "m/x").stat().st_ino == inode == (tree / "y").stat().st_ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layer0", "layer1", "tree"]


@pytest.mark.parametrize(
    ("items", "said"),
    [
        ((Item("h", kind="link", target="."),), "a hard link to the layer's root"),
        (
            (Item("d/e", kind="dir"), Item("h", kind="link", target="d/e")),
            "a hard link to no regular file: 'd/e'",
        ),
        ((Item("h", kind="link", target="d/none"),), "a hard link to nothing: 'd/none'"),
        (
            (Item("d/e", kind="dir"), Item("d/e/l", kind="symlink", target="/"), file("d/e/l/f/g")),
            "a path through a link or a file: 'd/e/l'",
        ),
    ],
)  # fmt: skip
def test_a_bad_link_or_path_is_refused_naming_it(
    tmp_path: Path, items: tuple[Item, ...], said: str
) -> None:
    with pytest.raises(HostileLayer) as refused:
        unpacked(tmp_path, tarball(*items))
    assert str(refused.value) == said


def test_a_layer_of_exactly_its_budget_unpacks_and_a_refusal_names_the_budget(
    tmp_path: Path,
) -> None:
    exact = tarball(file("a", b"12345"), file("b", b"678"))
    unpacked(tmp_path, exact, budget=Budget(entries=2, bytes=8))
    for n, (budget, said) in enumerate(
        (
            (Budget(entries=1, bytes=8), "more entries than its budget of 1"),
            (Budget(entries=2, bytes=7), "more bytes than its budget of 7"),
        )
    ):
        with pytest.raises(HostileLayer) as refused:
            unpacked(tmp_path / str(n), exact, budget=budget)
        assert str(refused.value).endswith(f"{said} (taken from its manifest's size)")


def test_every_directory_is_0755_whatever_the_layer_says(tmp_path: Path) -> None:
    tree = unpacked(tmp_path, tarball(Item("p", kind="dir", mode=0o700), file("p/q/f")))
    assert [(tree / d).stat().st_mode & 0o7777 for d in ("p", "p/q")] == [0o755, 0o755]


def test_whiteouts_deep_in_the_tree_remove_whole_directories_of_the_layers_below(
    tmp_path: Path,
) -> None:
    base = tarball(
        file("a/b/c/deep/f"), file("a/b/c/g"), file("a/b/keep"), file("a/b/o/x"), file("a/top")
    )
    top = tarball(file("a/b/.wh.c"), file("a/b/o/.wh..wh..opq"), file("a/b/o/new", "n"))
    tree = unpacked(tmp_path, base, top)
    assert listing(tree) == {
        "a": "/", "a/b": "/", "a/b/keep": "x", "a/b/o": "/", "a/b/o/new": "n", "a/top": "x"
    }  # fmt: skip


def test_a_directory_entry_over_a_lower_directory_keeps_its_files_and_opens_it_to_all(
    tmp_path: Path,
) -> None:
    base = tarball(file("d/f", "kept"))
    top = tarball(Item("d", kind="dir", mode=0o700))
    into = tmp_path / "tree"
    (into / "d").mkdir(parents=True)
    (into / "d").chmod(0o700)
    for i, layer in enumerate((base, top)):
        (tmp_path / f"l{i}").write_bytes(layer)
        unpack(tmp_path / f"l{i}", into, Budget(entries=10, bytes=100))
    assert listing(into) == {"d": "/", "d/f": "kept"}
    assert (into / "d").stat().st_mode & 0o7777 == 0o755
