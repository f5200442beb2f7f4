"""The wire's answers: what a console written for 0.3.15 reads is exact.

The shapes below are protocol 1 as 0.3.15 consoles parse it, field by field. A change
to any of them is a change of protocol, not a refactoring.
"""

from __future__ import annotations

import json
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import pytest

from tests.support.console import INVENTORY_KEYS
from tuneplane_node.daemon.machine import (
    HealthAnswers,
    health_json,
    inventory_json,
)
from tuneplane_node.daemon.render import (
    EncodedStates,
    JobAnswers,
    ObserveAnswers,
    encode,
    jobs_json,
    launch_json,
    observe_json,
    state_json,
)
from tuneplane_node.fabrics import FabricFacts
from tuneplane_node.gpu.probe import CardFacts, GpuProcess, GpuSnapshot, Occupancy
from tuneplane_node.inventory import (
    DiskReading,
    Filesystem,
    LocalDisk,
    MachineFacts,
    Space,
)
from tuneplane_node.jobs import (
    AlreadyPending,
    AlreadyRunning,
    Inventory,
    NodeStatus,
    PendingView,
    Pulling,
    Started,
    StoppedView,
    Stopping,
)
from tuneplane_node.jobs.observe.views import Observed
from tuneplane_node.jobs.words import Conditions, ImageStore, JobChanges, NodeState
from tuneplane_node.runtime.base import CacheStatus, ContainerState, PullProgress
from tuneplane_node.runtime.facts import RuntimeHealth
from tuneplane_node.wire.values import LABEL_NETWORK, LABEL_RUN_ID, LABEL_USERNS, Cursor

# --- what 0.3.15 consoles read --------------------------------------------------------------

STATE_KEYS = [
    "name",
    "exists",
    "status",
    "exit_code",
    "labels",
    "created_at",
    "started_at",
    "finished_at",
    "oom_killed",
    "stop_signal",  # after 0.3.15's keys: new ones
    "read_only_root",
    "network",
    "userns",
    "userns_note",
    "runtime",
]
PENDING_KEYS = [
    "pending_phase",
    "pending_image",
    "pending_elapsed_s",
    "pending_gpus",
    "pending_bytes_done",
    "pending_bytes_total",
    "pending_layers_done",
    "pending_layers_total",
    "pending_error",
    "pending_rate_bytes_per_s",  # new in issue 20: a 0.3.15 console reads the others
    "pending_eta_s",
]


def test_launch_answers() -> None:
    """Every form names the ref it made: the console need not recompute a hashed name."""
    assert launch_json(Started("fd8a9cc848e0", (0, 1)), ref="tuneplane-r-1") == {
        "phase": "running",
        "container_id": "fd8a9cc848e0",
        "gpus": [0, 1],
        "ref": "tuneplane-r-1",
    }
    assert launch_json(AlreadyRunning((2,)), ref="job-a") == {
        "phase": "running",
        "idempotent": True,
        "gpus": [2],
        "ref": "job-a",
    }
    assert launch_json(Pulling("reg/big:1", 2), ref="job-b") == {
        "phase": "pulling",
        "image": "reg/big:1",
        "requested_gpus": 2,
        "ref": "job-b",
    }
    assert launch_json(AlreadyPending("starting", "reg/big:1"), ref="job-c") == {
        "phase": "starting",
        "idempotent": True,
        "image": "reg/big:1",
        "ref": "job-c",
    }


