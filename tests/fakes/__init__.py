"""Fakes of what the fast tests do without: an engine, a clock, GPUs."""
