"""The operator's rules a launch is decided by: confinement, isolation, the host and
fabric networks, CPU affinity."""