def test_a_container_state() -> None:
    state = ContainerState(
        name="tuneplane-a",
        exists=True,
        status="exited",
        exit_code=137,
        labels=MappingProxyType(
            {
                "tuneplane.gpus": "0",
                LABEL_RUN_ID: "a",
                LABEL_NETWORK: "bridge",
                LABEL_USERNS: "host: a job with cards",
            }
        ),
        created_at="2026-11-29T21:21:54.164779Z",
        started_at="2026-11-29T21:21:54.33328Z",
        finished_at="2026-11-29T21:22:04.305352Z",
        oom_killed=True,
        id="f" * 64,
        stop_signal="SIGINT",
        read_only_root=True,
        engine_runtime="runsc",
    )
    assert state_json(state) == {
        "name": "tuneplane-a",
        "exists": True,
        "status": "exited",
        "exit_code": 137,
        "labels": {"tuneplane.gpus": "0", LABEL_RUN_ID: "a", LABEL_NETWORK: "bridge"},
        "created_at": "2026-11-29T21:21:54.164779Z",
        "started_at": "2026-11-29T21:21:54.33328Z",
        "finished_at": "2026-11-29T21:22:04.305352Z",
        "oom_killed": True,
        "stop_signal": "SIGINT",
        "read_only_root": True,
        "network": "bridge",  # what it got, its label's
        "userns": "host",  # the label's own word, hidden from labels
        "userns_note": "a job with cards",
        "runtime": "runsc",
    }


def test_a_missing_container_is_exists_false_with_nulls() -> None:
    assert state_json(ContainerState.missing("tuneplane-x")) == {
        "name": "tuneplane-x",
        "exists": False,
        "status": None,
        "exit_code": None,
        "labels": {},
        "created_at": None,
        "started_at": None,
        "finished_at": None,
        "oom_killed": False,
        "stop_signal": None,
        "read_only_root": None,  # unknown, not false
        "network": None,
        "userns": None,
        "userns_note": None,
        "runtime": None,
    }


def pending(phase: str = "pulling", error: str | None = None) -> PendingView:
    return PendingView(
        ref="tuneplane-b",
        labels={LABEL_RUN_ID: "b"},
        phase=phase,
        image="reg/big:1",
        elapsed_s=0.147,
        requested_gpus=1,
        progress=PullProgress(9460405, 9460405, 1, 1),
        error=error,
    )


def test_a_pending_launch_reads_as_a_created_container_with_its_pull() -> None:
    answer = state_json(pending())
    assert list(answer) == STATE_KEYS + PENDING_KEYS
    assert answer == {
        "name": "tuneplane-b",
        "exists": True,
        "status": "created",
        "exit_code": None,
        "labels": {LABEL_RUN_ID: "b"},
        "created_at": None,
        "started_at": None,
        "finished_at": None,
        "oom_killed": False,
        "stop_signal": None,  # the image's: known once it runs
        "read_only_root": None,
        "network": None,  # decided when its container is made
        "userns": None,
        "userns_note": None,
        "runtime": None,
        "pending_phase": "pulling",
        "pending_image": "reg/big:1",
        "pending_elapsed_s": 0.147,
        "pending_gpus": 1,
        "pending_bytes_done": 9460405,
        "pending_bytes_total": 9460405,
        "pending_layers_done": 1,
        "pending_layers_total": 1,
        "pending_error": None,
        "pending_rate_bytes_per_s": None,  # unknown: null, never 0
        "pending_eta_s": None,
    }


def test_a_failed_pending_launch_reads_dead_with_the_reason() -> None:
    answer = state_json(pending("failed", "manifest unknown"))
    assert (answer["status"], answer["pending_error"]) == ("dead", "manifest unknown")  # type: ignore[typeddict-item]


def test_observe_answers_by_ref() -> None:
    answer = observe_json({"tuneplane-b": pending(), "x": ContainerState.missing("x")})
    assert list(answer) == ["states"]
    assert list(answer["states"]) == ["tuneplane-b", "x"]
    assert list(answer["states"]["x"]) == STATE_KEYS


def test_a_stop_under_way_shows_its_phase_and_a_drained_job_its_reason() -> None:
    state = ContainerState(name="tuneplane-c", exists=True, status="running", id="c" * 64)
    warned = state_json(StoppedView(state, None, Stopping("warned", "2026-12-01T12:00:00Z")))
    assert warned["stopping"] == {"phase": "warned", "since": "2026-12-01T12:00:00Z"}  # type: ignore[typeddict-item]
    assert "stop_reason" not in warned
    drained = state_json(StoppedView(state, "drain: kernel"))
    assert drained["stop_reason"] == "drain: kernel" and "stopping" not in drained  # type: ignore[typeddict-item]
    assert list(drained)[: len(STATE_KEYS)] == STATE_KEYS


