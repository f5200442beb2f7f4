"""Typed application state (aiohttp AppKeys), shared by app.py and routes.py."""

from __future__ import annotations

from aiohttp import web

from tuneplane_node.daemon.disk import DiskGauge
from tuneplane_node.daemon.launches import Launches
from tuneplane_node.gpu.allocator import GpuAllocator
from tuneplane_node.runtime.base import ContainerRuntime
from tuneplane_node.settings import NodeSettings

SETTINGS = web.AppKey("settings", NodeSettings)
RUNTIME = web.AppKey("runtime", ContainerRuntime)
ALLOCATOR = web.AppKey("allocator", GpuAllocator)
LAUNCHES = web.AppKey("launches", Launches)
DISK = web.AppKey("disk", DiskGauge)
