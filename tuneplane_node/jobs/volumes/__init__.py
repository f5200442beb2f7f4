"""The node's volume store: files named by their sha256, filled once per machine from
their source, and bound read-only into the jobs that name them (issue 39)."""