# --- health -------------------------------------------------------------------------------

HEALTH_KEYS = [
    "ok",
    "protocol",
    "runtime",
    "series",
    "disk",
    "pending_pulls",
    "gpus_total",
    "gpus_free",
    "gpus_reserved",
    "free_gpus",
    "external",
    "external_pids",
    "external_probe_ok",
    "unhealthy",
    "by_job",
    "gpu_detail",
    "explain",
    "gpu_probe",
    "draining",  # issue 53
    "gpu_breaker",
    "node_state",  # added after every field of 0.3.15
    "gpu_ready",  # issue 25
    "gpu_not_ready_reason",
    "image_store",  # issue 21
    "conditions",  # issue 34
    "job_disk",
    "protocols",
    "features",
    "volume_store",  # issue 39
    "notices",  # issue 54
    "launch_refused_reason",  # issue 50
]
CARD_KEYS = [
    "index",
    "uuid",
    "name",
    "pci_bus_id",
    "memory_total_mib",
    "memory_used_mib",
    "temperature_c",
    "unhealthy",
    "processes",
    "numa_node",
    "fault",  # issue 53
    "state",
]
GIB = 2**30


def snapshot() -> GpuSnapshot:
    cards = (
        CardFacts(0, uuid="GPU-0", name="NVIDIA H100", memory_total_mib=81559),
        CardFacts(1, name="NVIDIA H100"),
        CardFacts(2, name="NVIDIA H100", unhealthy="uncorrectable ECC errors: 2"),
        CardFacts(3, name="NVIDIA H100", processes=(GpuProcess(999999, 500),)),
    )
    return GpuSnapshot("simulation", True, None, "580.159.03", "13.0", cards, True, {})


def occupancy() -> Occupancy:
    return Occupancy(
        total=4,
        known=True,
        free=(1,),
        by_job={0: "run-a"},
        external={3: (999999,)},
        external_probe_ok=True,
        unhealthy={2: "uncorrectable ECC errors: 2"},
        claims={"tuneplane-b": (1,)},
        gpus=snapshot(),
    )


def node_status(**fields: Any) -> NodeStatus:
    base: dict[str, Any] = {
        "engine": RuntimeHealth(ok=True, engine="docker", version="20.10.24+dfsg1"),
        "series": "h100",
        "disk": DiskReading(
            "/srv/storage", Space(total=100 * GIB, free=40 * GIB, available=30 * GIB)
        ),
        "pending": {"tuneplane-b": pending()},
        "cache": CacheStatus(True, 0.06, 0.784, 3),
        "occupancy": occupancy(),
        "error": None,
        "node": NodeState(),
    }
    return NodeStatus(**{**base, **fields})


@pytest.mark.parametrize("pressure", ["disk_pressure", "inode_pressure"])
def test_health_is_not_ok_while_a_pressure_refuses_every_launch(pressure: str) -> None:
    """Issue 50: 0.3.15's ``ok`` and ``error`` say it, a new field names the condition."""
    pressed = health_json(node_status(conditions=Conditions(**{pressure: True})))
    assert pressed["ok"] is False and pressed["launch_refused_reason"] == pressure
    assert pressure in pressed["error"] and "507" in pressed["error"]
    calm = health_json(node_status(conditions=Conditions(disk_pressure=False)))
    assert calm["ok"] is True and calm["launch_refused_reason"] is None and "error" not in calm


