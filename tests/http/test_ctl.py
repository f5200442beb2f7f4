"""`tuneplane-node ctl` against real daemons (`serve` in a process of its own): what an
operator sees, its exit codes, its token and TLS options.

``ctl`` itself runs in this process (it is a client: no engine, no loop), except in the
pseudo-terminal test, where rich must see a terminal. Daemons that need no engine (the
process runtime, or docker at an address where none answers) serve the fast tests; the
walk of a job and the pull run on the shared Docker engine and remove what they made."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ctlcommand import Ctl, Node, StartNode, api, wait_for_port
from tests.support.console import TOKEN
from tests.support.daemons import free_port, interruptible, python_path, spawn_daemon
from tests.support.images import IMAGE
from tests.support.jobs import unique
from tests.unit.test_fetch_registry import serving
from tests.volumeserver import LOOPBACK
from tuneplane_node.cli import main, parser
from tuneplane_node.client import NO_RETRY, NodeClient, Unreachable
from tuneplane_node.ctl import commands, options
from tuneplane_node.wire.container import CONTAINER, CONTAINER_FIELDS
from tuneplane_node.wire.fields import Body
from tuneplane_node.wire.requests import LAUNCH_FIELDS, parse_launch
from tuneplane_node.wire.values import Mount

# Slow: the ctl command end to end against a node over a real socket.
pytestmark = pytest.mark.slow
ENGINE_DOWN = "unix:///nonexistent/engine.sock"


@pytest.fixture
def process_node(start_node: StartNode) -> Node:
    """A node whose jobs would be bare processes: no engine needed."""
    return start_node(TUNEPLANE_LOCAL_RUNTIME="process", TUNEPLANE_LOCAL_GPU_COUNT="2")


@pytest.fixture(scope="module")
def engine_down_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node whose docker engine does not answer: it answers 503 for the job verbs. One
    for the module: no test changes it (a refusal, a 503, health and tokens only read)."""
    tmp_path = tmp_path_factory.mktemp("engine-down")
    port = free_port()
    settings = {"TUNEPLANE_LOCAL_RUNTIME": "docker", "TUNEPLANE_DOCKER_HOST": ENGINE_DOWN}
    node = Node(f"http://127.0.0.1:{port}", spawn_daemon(tmp_path, port, settings_of=settings))
    try:
        wait_for_port(node, port, tmp_path / "serve.log")
        yield node
    finally:
        node.process.kill()
        node.process.wait(timeout=10)


# --- usage, without a node ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("frobnicate",),
        ("launch", "--image", IMAGE),  # no --run-id
        ("launch", "--run-id", "r", "--image", IMAGE, "--env", "NOVALUE"),
        ("launch", "--run-id", "r", "--image", IMAGE, "--mount", "/data"),
        ("cordon",),  # no --reason
        ("stop", "x", "--timeout", "soon"),
    ],
)
def test_a_usage_error_exits_2(ctl: Ctl, args: tuple[str, ...]) -> None:
    code, _, err = ctl(*args)
    assert code == 2
    assert "usage:" in err


def test_no_token_exits_2_saying_where_one_comes_from(ctl: Ctl) -> None:
    code, _, err = ctl("health", token=None)
    assert (code, err) == (2, "tuneplane-node ctl: no token: give --token-file or set "
                              "TUNEPLANE_NODE_TOKEN\n")  # fmt: skip


