"""The state cache: every labelled container's state kept current from the engine's
events (state.py), and the runtime that reads from it (runtime.py)."""

from tuneplane_node.runtime.cache.runtime import CachedRuntime as CachedRuntime
from tuneplane_node.runtime.cache.state import StateCache as StateCache
