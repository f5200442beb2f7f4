"""The layering of the package (README, "Layout"): imports point down, SDKs stay put.

Read from the source with `ast`, so a stray import fails here before it blurs a seam.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

import pytest

# Slow: it parses every module of the package (0.6 s of the fast suite's 15).
pytestmark = pytest.mark.slow

PACKAGE = Path(__file__).resolve().parents[2] / "tuneplane_node"

# Top to bottom; a module may import only from its own layer's module itself or below.
LAYERS = [
    {"cli", "__main__", "ctl", "checks"},
    {"client"},
    {"daemon"},
    {"jobs"},
    {"gpu"},
    # The HTTP clients of what a tenant names (a volume's bytes, a registry's answers):
    # below the job wings that use them, above the container runtimes.
    {"fetch"},
    {"runtime"},
    {"inventory"},
    # The fabrics, a part of the inventory that the job rules and `check` read alone.
    {"fabrics"},
    # The contract at the bottom: every layer above reads its shapes and values, and it
    # reads nothing above the package's bottom modules (errors, sizes, references, ...).
    {"wire"},
    {
        "settings",
        "errors",
        "clock",
        "tasks",
        "logformat",
        "telemetry",
        "sizes",
        "references",
        "durable",
        "signals",
        "watched",
        "printable",
        "__init__",
    },
]
# The operators' client speaks only HTTP: no daemon, service or engine code in it.
CTL_MAY_IMPORT = {"client", "wire", "printable", "__init__", "__version__"}
# Each third-party SDK is imported by exactly these modules, and translated there.
SDKS = {
    # docker.auth reads the registry auth file (config.json) for both engines.
    "docker": {"runtime/engines/docker.py", "runtime/authfile.py"},
    "podman": {"runtime/engines/podman.py"},
    "pynvml": {"gpu/nvml.py"},
    "aiohttp": {
        "daemon/app.py",
        "daemon/routes.py",
        "daemon/state.py",
        "daemon/server.py",
        "daemon/quiet.py",
        "daemon/access/audit.py",
        "daemon/follow.py",
        "daemon/presence.py",
        "daemon/access/guard.py",
        # Its client: the volume store's downloads, translated to VolumeFillFailed there.
        "fetch/fetching.py",
    },
    "prometheus_client": {"daemon/metrics.py"},
    # The consoles' client: its two clients, and the one place its errors are translated.
    "httpx": {"client/aio.py", "client/sync.py", "client/endpoint.py"},
    "orjson": {"daemon/render.py"},
    # systemd-logind on the system bus: the OS's shutdown, a delay lock (issue 54).
    "jeepney": {"runtime/logind.py"},
}


def unit(path: Path) -> str:
    """The layer name of a module: its top-level module or package under tuneplane_node."""
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def layer(name: str) -> int:
    return next(i for i, names in enumerate(LAYERS) if name in names)


Fact = tuple[str, str, "str | int"]


@functools.cache
def facts(path: Path) -> tuple[Fact, ...]:
    """What the tests here read of a module, parsed once for them all: each imported
    name (``("import", name, "")``), each absolute from-import (``("from", module,
    name)``) and each class (``("class", name, lines)``). Only these are kept, not the
    trees: their 70,000 nodes made every later full collection of the suite slower."""
    found: list[Fact] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [("import", alias.name, "") for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [("from", node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.ClassDef) and node.end_lineno is not None:
            found.append(("class", node.name, node.end_lineno - node.lineno + 1))
    return tuple(found)


@functools.cache
def imports(path: Path) -> list[str]:
    found = []
    for kind, module, name in facts(path):
        if kind == "import":
            found.append(module)
        elif kind == "from":
            found += [module, f"{module}.{name}"]
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path: Path) -> None:
    here = layer(unit(path))
    for name in imports(path):
        parts = name.split(".")
        if parts[0] != "tuneplane_node" or len(parts) == 1:
            continue
        target = parts[1] if parts[1] != "__version__" else "__init__"
        if target in {"cli", "__main__"} | {n for names in LAYERS for n in names}:
            assert layer(target) >= here, f"{path.name} imports {name}: that points up"


@pytest.mark.parametrize("sdk", sorted(SDKS))
def test_each_sdk_lives_in_its_own_module(sdk: str) -> None:
    users = {
        str(path.relative_to(PACKAGE))
        for path in MODULES
        if any(name == sdk or name.startswith(f"{sdk}.") for name in imports(path))
    }
    assert users == SDKS[sdk]


def test_every_module_has_a_layer() -> None:
    assert {unit(path) for path in MODULES} <= {n for names in LAYERS for n in names}


def test_ctl_is_a_client_of_the_api_only() -> None:
    for path in sorted((PACKAGE / "ctl").rglob("*.py")):
        for name in imports(path):
            parts = name.split(".")
            if parts[0] == "tuneplane_node" and len(parts) > 1 and parts[1] != "ctl":
                assert parts[1] in CTL_MAY_IMPORT, f"ctl/{path.name} imports {name}"


def module_name(path: Path) -> str:
    """``tuneplane_node.gpu.probe`` for gpu/probe.py; a package is its ``__init__``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Each module of the package and the package's modules its import statements name."""
    paths = {module_name(path): path for path in MODULES}
    return {name: named_modules(path, set(paths)) - {name} for name, path in paths.items()}


