"""The package as an operator installs it: bounds, pins, the sdist.

The bounds themselves are proven in CI (`.ci/run` installs the floors that
contrib/dev/lowest.py prints and runs the fast suite); these tests keep the files that
step reads honest. The metadata is read as the build reads it: setuptools' own parser of
setup.cfg.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import socket
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from setuptools.config.setupcfg import read_configuration

import tuneplane_node

if sys.version_info >= (3, 11):
    import tomllib
else:  # the lowest supported Python: the `test` extra brings tomli there
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
OPTIONS = read_configuration(REPO / "setup.cfg")["options"]
DEPENDENCIES: list[str] = OPTIONS["install_requires"]


def load_lowest() -> ModuleType:
    spec = importlib.util.spec_from_file_location("lowest", REPO / "contrib/dev/lowest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pins(path: Path) -> dict[str, Version]:
    lines = (line.strip() for line in path.read_text().splitlines())
    pairs = (line.split("==") for line in lines if line and not line.startswith("#"))
    return {normalise(name): Version(version) for name, version in pairs}


def normalise(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def test_the_lowest_step_reads_the_requirements_the_build_reads() -> None:
    assert load_lowest().declared() == DEPENDENCIES


def test_each_fact_lives_in_one_file() -> None:
    """setup.cfg holds the metadata; a [project] table would silently win over it."""
    assert "project" not in PYPROJECT
    assert "setuptools" not in PYPROJECT["tool"]


def test_every_runtime_dependency_is_pinned_to_its_floor_for_the_lowest_step() -> None:
    floors = load_lowest().lowest(DEPENDENCIES)
    assert len(floors) == len(DEPENDENCIES)
    for pin, declared in zip(floors, DEPENDENCIES, strict=True):
        requirement = Requirement(declared)
        name, version = pin.split("==")
        assert name == requirement.name
        assert requirement.specifier.contains(version), f"{pin} is outside {declared}"


def test_the_lowest_step_pins_the_timeout_plugin_at_its_floor() -> None:
    """pyproject's `timeout` is pytest-timeout's: the lowest step runs with its floor."""
    extra = OPTIONS["extras_require"]["test"]
    (declared,) = [text for text in extra if Requirement(text).name == "pytest-timeout"]
    assert load_lowest().floored_tools() == [declared]
    assert "timeout" in PYPROJECT["tool"]["pytest"]["ini_options"]


def test_a_dependency_without_a_floor_is_refused_not_left_at_its_newest() -> None:
    with pytest.raises(ValueError, match="nvidia-ml-py"):
        load_lowest().lowest(["aiohttp>=3.14.4", "nvidia-ml-py"])


def test_what_the_code_imports_is_declared() -> None:
    declared = {Requirement(text).name for text in DEPENDENCIES}
    # requests and urllib3: the adapters translate their exceptions (runtime/engines/docker.py).
    imported = {"aiohttp", "docker", "podman", "pydantic", "pydantic-settings", "requests"}
    imported |= {"urllib3", "nvidia-ml-py", "prometheus-client", "rich", "httpx"}
    assert imported <= declared


def test_the_image_constraints_pin_every_dependency_inside_its_range() -> None:
    pinned = pins(REPO / "constraints.txt")
    for text in DEPENDENCIES:
        requirement = Requirement(text)
        version = pinned.get(normalise(requirement.name))
        assert version is not None, f"constraints.txt lacks {requirement.name}"
        assert requirement.specifier.contains(version), f"{requirement.name}=={version}"


def test_mypy_checks_against_the_lowest_supported_python() -> None:
    config = PYPROJECT["tool"]
    assert str(OPTIONS["python_requires"]) == f">={config['mypy']['python_version']}"
    assert config["ruff"]["target-version"] == "py" + config["mypy"]["python_version"].replace(
        ".", ""
    )


@pytest.mark.slow
@pytest.mark.once  # the whole suite's run builds it: the same on every Python
def test_the_sdist_carries_its_tests_and_they_collect(tmp_path: Path) -> None:
    """An unpacked sdist collects as many tests as the checkout (conftest and helpers
    shipped), and carries the version the package says."""
    dist = tmp_path / "dist"
    # No isolation: the test venv's setuptools builds it, so no index is needed.
    build = [sys.executable, "-m", "build", "--sdist", "--no-isolation", "-o", str(dist)]
    subprocess.run([*build, str(REPO)], check=True, capture_output=True, timeout=120)
    (archive,) = dist.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    unpacked = tmp_path / archive.name.removesuffix(".tar.gz")
    assert f"Version: {tuneplane_node.__version__}\n" in (unpacked / "PKG-INFO").read_text()
    assert collected(unpacked) == collected(REPO)


def collected(root: Path) -> int:
    """How many tests pytest collects in ``root``, its package first on the path."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    last = result.stdout.strip().splitlines()[-1]  # "790 tests collected in 2.1s"
    return int(last.split()[0])


