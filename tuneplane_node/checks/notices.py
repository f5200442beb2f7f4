"""`check`'s lines on how the node hears that the machine goes away: the cloud's notices
it watches, and whether the OS's shutdown gives it time to drain (logind's delay)."""

from __future__ import annotations

from tuneplane_node.checks.findings import OK, WARN, Finding
from tuneplane_node.jobs.notices.clouds import detected
from tuneplane_node.runtime.logind import Logind, LogindUnavailable
from tuneplane_node.settings import NodeSettings, env_name

DROP_IN = "contrib/systemd/logind-delay.conf"


def check_notices(settings: NodeSettings) -> list[Finding]:
    return [_cloud(settings), _shutdown(settings)]


def _cloud(settings: NodeSettings) -> Finding:
    cloud = settings.cloud_notices
    if cloud == "off":
        return OK, f"cloud notices: none watched ({env_name('cloud_notices')}=off)"
    found = detected() if cloud == "auto" else cloud
    if found is None:
        return OK, "cloud notices: this machine names no cloud (DMI): none watched"
    where = settings.cloud_metadata_url or "its metadata service"
    return OK, f"cloud notices: {found}'s, from {where}: a preemption or maintenance drains"


def _shutdown(settings: NodeSettings) -> Finding:
    if settings.shutdown_inhibit == "off":
        return OK, f"shutdown: not drained for ({env_name('shutdown_inhibit')}=off)"
    logind = Logind()
    try:
        logind.open()
        delay = logind.delay_max_s()
    except LogindUnavailable as exc:
        return WARN, (
            f"shutdown: no systemd-logind ({exc}): the OS's shutdown is not drained for; "
            "SIGTERM to the node ends it as any stop"
        )
    finally:
        logind.close()
    stop = settings.local_stop_timeout
    if delay < stop:
        return WARN, (
            f"shutdown: logind's InhibitDelayMaxSec is {delay:g} s, less than "
            f"{env_name('local_stop_timeout')} ({stop:g} s): a job may be killed before it "
            f"saves; raise it ({DROP_IN})"
        )
    return OK, f"shutdown: drained within logind's InhibitDelayMaxSec ({delay:g} s)"
