"""The NVIDIA Container Toolkit's version, read from the machine (``nvidia-ctk
--version``), and the floor it is held to.

The toolkit's createContainer hook ran an image's own library as host root in 1.17.7 and
older (NVIDIAScape, CVE-2025-23266; CDI mode included): a hostile image owns the
machine. A node with cards on such a toolkit is not ready (`readiness`), and ``check``
FAILs naming the CVE. Read off the loop, at most once per readiness look.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess

log = logging.getLogger(__name__)
CVE = "CVE-2025-23266"
TIMEOUT_S = 5.0
VERSION = re.compile(r"version\s+v?(\d+(?:\.\d+){1,3})", re.IGNORECASE)


def installed_version(command: str = "nvidia-ctk") -> str | None:
    """What ``nvidia-ctk --version`` says (``NVIDIA Container Toolkit CLI version
    1.17.8``); None: not installed, or it said nothing the node can read."""
    path = shutil.which(command)
    if path is None:
        return None
    try:
        done = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("%s --version: %s", command, exc)
        return None
    found = VERSION.search(done.stdout + done.stderr)
    return found.group(1) if found else None


def older(version: str, floor: str) -> bool:
    """Whether dotted ``version`` is below ``floor`` (missing parts are 0)."""
    return _parts(version) < _parts(floor)


def _parts(version: str) -> tuple[int, ...]:
    numbers = [int(part) for part in re.findall(r"\d+", version)[:4]]
    return tuple(numbers + [0] * (4 - len(numbers)))


def refusal(version: str, floor: str) -> str | None:
    """Why a node with this toolkit is not ready; None: it is at the floor or above."""
    if not older(version, floor):
        return None
    return (
        f"the NVIDIA Container Toolkit is {version}, older than "
        f"TUNEPLANE_GPU_TOOLKIT_MIN_VERSION={floor}: {CVE} (NVIDIAScape) gives a hostile "
        "image host root through its createContainer hook; upgrade the toolkit "
        "(nvidia-container-toolkit) and restart the engine"
    )
