"""The CDI specifications of a machine: which ``nvidia.com/gpu=<name>`` devices exist.

A CDI specification (the Container Device Interface, what ``nvidia-ctk cdi generate``
writes) is a JSON or YAML file naming a device ``kind`` and its ``devices``. podman hands
a card to a container as ``nvidia.com/gpu=<index>``, which only a specification naming
that index makes possible. No YAML library is needed: the fields read here are top-level
keys and the ``name`` of each device, one per line in every generator's output.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path

from tuneplane_node.runtime.facts import CDI_GPU_KIND as GPU_KIND

log = logging.getLogger(__name__)
SUFFIXES = (".json", ".yaml", ".yml")
MAX_SPEC_BYTES = 4 * 2**20  # a spec of 8 cards is ~20 KB
_KIND = re.compile(r"""^kind:\s*["']?([^"'\s#]+)""")
_NAME = re.compile(r"""^name:\s*["']?([^"'\s#]+)""")
_DEVICES = re.compile(r"^devices:")


def gpu_devices(directories: Iterable[str]) -> set[str]:
    """The device names of kind ``nvidia.com/gpu`` in every specification there (``0``,
    ``GPU-<uuid>``, ``all``); unreadable files are logged and skipped."""
    names: set[str] = set()
    for directory in directories:
        for path in sorted(Path(directory).glob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            try:
                text = path.read_text(encoding="utf-8")[:MAX_SPEC_BYTES]
                kind, devices = _parse(text, json_file=path.suffix == ".json")
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                log.warning("CDI specification %s unreadable: %s", path, exc)
                continue
            if kind == GPU_KIND:
                names |= devices
    return names


def _parse(text: str, *, json_file: bool) -> tuple[str | None, set[str]]:
    if json_file:
        spec = json.loads(text)
        if not isinstance(spec, dict):
            raise ValueError("not a JSON object")
        devices = spec.get("devices") or []
        named = {str(d.get("name")) for d in devices if isinstance(d, dict) and d.get("name")}
        return spec.get("kind"), named
    return _yaml_kind(text), _yaml_devices(text)


def _yaml_kind(text: str) -> str | None:
    for line in text.splitlines():
        if (match := _KIND.match(line)) is not None:
            return match.group(1)
    return None


def _yaml_devices(text: str) -> set[str]:
    """The ``name`` of each item of the top-level ``devices`` list, on the item's first
    line (``- name: "0"``) or at its keys' indent; names deeper (an env entry's) are not."""
    names: set[str] = set()
    in_devices, item_indent, key_indent = False, -1, -1
    for line in text.splitlines():
        stripped = line.lstrip(" ")
        indent = len(line) - len(stripped)
        if not stripped or stripped.startswith("#"):
            continue
        if indent == 0 and not stripped.startswith("-"):  # a top-level key
            in_devices, item_indent = _DEVICES.match(stripped) is not None, -1
            continue
        if not in_devices:
            continue
        if stripped.startswith("- ") and (item_indent < 0 or indent <= item_indent):
            item_indent, key_indent = indent, indent + 2  # a new device
            stripped, indent = stripped[2:], key_indent
        if indent == key_indent and (match := _NAME.match(stripped)) is not None:
            names.add(match.group(1))
    return names