def test_health_has_0315s_fields_and_says_where_every_card_is() -> None:
    answer = health_json(node_status())

    assert sorted(answer) == sorted([*HEALTH_KEYS, "state_cache"])
    assert list(answer)[:7] == [*HEALTH_KEYS[:6], "state_cache"]
    assert answer["runtime"] == {"name": "docker", "version": "20.10.24+dfsg1"}
    assert answer["disk"] == {"path": "/srv/storage", "used_pct": 60.0, "free_gib": 30.0}
    assert answer["pending_pulls"] == {
        "tuneplane-b": {"image": "reg/big:1", "phase": "pulling", "error": None}
    }
    assert answer["state_cache"] == {
        "synced": True,
        "last_event_age_s": 0.06,
        "last_relist_age_s": 0.784,
        "containers": 3,
    }
    assert (answer["gpus_total"], answer["gpus_free"], answer["gpus_reserved"]) == (4, 0, 1)
    assert answer["free_gpus"] == [1]
    assert answer["external"] == [3]  # 0.3.15: the sorted card indices
    assert answer["external_pids"] == {"3": [999999]}
    assert answer["unhealthy"] == {"2": "uncorrectable ECC errors: 2"}
    assert answer["by_job"] == {"0": "run-a"}
    assert answer["gpu_probe"] == {"source": "simulation", "ok": True, "error": None}
    detail = answer["gpu_detail"]
    assert detail is not None and [list(card) for card in detail] == [CARD_KEYS] * 4
    assert [card["state"] for card in detail] == [
        "held by run run-a",
        "free",
        "unhealthy: uncorrectable ECC errors: 2",
        "external pid 999999",
    ]
    assert detail[3]["processes"] == [{"pid": 999999, "used_mib": 500}]
    assert answer["explain"] == [
        "gpu 0: held by run run-a",
        "gpu 1: free",
        "gpu 2: unhealthy: uncorrectable ECC errors: 2",
        "gpu 3: external pid 999999",
        "1 free card(s) reserved for pending launches",
    ]
    json.dumps(answer)


def test_health_with_the_engine_down_says_why_and_knows_no_card() -> None:
    status = node_status(
        engine=RuntimeHealth(ok=False, engine="docker", error="engine unreachable: docker: gone"),
        occupancy=None,
        error="engine unreachable: docker: gone",
        cache=CacheStatus(False, None, None, 0),
    )
    answer = health_json(status)

    assert answer["ok"] is False
    assert answer["error"] == "engine unreachable: docker: gone"
    assert list(answer)[:8] == [*HEALTH_KEYS[:6], "state_cache", "error"]
    assert all(answer[key] is None for key in HEALTH_KEYS[6:-11])  # type: ignore[literal-required]
    assert set(answer["image_store"].values()) == {None}  # unknown, never 0
    assert set(answer["conditions"].values()) == {None}  # unknown, never false


def test_health_of_the_process_runtime_has_no_state_cache() -> None:
    answer = health_json(node_status(cache=None, disk=None, series=None))
    assert "state_cache" not in answer and "error" not in answer
    assert (answer["disk"], answer["series"]) == (None, None)


def test_an_unknown_card_count_is_null_not_zero() -> None:
    unknown = Occupancy(0, False, (), {}, {}, False, {}, gpus=GpuSnapshot.failed("none", "no NVML"))
    answer = health_json(node_status(occupancy=unknown))
    assert answer["gpus_total"] is None
    assert answer["gpu_probe"] == {"source": "none", "ok": False, "error": "no NVML"}
    assert answer["external_probe_ok"] is False and answer["external"] == []


# --- inventory ------------------------------------------------------------------------------


def machine() -> MachineFacts:
    return MachineFacts(
        series="h100-sxm",
        storage_root_visible=True,
        disk_free_bytes=123,
        cpu_count=2,
        memory_bytes=25276502016,
        node_id="cc1e01c3-22bc-4bb0-be7f-0149d677fe38",
        hostname="vm",
        agent_version="0.1.0",
        storage=(Filesystem(("/srv",), "ext4", False, 10, 100),),
        local_disk=LocalDisk(10, 100),
        fabrics=(FabricFacts("compute", ("mlx5_0",), 200.0),),
    )


