"""The node's job networks as the engines make them (jobnetwork.py), and the rules that
keep their jobs off this machine's own ports (hostguard.py)."""
