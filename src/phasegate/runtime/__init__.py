"""What advances a workflow: the engine, the worker, journal, healing and takeover."""

#: Workflows one worker advances at once by default: agents are subprocesses, so
#: a thread costs little while it waits on one; what bounds it is the machine
#: running that many agents (and their checks) side by side. It lives here, not in
#: ``worker``, so that the command line shows it without importing the worker.
DEFAULT_CONCURRENCY = 4
