"""The engine runtimes: docker's and podman's adapters over `EngineRuntime`, and what
they ask of an engine (isolation, networks, pulls, limits)."""