def test_inventory_has_0315s_fields() -> None:
    answer = inventory_json(Inventory(machine(), snapshot(), 4, "docker://20.10.24", NodeState()))

    assert list(answer) == INVENTORY_KEYS
    assert answer["accelerator_name"] == "NVIDIA H100"
    assert (answer["accelerator_count"], answer["driver"], answer["cuda_version"]) == (
        4,
        "580.159.03",
        "13.0",
    )
    assert answer["storage"] == [
        {
            "paths": ["/srv"],
            "fs_type": "ext4",
            "shared": False,
            "free_bytes": 10,
            "total_bytes": 100,
        }
    ]
    assert answer["local_disk"] == {"free_bytes": 10, "total_bytes": 100}
    assert answer["fabrics"] == [
        {"fabric": "compute", "hcas": ["mlx5_0"], "rate_gbps": 200.0, "rdma_to_jobs": False}
    ]
    assert [list(card) for card in answer["gpus"]] == [CARD_KEYS[:-1]] * 4
    json.dumps(answer)


def test_inventory_without_a_gpu_source_is_unknown_not_zero() -> None:
    answer = inventory_json(Inventory(machine(), None, None, None, NodeState()))
    assert answer["accelerator_name"] is None and answer["accelerator_count"] is None
    assert answer["driver"] is None and answer["cuda_version"] is None
    assert answer["gpus"] == [] and answer["runtime"] is None


def test_the_most_common_card_name_names_the_machine() -> None:
    cards = tuple(CardFacts(i, name=n) for i, n in enumerate(["A100", "H100", "H100"]))
    gpus = GpuSnapshot("nvml", True, None, None, None, cards, True, {})
    assert (
        inventory_json(Inventory(machine(), gpus, 3, None, NodeState()))["accelerator_name"]
        == "H100"
    )


def test_the_encoder_writes_what_json_dumps_would_read_back_the_same() -> None:
    """orjson instead of json.dumps: not a key, value or order of any answer changes."""
    cards = tuple(CardFacts(i, name="H100", memory_used_mib=512) for i in range(4))
    samples = [
        health_json(node_status()),
        health_json(node_status(engine=RuntimeHealth(ok=False, engine="docker"))),
        inventory_json(Inventory(machine(), snapshot(), 4, "docker://1", NodeState())),
        observe_json({"tuneplane-b": pending(), "x": ContainerState.missing("x")}),
        {"logs": "é\u2028\x00 line\n" * 3, "gpus": [c.index for c in cards]},
    ]
    for answer in samples:
        text = encode(answer)
        assert json.loads(text) == json.loads(json.dumps(answer))
        assert list(json.loads(text)) == list(answer)  # the same order


def running(name: str, **more: Any) -> ContainerState:
    fields: dict[str, Any] = {"status": "running", "labels": {LABEL_RUN_ID: name}}
    return ContainerState(name=name, exists=True, id="c0ffee" + name, **fields | more)


def test_observe_is_encoded_as_its_shape_would_be_byte_for_byte() -> None:
    """The route sends `JobAnswers.observe`: the very bytes encode(observe_json) would."""
    views: dict[str, ContainerState | StoppedView | PendingView] = {
        "a": running("a", labels={LABEL_RUN_ID: "a", "note": "é\u2028\x00"}),
        "b": running("b", status="exited", exit_code=3, finished_at="2026-11-30T12:00:00Z"),
        "stopped": StoppedView(running("stopped", status="exited"), "drained: cordon"),
        "tuneplane-b": pending(),
        "x": ContainerState.missing("x"),
        'q"uote': running('q"uote'),
    }
    answers = JobAnswers()
    assert answers.observe(views) == encode(observe_json(views))
    assert answers.observe(views) == encode(observe_json(views))  # the second, from the memo
    assert answers.observe({}) == encode(observe_json({}))