def test_a_token_file_without_a_token_exits_2(ctl: Ctl, tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("# none yet\n\n")
    code, _, err = ctl("health", "--token-file", str(tmp_path / "empty"))
    assert code == 2 and "holds no token" in err
    code, _, err = ctl("health", "--token-file", str(tmp_path / "missing"))
    assert code == 2 and f"--token-file {tmp_path / 'missing'}: cannot read it" in err


def test_an_unreachable_node_exits_3(ctl: Ctl) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, _, err = ctl("health", url=url)
    assert code == 3
    assert err == f"tuneplane-node ctl: cannot reach the node at {url}: Connection refused\n"


def test_a_run_id_that_makes_no_name_needs_name(ctl: Ctl) -> None:
    code, _, err = ctl("launch", "--run-id", "run 1/2", "--image", IMAGE)
    assert code == 2 and "give --name" in err


def test_the_launch_body_is_a_whole_0315_launch_the_node_parses() -> None:
    args = parser().parse_args(
        ["ctl", "launch", "--run-id", "r-1", "--image", "registry/trainer:1", "--gpus", "2",
         "--env", "EPOCHS=3", "--env", "EMPTY=", "--mount", "/data/r-1:/work:ro",
         "--label", "tuneplane.user=alice", "--shm-size", "16g",
         "--", "python", "-m", "train", "--lr", "0.1"]
    )  # fmt: skip
    body = commands.launch_body(args, name=commands.default_name(args.run_id))
    assert tuple(body) == LAUNCH_FIELDS
    assert tuple(body["container"]) == CONTAINER_FIELDS  # every field, "" for the empty ones
    assert body["container"]["workdir"] == "" and body["container"]["user"] == ""
    request = parse_launch(body)
    assert request.requested_gpus == 2
    assert request.container.name == "tuneplane-r-1"
    assert request.container.command == ("python", "-m", "train", "--lr", "0.1")
    assert request.container.env == {"EPOCHS": "3", "EMPTY": ""}
    assert request.container.mounts == (Mount("/data/r-1", "/work", True),)
    assert request.container.labels["tuneplane.user"] == "alice"
    assert request.container.shm_size == "16g"


TEXT_FIELDS = [
    f.name
    for f in CONTAINER.fields
    if f.name not in {"name", "image", "command", "env", "gpus", "mounts", "labels"}
    and not isinstance(f.schema, Body)
    and not options._is_boolean(f)  # --x / --no-x, tested by rdma's test
    and f.name != "registry_auth"  # an object, and a secret: no command line's
    and f.name != "scratch"  # an object: no option of its own
]


def test_a_boolean_field_is_a_flag_and_its_absence_the_nodes_rule() -> None:
    def body(*flags: str) -> Any:
        args = parser().parse_args(["ctl", "launch", "--run-id", "r", "--image", "i", *flags])
        return commands.launch_body(args, name="n")["container"]["rdma"]

    assert (body("--rdma"), body("--no-rdma"), body()) == (True, False, "")
    assert parse_launch({**commands.launch_body(
        parser().parse_args(["ctl", "launch", "--run-id", "r", "--image", "i", "--no-rdma"]),
        name="n")}).container.rdma is False  # fmt: skip


def test_credentials_are_no_option_of_launch_and_are_sent_empty() -> None:
    """A password on a command line is in every `ps` of the machine."""
    with pytest.raises(SystemExit):
        parser().parse_args(["ctl", "launch", "--run-id", "r", "--image", "i", "--registry-auth"])
    args = parser().parse_args(["ctl", "launch", "--run-id", "r", "--image", "i"])
    assert commands.launch_body(args, name="n")["container"]["registry_auth"] == ""


@pytest.mark.parametrize("field", TEXT_FIELDS)
def test_every_text_field_of_the_container_is_an_option_of_launch(field: str) -> None:
    """A field added to the contract reaches ctl with no edit of ctl: the option is the
    field's name and what it is given goes into the body as the console would send it."""
    option = "--" + field.replace("_", "-")
    args = parser().parse_args(["ctl", "launch", "--run-id", "r", "--image", "i", option, "x"])
    assert commands.launch_body(args, name="n")["container"][field] == "x"
    assert len(TEXT_FIELDS) >= 6  # workdir, shm_size, cpu and memory limits, network, user


# --- errors as a node gives them ----------------------------------------------------------


@pytest.mark.slow  # a daemon process of its own
def test_a_refusal_exits_1_with_the_nodes_detail(ctl: Ctl, engine_down_node: Node) -> None:
    code, _, err = ctl("stop", "", url=engine_down_node.url)
    assert code == 1
    assert err == "tuneplane-node ctl: the node refused (422): ref: required, a non-empty string\n"
    code, _, err = ctl("reap", "--max-age", "-1", url=engine_down_node.url)
    assert code == 1 and "(422): max_age_s: must be from 0" in err


@pytest.mark.slow  # a daemon process of its own
def test_a_wrong_token_exits_1(ctl: Ctl, engine_down_node: Node) -> None:
    code, _, err = ctl("health", token="not-the-token", url=engine_down_node.url)
    assert code == 1
    assert "(401): invalid node token" in err
    assert "not-the-token" not in err


@pytest.mark.slow  # a daemon process of its own
def test_json_failures_are_the_nodes_own_error_answers(ctl: Ctl, engine_down_node: Node) -> None:
    """Issue 36, finding 7: ``--json`` printed a sentence on a refusal."""
    url = engine_down_node.url
    code, out, err = ctl("--json", "reap", "--max-age", "-1", url=url)
    refused = json.loads(err)
    assert (code, out, refused["code"]) == (1, "", "invalid_field")
    assert refused["errors"][0]["field"] == "max_age_s" and "must be from 0" in refused["detail"]
    code, _, err = ctl("--json", "observe", "tuneplane-x", url=url)
    assert code == 3 and json.loads(err)["code"] == "engine_unavailable"
    code, _, err = ctl("--json", "health", token=None, url=url)
    assert (code, json.loads(err)["code"]) == (2, "usage")


@pytest.mark.slow  # a daemon process of its own
def test_tables_in_a_pipe_are_as_wide_as_their_rows(
    ctl: Ctl, process_node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 36, finding 7: piped tables cut names at 80 columns."""
    monkeypatch.delenv("COLUMNS")
    ref = "tuneplane-" + "x" * 110
    code, out, _ = ctl("observe", ref, url=process_node.url)
    assert code == 0 and ref in out, out


@pytest.mark.slow  # a daemon process of its own
def test_a_5xx_exits_3_with_the_nodes_detail(ctl: Ctl, engine_down_node: Node) -> None:
    code, _, err = ctl("observe", "tuneplane-x", url=engine_down_node.url)
    assert code == 3
    assert f"the node at {engine_down_node.url} failed (503): engine unreachable" in err


@pytest.mark.slow  # a daemon process of its own
def test_health_of_a_node_without_its_engine_says_not_ok(ctl: Ctl, engine_down_node: Node) -> None:
    """Issue 36, finding 7: health exited 0 when ok was false."""
    code, out, _ = ctl("health", url=engine_down_node.url)
    assert code == 4  # the node answered, not ok; what it said is on the screen
    assert "NOT OK" in out and "engine unreachable" in out
    assert ctl("health", "--json", url=engine_down_node.url)[0] == 4
    assert "unknown total" in out  # the cards are unknown, not zero


@pytest.mark.slow  # a daemon process of its own
def test_the_token_comes_from_a_file_before_the_environment(
    ctl: Ctl, engine_down_node: Node, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(f"# the console's token\n\n  {TOKEN}  \nnext-token\n")
    file = ("--token-file", str(tmp_path / "token"))
    # 4: the node answered (and is not ok), so the token was taken
    assert ctl("health", *file, token="wrong", url=engine_down_node.url)[0] == 4
    assert ctl("health", *file, token=None, url=engine_down_node.url)[0] == 4
    assert ctl("health", token=TOKEN, url=engine_down_node.url)[0] == 4  # the environment


@pytest.mark.slow  # a daemon process of its own
def test_a_node_without_cards_is_a_ready_cpu_node(ctl: Ctl, start_node: StartNode) -> None:
    """The README's daemon (``TUNEPLANE_LOCAL_GPU_COUNT=0``): health ok, ctl health exits
    0 saying it has no cards (issue 52, part 8: it read as broken, exit 5)."""
    node = start_node(TUNEPLANE_LOCAL_RUNTIME="process", TUNEPLANE_LOCAL_GPU_COUNT="0")
    code, out, err = ctl("health", url=node.url)
    assert code == 0, err
    assert re.search(r"card jobs +none: the node has no cards", out), out
    assert re.search(r"node +ready", out) and re.search(r"health +ok", out), out
    answer = json.loads(ctl("health", "--json", url=node.url)[1])
    assert (answer["ok"], answer["gpu_ready"], answer["gpus_total"]) == (True, None, 0)


def node_of_one_token(
    start_node: StartNode, tmp_path: Path, line: str
) -> tuple[Node, tuple[str, str]]:
    """A daemon on the process runtime whose token file holds ``line``; ctl's options
    for that file."""
    tokens = tmp_path / "one.token"
    tokens.write_text(line)
    node = start_node(
        TUNEPLANE_LOCAL_RUNTIME="process",
        TUNEPLANE_LOCAL_GPU_COUNT="2",
        TUNEPLANE_NODE_TOKEN_FILE=str(tokens),
    )
    return node, ("--token-file", str(tokens))


@pytest.mark.slow  # a daemon process of its own
def test_an_observe_token_serves_the_read_verbs_and_is_refused_the_rest(
    ctl: Ctl, start_node: StartNode, tmp_path: Path
) -> None:
    """Issue 25, finding 2: the daemon's own token file, as it is, is ctl's token file."""
    line = "# the dashboard's\nobserver-0123456789abcdef name=grafana scope=observe\n"
    node, file = node_of_one_token(start_node, tmp_path, line)
    for verb in (("health",), ("inventory",), ("observe", "tuneplane-x"), ("stats",)):
        code, _, err = ctl(*verb, *file, token=None, url=node.url)
        assert code == 0, (verb, err)
    code, _, err = ctl("cordon", "--reason", "x", *file, token=None, url=node.url)
    assert code == 1
    assert err == (
        "tuneplane-node ctl: the node refused (403): this token's scope is observe: "
        "POST /node/v1/cordon needs a token of scope operate\n"
    )


@pytest.mark.slow  # a daemon process of its own
def test_an_operate_token_serves_the_operators_verbs_and_no_jobs(
    ctl: Ctl, start_node: StartNode, tmp_path: Path
) -> None:
    """Issue 36, finding 2: an operator's ctl could not list images, cordon or drain
    without the console's token, which launches too."""
    line = "operator-0123456789abcdef name=ops scope=operate\n"
    node, file = node_of_one_token(start_node, tmp_path, line)
    for verb in (
        ("images",),
        ("cordon", "--reason", "x"),
        ("drain", "--reason", "y"),
        ("uncordon",),
    ):
        code, _, err = ctl(*verb, *file, token=None, url=node.url)
        assert code == 0, (verb, err)
    code, _, err = ctl("stop", "tuneplane-x", *file, token=None, url=node.url)
    assert (code, err) == (
        1,
        "tuneplane-node ctl: the node refused (403): this token's scope is operate: "
        "POST /node/v1/stop needs a token of scope full\n",
    )


@pytest.mark.slow  # a daemon process of its own
def test_common_options_go_before_or_after_the_verb(ctl: Ctl, engine_down_node: Node) -> None:
    url = engine_down_node.url
    before = json.loads(ctl("--json", "--url", url, "health", url="http://127.0.0.1:1")[1])
    after = json.loads(ctl("health", "--url", url, "--json", url="http://127.0.0.1:1")[1])
    assert before["runtime"] == after["runtime"] == {"name": "docker", "version": None}


# --- TLS ----------------------------------------------------------------------------------


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    subprocess.run(["openssl", "req", "-x509", *ec, "-keyout", key, "-out", cert, "-days", "1",
                    "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)  # fmt: skip
    return cert, key


def https_node(start_node: StartNode, cert: Path, key: Path, **settings: str) -> Node:
    files = {"TUNEPLANE_TLS_CERT_FILE": str(cert), "TUNEPLANE_TLS_KEY_FILE": str(key)}
    ready = {"TUNEPLANE_LOCAL_RUNTIME": "process", "TUNEPLANE_LOCAL_GPU_COUNT": "2"}
    return start_node("https", **ready, **files, **settings)


def test_https_with_the_nodes_ca_and_without(
    ctl: Ctl, start_node: StartNode, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path, "node")
    node = https_node(start_node, cert, key)
    assert ctl("health", "--cacert", str(cert), url=node.url)[0] == 0
    code, _, err = ctl("health", url=node.url)
    assert code == 3 and "TLS: self-signed certificate" in err
    (tmp_path / "junk.pem").write_text("not a certificate")
    code, _, err = ctl("health", "--cacert", str(tmp_path / "junk.pem"), url=node.url)
    assert code == 2 and "cannot use the TLS files" in err
    code, _, err = ctl("health", "--cacert", str(cert), url=node.url.replace("https", "http"))
    assert code == 2 and "need an https:// URL" in err


def test_a_plain_http_call_to_a_tls_node_is_told_the_node_speaks_tls(
    ctl: Ctl, start_node: StartNode, tmp_path: Path
) -> None:
    """A TLS node closes a plain call without a word: ctl and the client said "Server
    disconnected without sending a response" (issue 52, part 9). They ask the port for a
    TLS handshake, and say so; a port that closes in plain words is still broken off."""
    cert, key = self_signed(tmp_path, "node")
    node = https_node(start_node, cert, key, TUNEPLANE_TLS_CLIENT_CA_FILE=str(cert))
    plain = node.url.replace("https://", "http://")
    code, _, err = ctl("health", url=plain)
    assert code == 3 and f"the node at {plain} speaks TLS: call {node.url}" in err, err
    with (
        NodeClient(plain, token=TOKEN, retry=NO_RETRY) as client,
        pytest.raises(Unreachable, match=f"speaks TLS: call {re.escape(node.url)} "),
    ):
        client.health()
    with serving(Closing) as address:  # reads a request, closes without a word
        code, _, err = ctl("health", url=f"http://{address}")
    assert code == 3 and "broke off: Server disconnected" in err and "TLS" not in err, err


class Closing(http.server.BaseHTTPRequestHandler):
    def handle(self) -> None:  # reads what came (unread, the close would be a reset)
        self.connection.recv(65536)


def test_mutual_tls_needs_the_client_certificate(
    ctl: Ctl, start_node: StartNode, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path, "node")
    client_cert, client_key = self_signed(tmp_path, "console")
    node = https_node(start_node, cert, key, TUNEPLANE_TLS_CLIENT_CA_FILE=str(client_cert))
    tls = ("--cacert", str(cert), "--cert", str(client_cert), "--key", str(client_key))
    assert ctl("health", *tls, url=node.url)[0] == 0
    code, _, err = ctl("health", "--cacert", str(cert), url=node.url)
    assert code == 1 and "a client certificate signed by the CA of" in err, err


# --- the image GC ---------------------------------------------------------------------------


def test_gc_prints_what_it_removed_and_health_the_image_store(ctl: Ctl, process_node: Node) -> None:
    """The process runtime has no images: nothing removed, every figure unknown."""
    url = process_node.url
    code, out, _ = ctl("gc", url=url)
    assert (code, out) == (
        0,
        "removed 0 image(s), 0 bytes freed\nimage store: unknown: figures unknown\n",
    )
    answer = json.loads(ctl("gc", "--json", url=url)[1])
    assert answer["removed"] == [] and answer["scope"] == "node"
    assert set(answer["image_store"].values()) == {None}
    health = ctl("health", url=url)[1]
    assert re.search(r"image store +unknown: figures unknown", health), health


def test_gc_shows_each_image_removed_and_the_pressure() -> None:
    from rich.console import Console

    from tuneplane_node.ctl import stores

    console = Console(width=200, record=True, color_system=None)
    store = {"path": "/var/lib/docker", "total_bytes": 100 * 10**9, "free_bytes": 10 * 10**9}
    removed = {
        "image": "r/a:1",
        "id": "sha256:" + "ab" * 32,
        "size_bytes": 10**7,
        "why": "disk 91%",
    }
    stores.show_image_gc(
        console,
        {
            "scope": "all",
            "removed": [removed],
            "freed_bytes": 10**7,
            "image_store": {**store, "used_ratio": 0.9, "pressure": True},
        },
    )
    text = console.export_text()
    assert "Images removed (all scope)" in text and "r/a:1" in text and "abababababab" in text
    assert "removed 1 image(s), 9.5 MiB freed" in text  # IEC units, as everywhere
    assert "/var/lib/docker: 9.3 GiB free of 93.1 GiB (90.0% used, PRESSURE)" in text


# --- volumes ------------------------------------------------------------------------------


@contextlib.contextmanager
def served(data: bytes) -> Iterator[str]:
    """``data`` served over plain HTTP on loopback (no Range: the node sends it all)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    with serving(Handler) as host:
        yield host


@pytest.mark.slow  # a daemon process of its own
def test_volume_pull_wait_fills_it_and_volumes_and_volume_gc_show_it(
    ctl: Ctl, start_node: StartNode
) -> None:
    import hashlib

    data = os.urandom(100_000)
    digest = hashlib.sha256(data).hexdigest()
    with served(data) as host:
        node = start_node(
            TUNEPLANE_LOCAL_RUNTIME="process",
            TUNEPLANE_VOLUME_INSECURE_HOSTS=json.dumps([host]),
            TUNEPLANE_VOLUME_ALLOWED_NETWORKS=json.dumps(LOOPBACK),
        )
        source = f"http://{host}/w?sig=s3cr3t"
        code, out, err = ctl("volume-pull", source, digest, "--wait", url=node.url)
        assert (code, out) == (0, f"{digest[:12]}: present (97.7 KiB)\n"), err
    code, out, _ = ctl("volumes", url=node.url)
    assert code == 0 and digest[:12] in out and "volume store:" in out, out
    assert "evicts at 85%, to 80%" in out, out
    code, out, _ = ctl("--json", "volumes", url=node.url)
    said, asked = json.loads(out), api(node, "/node/v1/volumes")
    for answer in (said, asked):  # the filesystem's free space moves between two reads
        assert answer["volume_store"].pop("free_bytes") > 0
    assert said == asked
    code, out, _ = ctl("volume-gc", url=node.url)
    assert code == 0 and out.startswith("evicted 0 volume(s), 0 bytes freed\n"), out
    code, _, err = ctl("volume-pull", source, "xyz", url=node.url)
    assert code == 1 and "sha256: must be 64 lower-case hex digits" in err, err


def test_volume_gc_and_volumes_show_each_entry() -> None:
    from rich.console import Console

    from tuneplane_node.ctl import stores

    console = Console(width=200, record=True, color_system=None)
    store = {
        "path": "/v", "total_bytes": 100 * 2**30, "free_bytes": 10 * 2**30,
        "used_bytes": 2**30, "high_percent": 85, "low_percent": 80,
    }  # fmt: skip
    evicted = {"sha256": "ab" * 32, "size_bytes": 2**30, "last_used_at": "2026-01-01T00:00:00Z"}
    stores.show_volume_gc(
        console, {"removed": [evicted], "freed_bytes": 2**30, "volume_store": store}
    )
    entry = {
        "sha256": "cd" * 32, "size_bytes": 2**20, "phase": "present", "last_used_at": None,
        "in_use_by": None, "pin_expires_at": "2999-01-01T00:00:00Z",
    }  # fmt: skip
    fill = {
        "sha256": "ef" * 32, "source": "https://h/w", "phase": "failed", "bytes_done": 0,
        "bytes_total": None, "rate_bytes_per_s": None, "eta_s": None,
        "started_at": "2026-01-01T00:00:00Z", "waiting": 0, "error": "the server answered 404",
    }  # fmt: skip
    stores.show_volumes(console, {"entries": [entry], "fills": [fill], "volume_store": store})
    text = console.export_text()
    assert "Volumes evicted" in text and "abababababab" in text
    assert "evicted 1 volume(s), 1.0 GiB freed" in text
    assert "/v: 10.0 GiB free of 100.0 GiB, 1.0 GiB of entries (evicts at 85%, to 80%)" in text
    assert "cdcdcdcdcdcd" in text and "unknown" in text  # its users: the engine did not say
    assert "the server answered 404" in text


# --- cordon, drain ------------------------------------------------------------------------


def test_gpus_reset_breaker_says_how_the_breaker_stands(ctl: Ctl, process_node: Node) -> None:
    code, out, _ = ctl("gpus", "reset-breaker", url=process_node.url)
    assert (code, out) == (0, "gpu breaker closed: 0 of 4 card(s) taken out this hour, 0 kept in\n")
    code, _, err = ctl("gpus", "reset", url=process_node.url)
    assert code == 2 and "invalid choice: 'reset'" in err


def test_cordon_refuses_launches_until_uncordon(ctl: Ctl, process_node: Node) -> None:
    url = process_node.url
    code, out, _ = ctl("cordon", "--reason", "kernel upgrade", url=url)
    assert (code, out) == (0, "node cordoned: kernel upgrade (since 0s)\n")
    assert "cordoned: kernel upgrade" in ctl("health", url=url)[1]
    code, _, err = ctl("launch", "--run-id", unique("ctl"), "--image", IMAGE, url=url)
    assert code == 1
    assert "(409): the node is cordoned and takes no new launches: kernel upgrade" in err
    code, out, _ = ctl("uncordon", url=url)
    assert code == 0 and out.startswith("node ready")
    assert json.loads(ctl("health", "--json", url=url)[1])["node_state"]["state"] == "ready"


def test_drain_answers_the_node_state_and_health_shows_it(ctl: Ctl, process_node: Node) -> None:
    url = process_node.url
    code, out, _ = ctl("drain", "--reason", "retiring", "--grace", "1", "--json", url=url)
    assert code == 0
    state = json.loads(out)
    assert state["state"] in ("draining", "drained") and state["reason"] == "retiring"
    assert re.search(
        r"node +(draining|drained): retiring \(since \d+s\)", ctl("health", url=url)[1]
    )


def test_signal_and_a_warned_stop_reach_a_job(ctl: Ctl, process_node: Node, tmp_path: Path) -> None:
    """`ctl signal REF usr1` and `ctl stop REF --warn-signal USR1 --warn 10`, against a
    process job that notes the signal, then checkpoints and exits 0 on the second."""
    url, run_id = process_node.url, unique("ctl")
    marker, trapped = tmp_path / "signals", tmp_path / "trapped"
    script = f"n=0; trap 'n=$((n+1)); echo usr1 >> {marker}; [ $n -ge 2 ] && exit 0' USR1; "
    script += f"touch {trapped}; while true; do sleep 0.1; done"
    code, _, err = ctl("launch", "--run-id", run_id, "--image", "none", "--stop-signal",
                       "SIGUSR2", "--", "/bin/sh", "-c", script, url=url)  # fmt: skip
    assert code == 0, err
    ref = commands.default_name(run_id)
    deadline = time.monotonic() + 30
    made_by(trapped, deadline, "the job never set its trap")
    code, out, _ = ctl("signal", ref, "usr1", url=url)
    assert (code, out.strip()) == (0, f"sent SIGUSR1 to {ref}")
    # sh notes a caught signal as a flag until its trap runs: a second USR1 sent before
    # that is the same one (seen in CI), so the warning goes once the first was trapped.
    made_by(marker, deadline, "the job never ran its trap")
    assert ctl("signal", ref, "SIGKILL", url=url)[0] == 2  # a usage error: never sent
    code, _, _ = ctl("stop", ref, "--warn-signal", "USR1", "--warn", "10", url=url)
    assert code == 0
    state = json.loads(ctl("observe", ref, "--json", url=url)[1])["states"][ref]
    assert (state["exit_code"], state["stop_signal"]) == (0, "SIGUSR2")
    assert marker.read_text() == "usr1\nusr1\n"


def made_by(path: Path, deadline: float, never: str) -> None:
    """Once the job has made ``path``; ``never`` fails the test past the deadline."""
    while not path.exists():
        assert time.monotonic() < deadline, never
        time.sleep(0.02)


@pytest.mark.slow  # a daemon process of its own
def test_jobs_lists_every_job_and_watch_redraws_at_each_change(
    ctl: Ctl, process_node: Node
) -> None:
    """`ctl jobs` is the table of every job; `ctl jobs --watch --json` the list, then each
    answer of the blocking queries as a line: the job's exit comes as one."""
    url, run_id = process_node.url, unique("ctl")
    ref = commands.default_name(run_id)
    marker = Path(os.environ.get("TMPDIR", "/tmp")) / f"{run_id}.go"
    script = f"while [ ! -e {marker} ]; do sleep 0.05; done; exit 4"
    code, _, err = ctl("launch", "--run-id", run_id, "--image", "none", "--",
                       "/bin/sh", "-c", script, url=url)  # fmt: skip
    assert code == 0, err
    code, out, _ = ctl("jobs", url=url)
    assert code == 0 and re.search(rf"│ {ref} +│ running ", out), out
    env = {**os.environ, "PYTHONPATH": python_path(), "TUNEPLANE_NODE_TOKEN": TOKEN}
    argv = ["-X", "faulthandler", "-m", "tuneplane_node", "ctl", "--url", url, "jobs"]
    watch = subprocess.Popen(
        [sys.executable, *argv, "--watch", "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=interruptible,  # it is ended with Ctrl-C
    )
    try:
        assert watch.stdout is not None
        first = json.loads(watch.stdout.readline())
        assert first["jobs"][ref]["status"] == "running" and "full" not in first
        marker.touch()
        change = json.loads(watch.stdout.readline())
        assert change["full"] is False and change["removed"] == []
        assert (change["jobs"][ref]["status"], change["jobs"][ref]["exit_code"]) == ("exited", 4)
        assert change["index"] != first["index"]
    finally:
        watch.send_signal(signal.SIGINT)
        marker.unlink(missing_ok=True)
        assert exit_code_within(watch, 10) == 0


@pytest.mark.slow  # a daemon process of its own
def test_a_watch_interrupted_as_it_shows_the_first_listing_exits_0(
    ctl: Ctl, process_node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C once the watch began, even as its first line is written, is how a watch
    ends (0), not an interrupted command (130): found by interrupting it at random."""
    written = []

    def interrupted(_ctl: commands.Ctl, answer: Any) -> None:
        written.append(answer)
        raise KeyboardInterrupt

    monkeypatch.setattr(commands.Ctl, "line", interrupted)
    code, _, err = ctl("jobs", "--watch", "--json", url=process_node.url)
    assert (code, err, len(written)) == (0, "", 1) and written[0]["jobs"] == {}


def exit_code_within(process: subprocess.Popen[bytes], timeout: float) -> int | None:
    """Its exit code; past ``timeout``, an assertion holding its threads' stacks (it
    runs with faulthandler, which prints them on SIGABRT): a watch that once outlived
    its Ctrl-C in CI (3.10, lowest dependencies) said nothing of where it was."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        _, err = process.communicate(timeout=10)
        raise AssertionError(f"running {timeout} s after Ctrl-C:\n{err.decode()[-6000:]}") from None


def test_version_names_the_node_python_the_sdks_and_nvml(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 25, finding 6: what a bug report needs, as node agents print it."""
    with pytest.raises(SystemExit) as ended:
        main(["--version"])
    assert ended.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == [
        "tuneplane-node", "Python", "docker", "podman", "nvidia-ml-py"
    ]  # fmt: skip
    assert re.fullmatch(r"docker SDK \d+\.\d+.*", lines[2]) and "NVML " in lines[4]


# --- images and pull -----------------------------------------------------------------------


@pytest.mark.slow  # a daemon process of its own
def test_pull_of_a_present_image_says_so_and_images_lists_the_nodes(
    ctl: Ctl, process_node: Node
) -> None:
    code, out, _ = ctl("pull", "registry.test/trainer:1", "--wait", url=process_node.url)
    assert code == 0 and "registry.test/trainer:1: present" in out  # the process runtime's

    code, out, _ = ctl("images", url=process_node.url)
    assert code == 0 and "Images" in out
    code, out, _ = ctl("--json", "images", url=process_node.url)
    assert code == 0 and json.loads(out) == api(process_node, "/node/v1/images")


@pytest.mark.slow  # a daemon process of its own
def test_pull_exits_as_the_other_verbs(
    ctl: Ctl, process_node: Node, engine_down_node: Node
) -> None:
    code, _, err = ctl("pull", "UPPER/Case", url=process_node.url)
    assert code == 1 and "image: must be an image reference" in err  # the node's 422
    code, _, err = ctl("pull", "x:1", "--password-stdin", url=process_node.url)
    assert code == 2 and "--password-stdin needs --username" in err
    code, _, err = ctl("pull", "x:1", url=engine_down_node.url)
    assert code == 3 and "(503)" in err
    code, _, err = ctl("images", url=engine_down_node.url)
    assert code == 3 and "(503)" in err
