"""Supervised processes: the subreaper, the self-fencing deadline, the sandbox."""