def test_the_jobs_list_and_watch_are_encoded_as_their_shapes_would_be() -> None:
    views: dict[str, ContainerState | StoppedView | PendingView] = {
        "a": running("a", labels={LABEL_RUN_ID: "a", "note": "é\u2028\x00"}),
        "stopped": StoppedView(running("stopped", status="exited"), "drained: cordon"),
        "tuneplane-b": pending(),
    }
    listing, answers = JobChanges(Cursor("0123456789abcdef", 7), views), JobAnswers()
    assert answers.jobs(listing, watched=False) == encode(jobs_json(listing, watched=False))
    assert json.loads(answers.jobs(listing, watched=False)).keys() == {"index", "jobs"}
    delta = JobChanges(Cursor("0123456789abcdef", 9), views, ("gone",), full=False)
    assert answers.jobs(delta, watched=True) == encode(jobs_json(delta, watched=True))
    assert json.loads(answers.jobs(delta, watched=True))["removed"] == ["gone"]
    moved = JobChanges(Cursor("0123456789abcdef", 8), {})  # a new index: never the memo's
    assert json.loads(answers.jobs(moved, watched=False))["jobs"] == {}


def member(states: EncodedStates, ref: str, view: Any) -> Any:
    """The observe member ``"ref":{...}`` read back, as a console reads it."""
    return json.loads(b"{" + states.entry(ref, view) + b"}")[ref]


def test_a_changed_state_is_never_answered_from_the_memo() -> None:
    states = EncodedStates()
    first = running("a")
    assert member(states, "a", first)["status"] == "running"
    exited = replace(first, status="exited", exit_code=0)  # the cache's next object
    assert member(states, "a", exited)["status"] == "exited"
    assert member(states, "a", first)["status"] == "running"


def test_a_new_view_around_the_same_state_is_never_answered_from_the_memo() -> None:
    """The memo goes by the view: the same cached state with another stop reason, or
    asked by another ref, is encoded anew."""
    states = EncodedStates()
    state = running("a", status="exited")
    assert member(states, "a", state).get("stop_reason") is None
    drained = StoppedView(state, "drained: cordon")
    assert member(states, "a", drained)["stop_reason"] == "drained: cordon"
    assert member(states, "a", drained)["stop_reason"] == "drained: cordon"  # kept
    assert member(states, "a", state).get("stop_reason") is None
    assert member(states, "b", state)["name"] == "a"  # asked by another ref: its own member


def test_the_memo_of_encoded_states_stays_bounded() -> None:
    states = EncodedStates(limit=3)
    made = [running(f"j{i}") for i in range(10)]
    for state in made:
        assert member(states, state.name, state)["name"] == state.name
    assert len(states._memo) <= 3
    for _ in range(5):  # missing containers and pending launches are never kept
        member(states, "gone", ContainerState.missing("gone"))
        member(states, "tuneplane-b", pending())
    assert len(states._memo) <= 3


def at(generation: int = 1, told: int = 0, **facts: object) -> Observed:
    """What the answers were made of: the node state and the measures new objects
    unless given."""
    return Observed(generation, told, facts.get("node", object()), facts.get("measured", object()))


def test_a_kept_observe_answer_is_given_only_for_the_same_refs_at_the_same_state() -> None:
    kept, now = ObserveAnswers(), at()
    kept.keep(("a", "b"), now, b"ab")
    same = at(1, 0, node=now.node, measured=now.measured)
    assert kept.get(("a", "b"), same) == b"ab"
    assert kept.get(("b", "a"), same) is None  # another order is another answer
    assert kept.get(("a",), same) is None
    assert kept.get(("a", "b"), None) is None  # a state that cannot be kept (pending, 503)
    moved = {  # each part of the state, moved alone, is another state
        "the engine": at(2, 0, node=now.node, measured=now.measured),
        "a source": at(1, 1, node=now.node, measured=now.measured),
        "the node": at(1, 0, measured=now.measured),
        "the disk": at(1, 0, node=now.node),
    }
    for what, later in moved.items():
        assert kept.get(("a", "b"), later) is None, what
    kept.keep(("a",), moved["the disk"], b"a")  # a new state drops every older answer
    assert kept.get(("a", "b"), same) is None
    assert kept.get(("a", "b"), moved["the disk"]) is None
    assert kept.get(("a",), moved["the disk"]) == b"a"


def test_an_answer_made_from_a_state_that_passed_is_never_given() -> None:
    """The route reads the state before the views: a change meanwhile keeps the answer
    under the state that passed, which no later read matches."""
    kept, before = ObserveAnswers(), at(1)
    after = at(2, node=before.node, measured=before.measured)
    kept.keep(("a",), before, b"made after the change")
    assert kept.get(("a",), after) is None


