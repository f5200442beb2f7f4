"""The bare-process runtime, for development machines only: the runtime (`runtime`), its
jobs' spec and state files (`files`), their process groups (`groups`) and their stamped
logs (`logs`)."""
