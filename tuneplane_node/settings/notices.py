"""`NoticeSettings`: the cloud's notices and the machine's shutdown, declared apart
(`NodeSettings` extends it): which cloud's metadata service the node watches, where, how
often, and how much of a notice's time its drain leaves unused (``TUNEPLANE_CLOUD_*``,
``TUNEPLANE_SHUTDOWN_*``)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from tuneplane_node.settings.values import DAY


class NoticeSettings(BaseSettings):
    """Where the node hears that the machine goes away, and how it uses the time."""

    cloud_notices: Literal["auto", "aws", "gcp", "azure", "off"] = "auto"
    """The cloud whose metadata service the node watches for preemption, termination and
    maintenance notices: ``auto`` reads the machine's DMI identity (AWS, GCP and Azure
    say who they are) and watches none elsewhere."""
    cloud_metadata_url: str | None = None
    """The metadata service's base URL (unset: the cloud's own, ``http://169.254.169.254``;
    GCP's ``http://metadata.google.internal``): for a cloud that serves it elsewhere, and
    for tests. Only the node's own requests go there: jobs never reach it."""
    cloud_notice_poll_s: float = Field(5.0, ge=1, le=300, allow_inf_nan=False)
    """Seconds between two asks of an endpoint that is polled (AWS, Azure; GCP waits for
    the change instead). An endpoint that does not answer is asked less often, up to
    ``cloud_notice_poll_s`` times 60."""
    cloud_notice_margin_s: float = Field(10.0, ge=0, le=DAY, allow_inf_nan=False)
    """Seconds before a notice's deadline by which every job's stop has ended: the
    drain's budget is the time to the deadline less this."""
    cloud_notice_ack: bool = False
    """Azure: acknowledge a scheduled event (start it early) once the drain it made has
    ended, so the machine goes without waiting out the notice."""
    shutdown_inhibit: Literal["auto", "off"] = "auto"
    """Hold a systemd-logind delay inhibitor and drain on ``PrepareForShutdown`` (the
    cloud's power-off of a preempted VM arrives this way), within logind's
    ``InhibitDelayMaxSec``. ``auto``: where the system bus is reachable."""

    @field_validator("cloud_metadata_url")
    @classmethod
    def _base_url(cls, url: str | None) -> str | None:
        if url is None or url == "":
            return None
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url!r} is not an http:// or https:// base URL")
        return url.rstrip("/")