def test_the_kept_observe_answers_stay_bounded_in_count_and_bytes() -> None:
    kept, now = ObserveAnswers(count=3, size=100), at()
    for i in range(10):
        kept.keep((f"j{i}",), now, b"x" * 10)
    assert len(kept._kept) == 3 and kept.get(("j9",), now) == b"x" * 10
    assert kept.get(("j0",), now) is None  # the oldest went
    kept.keep(("big",), now, b"y" * 90)  # past the bytes: the oldest go until it fits
    assert kept.get(("big",), now) == b"y" * 90 and kept._bytes <= 100
    kept.keep(("huge",), now, b"z" * 101)  # over the bound alone: never kept
    assert kept.get(("huge",), now) is None and kept.get(("big",), now) == b"y" * 90
    kept.keep(("big",), now, b"w" * 20)  # kept again: its bytes counted once
    assert kept._bytes == sum(len(v) for v in kept._kept.values())


def test_health_answers_each_occupancy_as_it_is_when_asked_again() -> None:
    # The GPU part is built once per occupancy object: asking again with the same one is
    # the same answer, and a new occupancy (a card taken, a card gone bad) is seen at once.
    first = node_status()
    assert health_json(first) == health_json(first)
    taken = replace(occupancy(), free=(), by_job={0: "run-a", 1: "run-c"})
    answer = health_json(node_status(occupancy=taken))
    assert answer["by_job"] == {"0": "run-a", "1": "run-c"} and answer["free_gpus"] == []
    explain = answer["explain"]
    assert explain is not None and explain[1] == "gpu 1: held by run run-c"
    assert health_json(node_status(occupancy=None))["gpus_total"] is None
    assert health_json(first)["free_gpus"] == [1]


def test_health_answers_each_reading_as_it_is_when_a_new_one_comes() -> None:
    """Every part made once per object it is made of: a new node state, disk reading or
    image store is in the very next answer, and the old one again when it comes back."""
    first = node_status()
    cordoned = node_status(node=NodeState(state="cordoned", reason="maintenance"))
    assert health_json(cordoned)["node_state"]["state"] == "cordoned"
    fuller = DiskReading("/srv/storage", Space(total=100 * GIB, free=1 * GIB, available=1 * GIB))
    assert health_json(node_status(disk=fuller))["disk"] == {
        "path": "/srv/storage",
        "used_pct": 99.0,
        "free_gib": 1.0,
    }
    pressed = ImageStore.of("/var/lib/docker", Space(100, 5, 5), high_percent=85)
    assert health_json(node_status(image_store=pressed))["image_store"]["pressure"] is True
    again = health_json(first)
    assert again["node_state"]["state"] == "ready" and again["disk"] == health_json(first)["disk"]
    assert again["disk"] is not None and again["disk"]["free_gib"] == 30.0
    assert again["image_store"]["pressure"] is not True


def test_health_is_encoded_as_its_shape_would_be_byte_for_byte() -> None:
    """The route sends a kept health answer around the state cache's ages: the very bytes
    encode(health_json) would, whichever part moves, and the ages as they are now."""
    answers, features = HealthAnswers(), ("images", "volumes")
    first = node_status()
    moved = [
        first,
        replace(first, cache=CacheStatus(True, 1.5, 2.25, 3)),  # only the ages: later
        node_status(pending={}),
        node_status(pending={"tuneplane-b": pending("failed", 'no "such" image')}),
        node_status(cache=None),
        node_status(occupancy=None, error="the engine is down"),
        node_status(node=NodeState(state="cordoned", reason="maintenance")),
        first,
    ]
    for status in moved:
        for asked in (features, ("images",)):
            kept = answers.encode(status, features=asked)
            assert kept == encode(health_json(status, features=asked))
    later = answers.encode(replace(first, cache=CacheStatus(True, 9.0, 0.5, 4)), features=())
    assert json.loads(later)["state_cache"]["last_event_age_s"] == 9.0
