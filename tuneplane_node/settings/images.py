"""`ImageStoreSettings`: the engine's images, declared apart (`NodeSettings` extends
it): pulls' deadlines, registry credentials and the private-image rule, the image GC and
the data root's disk and inode thresholds (``TUNEPLANE_IMAGE_*``, ``TUNEPLANE_INODE_*``,
``TUNEPLANE_LOCAL_IMAGE_PULL_*``). The thresholds' order is checked with the others'
(`NodeSettings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings

from tuneplane_node.settings.values import DAY


class ImageStoreSettings(BaseSettings):
    """How the node pulls, trusts and collects the engine's images."""

    local_image_pull_timeout_s: float = Field(3600.0, gt=0, le=7 * DAY, allow_inf_nan=False)
    """Seconds an image pull may take in all."""
    local_image_pull_stall_s: float = Field(300.0, gt=0, le=DAY, allow_inf_nan=False)
    """Seconds an image pull may go without progress before it is abandoned."""
    registry_auth_file: Path | None = None
    """Registry credentials in Docker's config.json format (``auths``, ``credHelpers``,
    ``credsStore``), for launches that bring none; read again when it changes and on
    SIGHUP."""
    check_image: str = Field("busybox:1.36", min_length=1, max_length=255)
    """The image of ``check``'s throwaway job (egress): ``sh`` and ``nc``; never pulled."""
    private_image_check: bool = True
    """Run an image the node pulled with credentials only for a launch whose credentials
    are the ones it was pulled with, or which its registry accepts now."""
    private_image_recheck_s: float = Field(3600.0, ge=0, le=30 * DAY, allow_inf_nan=False)
    """Seconds a registry's yes to a credential for a private image is trusted."""
    image_gc: Literal["node", "all", "off"] = "node"
    """Which unused images the image GC may remove: ``node`` only those the node pulled
    or its containers used, ``all`` any of the engine's (as kubelet does), ``off`` none."""
    image_gc_high_percent: int = Field(85, ge=1, le=100)
    """Use of the engine's data-root filesystem, in percent, at which the GC removes
    images, and at or above which a pull is refused (507)."""
    image_gc_low_percent: int = Field(80, ge=0, le=99)
    """Use, in percent, the GC brings the filesystem down to; below the high one."""
    inode_high_percent: int = Field(95, ge=1, le=100)
    """Use of the engine's data-root filesystem's inodes (statvfs' ``f_favail`` counted
    as free), in percent, at or above which the node is under ``inode_pressure``
    (kubelet's ``nodefs.inodesFree < 5%``): launches are refused (507), the jobs past
    their inode limit then the largest holder are stopped, then the image GC runs."""
    inode_low_percent: int = Field(90, ge=0, le=99)
    """Inode use, in percent, the image GC brings the filesystem down to under inode
    pressure; below the high one."""
    image_gc_min_age_s: float = Field(120.0, ge=0, le=30 * DAY, allow_inf_nan=False)
    """Seconds an image must have been on the node (since its pull, or since the node
    first saw it) before the GC may remove it."""
    image_gc_max_unused_s: float = Field(0.0, ge=0, le=365 * DAY, allow_inf_nan=False)
    """Seconds after its last use an image is removed whatever the disk; 0: never."""
    image_gc_interval_s: float = Field(300.0, ge=1, le=DAY, allow_inf_nan=False)
    """Seconds between two GC runs (one also runs before every pull)."""
    image_pin_s: float = Field(3600.0, ge=0, le=30 * DAY, allow_inf_nan=False)
    """Seconds a prefetched image is kept from the GC while no container has used it."""
