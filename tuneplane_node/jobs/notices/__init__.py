"""The cloud's notices and the machine's shutdown, turned into warned drains."""
