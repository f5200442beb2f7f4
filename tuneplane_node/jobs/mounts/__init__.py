"""The mounts wing of the launcher: which host paths a job may mount, opened without
links (`policy`), bound where the engine takes them (`staging`), a job's scratch space
(`scratch`), and a launch's mounts, scratch and volumes vetted, staged and released
(`launch`)."""