def named_modules(path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path``'s import statements name: for
    ``from pkg import x`` that is ``pkg.x`` when x is a module, else ``pkg``."""
    found = set()
    for kind, module, name in facts(path):
        if kind == "import":
            found.add(module)
        elif kind == "from":
            sub = f"{module}.{name}"
            found.add(sub if sub in known else module)
    return found & known


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """The first circle a depth-first walk meets, as the modules along it; None if none."""
    done: set[str] = set()

    def walk(name: str, trail: list[str]) -> list[str] | None:
        if name in trail:
            return [*trail[trail.index(name) :], name]
        if name in done:
            return None
        for target in sorted(graph[name]):
            if circle := walk(target, [*trail, name]):
                return circle
        done.add(name)
        return None

    return next((c for name in sorted(graph) if (c := walk(name, []))), None)


def test_no_module_imports_itself_round_a_circle() -> None:
    """Every import statement counts, wherever it stands: one inside a function is a
    dependency deferred, not removed (gpu/probe.py's factory once hid its NVML import so,
    in a circle with gpu/nvml.py), and one under TYPE_CHECKING is one mypy and a reader
    follow. Only the modules a statement names are edges, not the parent packages Python
    runs first: those run before any of their submodules, so they close no circle."""
    circle = find_circle(import_graph())
    assert circle is None, " -> ".join(circle or [])


def test_the_circle_finder_finds_a_circle_and_only_a_circle() -> None:
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert find_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


# --- the jobs floor's rooms: its words at the bottom, no import running back up ----------

WORDS = "tuneplane_node.jobs.words"


def room(name: str) -> str:
    """The room of a module of ``jobs/``: its wing (``jobs/images``, the words'
    ``jobs/words``) or its own module (``jobs.launcher``); the front door is ``jobs``."""
    parts = name.split(".")[1:]
    if len(parts) > 2 or (len(parts) == 2 and (JOBS / parts[1]).is_dir()):
        return f"jobs/{parts[1]}"
    return ".".join(parts)


def room_graph() -> dict[str, set[str]]:
    """Each room of ``jobs/`` and the other rooms of ``jobs/`` its modules import."""
    rooms: dict[str, set[str]] = {}
    for name, targets in import_graph().items():
        if name.startswith("tuneplane_node.jobs"):
            here = room(name)
            inside = {room(t) for t in targets if t.startswith("tuneplane_node.jobs")}
            rooms.setdefault(here, set()).update(inside - {here})
    return rooms


def test_no_import_inside_the_jobs_floor_runs_back_up() -> None:
    """The rooms of ``jobs/`` stand in an order: the front door and the builder, the
    service, its collaborators, their wings, the words at the bottom; each imports only
    rooms below it. An import that ran back up would close a circle of rooms, found
    here as module circles are (issue 55: the words once lived in a wing, and six
    imports ran back up between wings for them)."""
    rooms = room_graph()
    circle = find_circle(rooms)
    assert circle is None, " -> ".join(circle or [])
    assert len(rooms) >= 20  # the walk saw the floor's rooms


def test_the_jobs_words_import_no_service_of_the_floor() -> None:
    """The ground floor imports the floors below ``jobs/`` and itself only, as httpx's
    ``_models.py`` imports only leaf modules: every wing may read it."""
    assert room_graph()["jobs/words"] == set()


def test_above_the_jobs_floor_the_words_are_imported_by_their_public_names() -> None:
    """Above ``jobs/`` (the daemon, the checks, the CLI), a word is imported from
    ``tuneplane_node.jobs.words`` (or the floor's front door), never from the module
    that holds it: those may split or merge without a change above."""
    graph = import_graph()
    inner = {
        name: sorted(t for t in targets if t.startswith(f"{WORDS}."))
        for name, targets in graph.items()
        if not name.startswith("tuneplane_node.jobs")
    }
    assert not {name: found for name, found in inner.items() if found}
    assert any(WORDS in targets for targets in graph.values())  # the words are read


def test_the_room_finder_names_wings_and_modules() -> None:
    assert room("tuneplane_node.jobs") == "jobs"
    assert room("tuneplane_node.jobs.launcher") == "jobs.launcher"
    assert room("tuneplane_node.jobs.words") == "jobs/words"
    assert room("tuneplane_node.jobs.images.gc") == "jobs/images"


def test_the_daemon_reaches_no_engines_module() -> None:
    """The daemon knows no engine: what it holds of the runtime floor (the registry auth
    file, the runtime's contract) stands outside ``runtime/engines/`` (issue 55: it
    imported the auth file from there)."""
    found = sorted(
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in sorted((PACKAGE / "daemon").rglob("*.py"))
        for name in imports(path)
        if name.startswith("tuneplane_node.runtime.engines")
    )
    assert found == []


# What of the engines' wing jobs/ still reads: nothing (the jobs' bounds are the
# runtime's cgroups.py, the engine's memlock its memlock.py).
ENGINES = "tuneplane_node.runtime.engines"
JOBS_READ_OF_ENGINES: dict[str, set[str]] = {}


def test_the_jobs_floor_asks_the_runtime_not_the_engines_insides() -> None:
    """A rule of the jobs floor asks the runtime's contract (`runtime.base`, its facts,
    its spec, its labels), never an engine adapter's module (issue 55: the rules read the
    fabric's interface and gateway and which runtimes map users from the engines' wing)."""
    found: dict[str, set[str]] = {}
    for path in sorted(JOBS.rglob("*.py")):
        names = {
            f"{module}.{name}" if module == ENGINES else str(module)
            for kind, module, name in facts(path)
            if kind != "class" and str(module).startswith(ENGINES)
        }
        if names:
            found[str(path.relative_to(PACKAGE))] = names
    assert found == JOBS_READ_OF_ENGINES


# --- labels: written and read in one module ---------------------------------------------------

LABELS = PACKAGE / "runtime" / "labels.py"
LABEL_NAMES = ("LABEL_", "NODE_LABELS", "HIDDEN_LABELS")


def test_a_label_is_taken_from_the_module_that_writes_and_reads_it() -> None:
    """A job's label is spelt in the contract (`wire.values`) and written and read in
    `runtime/labels.py` (kubelet's ``kuberuntime/labels.go``): every other module takes
    the names, the writers and the readers from there, so a label's writing and its
    parsing are read side by side (issue 55: one was spelt in wire, re-exported by
    runtime/base.py, written in runtime/spec.py and parsed in two more)."""
    found = sorted(
        f"{path.relative_to(PACKAGE)}: {name}"
        for path in MODULES
        if path != LABELS and unit(path) != "wire"
        for kind, module, name in facts(path)
        if kind == "from"
        and module == "tuneplane_node.wire.values"
        and str(name).startswith(LABEL_NAMES)
    )
    assert found == []
    assert any(str(name).startswith("LABEL_") for _, _, name in facts(LABELS))  # walked


# --- the job service as collaborators it calls down to ------------------------------------

JOBS = PACKAGE / "jobs"
SERVICE_MAX_LINES = 250
CLASS_MAX_LINES = 350


def class_lines(path: Path) -> dict[str, int]:
    """Each class of a module and its length in lines, from ``class`` to its last line."""
    return {name: int(lines) for kind, name, lines in facts(path) if kind == "class"}


def test_the_job_service_only_composes_its_collaborators() -> None:
    """The rules that are the service's own stay in it; each mechanism (launching,
    stopping, reaping, logs, the node state) is a collaborator of its own."""
    lines = class_lines(JOBS / "service.py")["JobService"]
    assert lines < SERVICE_MAX_LINES, f"JobService is {lines} lines"


@pytest.mark.parametrize("path", sorted(JOBS.rglob("*.py")), ids=lambda p: p.name)
def test_no_class_of_the_job_service_is_over_the_limit(path: Path) -> None:
    too_long = {name: n for name, n in class_lines(path).items() if n > CLASS_MAX_LINES}
    assert not too_long, f"{path.name}: {too_long}"


def test_no_collaborator_of_the_job_service_imports_it() -> None:
    """A collaborator gets what it needs as constructor arguments, never the service:
    only the package's front door (``jobs/__init__.py``) and the one place that builds
    the node (``jobs/node.py``) name ``jobs/service.py``."""
    graph = import_graph()
    service = "tuneplane_node.jobs.service"
    users = {name for name, targets in graph.items() if service in targets}
    assert users <= {"tuneplane_node.jobs", "tuneplane_node.jobs.node"}, sorted(users)
    collaborators = {name for name in graph if name.startswith("tuneplane_node.jobs.")}
    assert len(collaborators - {service}) >= 8  # the walk saw the package's modules


def test_no_class_of_the_package_is_over_the_limit() -> None:
    """The jobs/ bound, everywhere: a class past it holds more than one concern, whose
    pieces belong in collaborators or module functions of their own (issue 19)."""
    too_long = {
        f"{path.relative_to(PACKAGE)}:{name}": n
        for path in MODULES
        for name, n in class_lines(path).items()
        if n > CLASS_MAX_LINES
    }
    assert not too_long, too_long
    assert len(MODULES) >= 50  # the walk saw the package


FOLDER_MAX_FILES = 15
"""A folder past it is a floor without rooms: its wings get folders (issue 35). Every
file counts, its ``__init__.py`` too."""


def test_no_folder_holds_more_than_fifteen_files() -> None:
    folders = {path.parent for path in MODULES}
    crowded = {
        str(folder.relative_to(PACKAGE.parent)): n
        for folder in folders
        if (n := len(list(folder.glob("*.py")))) > FOLDER_MAX_FILES
    }
    assert not crowded, crowded
    assert len(folders) >= 10  # the walk saw the package's folders


MODULE_MAX_LINES = 600
"""A module past it holds more than one concern: it is split by concern (issue 35)."""


def test_no_module_is_over_six_hundred_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in MODULES
        if (n := len(path.read_text().splitlines())) > MODULE_MAX_LINES
    }
    assert not long, long


def test_the_client_stands_alone() -> None:
    """A console installs `tuneplane_node.client` without the daemon (its own
    distribution, clients/python): it imports nothing else of the package."""
    for path in sorted((PACKAGE / "client").rglob("*.py")):
        for name in imports(path):
            parts = name.split(".")
            if parts[0] == "tuneplane_node":
                assert parts[1:2] == ["client"], f"client/{path.name} imports {name}"


# --- one place builds the node ---------------------------------------------------------------

# The classes handed their collaborators by `build_node`, and the modules they are in.
BUILT = {"JobService": JOBS / "service.py", "Launcher": JOBS / "launcher.py"}


def constructions(source: str, cls: str) -> list[str]:
    """The package's classes that ``cls.__init__`` calls (makes): the names imported from
    ``tuneplane_node`` that start with a capital, called in that method."""
    tree = ast.parse(source)
    ours = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tuneplane_node")
        for alias in node.names
    }
    ours |= {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    made = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        for method in node.body:
            if isinstance(method, ast.FunctionDef) and method.name == "__init__":
                for call in ast.walk(method):
                    if isinstance(call, ast.Call):
                        name = ast.unparse(call.func).split(".")[0]
                        if name in ours and name[:1].isupper():
                            made.append(name)
    return made


@pytest.mark.parametrize("cls", sorted(BUILT))
def test_the_service_and_the_launcher_make_no_collaborator(cls: str) -> None:
    """`jobs.node.build_node` makes every collaborator once; the service and the launcher
    receive theirs, so that what a test hands them is what production does."""
    assert constructions(BUILT[cls].read_text(), cls) == [], cls


def test_the_construction_finder_finds_a_construction() -> None:
    source = (
        "from tuneplane_node.jobs.locks import RefLocks\n"
        "class JobService:\n"
        "    def __init__(self, runtime):\n"
        "        self.runtime = runtime\n"
        "        self.locks = RefLocks()\n"
        "        self.names = dict()\n"
    )
    assert constructions(source, "JobService") == ["RefLocks"]


def node_services() -> frozenset[str]:
    from tuneplane_node.jobs.node import Node

    return frozenset(field.name for field in dataclasses.fields(Node))


def reach_throughs(source: str, services: frozenset[str]) -> list[str]:
    """The attribute chains from the node (``app[NODE]``, or a name ``node``) that go
    through one service to another (``app[NODE].jobs.launcher``,
    ``app[NODE].launcher.volumes.view()``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        chain: list[str] = []
        root: ast.expr = node
        while isinstance(root, ast.Attribute):
            chain.insert(0, root.attr)
            root = root.value
        from_node = (isinstance(root, ast.Subscript) and ast.unparse(root.slice) == "NODE") or (
            isinstance(root, ast.Name) and root.id == "node"
        )
        if from_node and len(chain) == 2 and chain[0] in services and chain[1] in services:
            found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("path", sorted((PACKAGE / "daemon").rglob("*.py")), ids=lambda p: p.name)
def test_the_daemon_talks_to_each_service_directly(path: Path) -> None:
    """A route asks the service that answers it (`app[NODE].catalog`), never one service
    for another (`app[NODE].jobs.catalog`): the node is built in one place, and which
    service holds which is not the daemon's to know."""
    assert reach_throughs(path.read_text(), node_services()) == [], path.name


def test_the_reach_through_finder_finds_one() -> None:
    services = node_services()
    assert {"jobs", "launcher", "volumes", "gc"} <= services
    source = (
        "a = request.app[NODE].launcher.volumes.view()\n"
        "b = request.app[NODE].volumes.view()\n"
        "c = node.jobs.launcher\n"
        "d = node.jobs.launch(x)\n"
    )
    assert sorted(reach_throughs(source, services)) == [
        "node.jobs.launcher",
        "request.app[NODE].launcher.volumes",
    ]


def second_phases(source: str, function: str) -> list[str]:
    """What ``function`` does to a part after making it: an attribute set (``a.b = c``)
    or a call whose result it drops (``changes.reads(...)``, ``x.listeners.append(f)``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == function:
            for statement in ast.walk(node):
                targets = []
                if isinstance(statement, ast.Assign):
                    targets = statement.targets
                elif isinstance(statement, (ast.AugAssign, ast.AnnAssign)):
                    targets = [statement.target]
                for target in targets:
                    each = target.elts if isinstance(target, ast.Tuple) else [target]
                    found += [ast.unparse(t) for t in each if isinstance(t, ast.Attribute)]
                if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
                    found.append(ast.unparse(statement.value))
    return found


def test_the_node_is_built_complete() -> None:
    """`build_node` hands each part all it needs in its constructor, in the order it
    makes them: nothing is set on a part afterwards and no part has a second phase, so
    a part is never seen half made (issue 55: three of health's readers, the change
    log's reads and the faults' listeners were once set after)."""
    assert second_phases((JOBS / "node.py").read_text(), "build_node") == []


def test_the_second_phase_finder_finds_one() -> None:
    source = (
        "def build_node():\n"
        "    health = HealthReader()\n"
        "    health.held_by = f\n"
        "    changes.reads(read)\n"
        "    faults.changed, n = changes.changed, 1\n"
        "    jobs = JobService(faults=lambda: faults.job_faults)\n"
    )
    found = second_phases(source, "build_node")
    assert found == ["health.held_by", "changes.reads(read)", "faults.changed"]


# The modules of jobs/ that take the whole runtime: the builder, and those that use most
# of its verbs. Every other collaborator declares the few it uses, where it uses them (as
# Nomad's docker driver declares a three-method image client), so a reader sees what a
# collaborator can do to the engine, and a test's fake needs only that (issue 35).
WHOLE_RUNTIME = {
    "node.py",
    "service.py",
    "launcher.py",
    "health.py",
    "mounts/launch.py",
    "rules/fabric.py",
    "rules/isolation.py",
}


def test_the_jobs_collaborators_declare_the_runtime_they_use() -> None:
    takers = {
        str(path.relative_to(JOBS))
        for path in JOBS.rglob("*.py")
        if "ContainerRuntime" in path.read_text()
    }
    assert takers <= WHOLE_RUNTIME, sorted(takers - WHOLE_RUNTIME)
    assert "node.py" in takers  # the walk read the package


# --- the settings a collaborator reads -------------------------------------------------------

# The modules of jobs/ that still take the whole `NodeSettings`: the builder, which makes
# each view, and those not yet given one. Every other collaborator reads the view of its
# concern (settings/views.py: the image wing, the volume wing, the stopper, the reaper and
# the drain, the change log and the logs reader), so a reader sees which settings it
# depends on, and a test hands it just those (issue 35). A converted one stays converted.
WHOLE_SETTINGS = {
    "node.py",
    "health.py",
    "disk/limit.py",
    "disk/monitor.py",
    "mounts/scratch.py",
    "rules/affinity.py",
    "rules/confinement.py",
    "rules/isolation.py",
    "rules/network.py",
}
WHOLE = {"NodeSettings", "JobSettings"}


def names_node_settings(path: Path) -> bool:
    """Whether the module imports `NodeSettings` (or `JobSettings`, its base), by any
    import: under TYPE_CHECKING or in a function, it still depends on every setting."""
    return any(
        kind == "from" and module.startswith("tuneplane_node.settings") and name in WHOLE
        for kind, module, name in facts(path)
    )


def test_the_jobs_collaborators_read_the_view_of_their_concern() -> None:
    takers = {
        str(path.relative_to(JOBS)) for path in JOBS.rglob("*.py") if names_node_settings(path)
    }
    assert takers <= WHOLE_SETTINGS, sorted(takers - WHOLE_SETTINGS)
    assert "node.py" in takers  # the walk read the package
    for wing in ("images", "volumes", "observe"):
        assert not any(taker.startswith(f"{wing}/") for taker in takers), wing


def test_the_settings_finder_finds_an_import(tmp_path: Path) -> None:
    whole, view = tmp_path / "whole.py", tmp_path / "view.py"
    whole.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from tuneplane_node.settings.node import NodeSettings\n"
    )
    view.write_text("from tuneplane_node.settings import ImageSettings, env_name\n")
    assert names_node_settings(whole)
    assert not names_node_settings(view)
