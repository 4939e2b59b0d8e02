"""The GitHub forge: REST through githubkit, auth, git over HTTPS, faults."""