# --- the consoles' client, a distribution of its own -------------------------------------

CLIENT = REPO / "clients" / "python"
CLIENT_PROJECT = tomllib.loads((CLIENT / "pyproject.toml").read_text())["project"]


def test_the_client_distribution_bounds_httpx_as_the_daemon_does() -> None:
    (httpx,) = [text for text in DEPENDENCIES if Requirement(text).name == "httpx"]
    assert CLIENT_PROJECT["dependencies"] == [httpx]
    assert CLIENT_PROJECT["requires-python"] == OPTIONS["python_requires"]
    # Its sources are the daemon's: a link in the checkout, copies in the sdist.
    shipped = {p.name: p.read_bytes() for p in (CLIENT / "tuneplane_node/client").glob("*.py")}
    assert shipped == {
        p.name: p.read_bytes() for p in (REPO / "tuneplane_node/client").glob("*.py")
    }


def build_client_wheel(into: Path) -> Path:
    """clients/python's wheel, built with this venv's setuptools (no index)."""
    build = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "-o", str(into)]
    subprocess.run([*build, str(CLIENT)], check=True, capture_output=True, timeout=120)
    (wheel,) = into.glob("tuneplane_node_sdk-*.whl")
    return wheel


def closure(name: str) -> set[str]:
    """The distribution and every one it needs here, as installed in this venv."""
    found, todo = set(), [name]
    while todo:
        dist = importlib.metadata.distribution(todo.pop())
        if dist.metadata["Name"] in found:
            continue
        found.add(dist.metadata["Name"])
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found


CONSOLE = """
import importlib.util, sys
from tuneplane_node.client import NodeClient, Unreachable
import tuneplane_node
assert not hasattr(tuneplane_node, "__version__")  # a namespace: the daemon is not here
for sdk in ("docker", "podman", "pynvml", "aiohttp", "pydantic", "orjson", "requests"):
    assert importlib.util.find_spec(sdk) is None, sdk
try:
    NodeClient(sys.argv[1], token="t").health()
except Unreachable as error:
    print(error)
"""


@pytest.mark.slow
@pytest.mark.once
def test_the_client_wheel_is_the_client_alone_and_runs_with_httpx_alone(tmp_path: Path) -> None:
    """A console's interpreter: the client's wheel and httpx's closure, nothing of the
    daemon; it imports and asks (a node that is not there: Unreachable)."""
    wheel = build_client_wheel(tmp_path / "dist")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("/METADATA"))).decode()
        site = tmp_path / "site"
        archive.extractall(site)
    modules = {n for n in names if not n.split("/")[0].endswith(".dist-info")}
    ours = {
        f"tuneplane_node/client/{p.name}" for p in (REPO / "tuneplane_node/client").glob("*.py")
    }
    # no tuneplane_node/__init__.py: the daemon's package is not shadowed; py.typed: PEP 561
    assert modules == ours | {"tuneplane_node/client/py.typed"}
    assert "Name: tuneplane-node-sdk\n" in metadata  # not openapi-python-client's name
    assert f"Version: {tuneplane_node.__version__}\n" in metadata
    assert [line for line in metadata.splitlines() if line.startswith("Requires-Dist")] == [
        f"Requires-Dist: {Requirement(CLIENT_PROJECT['dependencies'][0])}"
    ]
    for name in closure("httpx"):
        dist = importlib.metadata.distribution(name)
        for file in dist.files or []:
            if file.suffix != ".pyc" and not str(file).startswith(".."):
                target = site / file
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(Path(str(dist.locate_file(file))).read_bytes())
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{port.getsockname()[1]}"
    port.close()
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            f"import sys; sys.path[:0] = [{str(site)!r}]\n" + CONSOLE,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"cannot reach the node at {url}: Connection refused\n"
