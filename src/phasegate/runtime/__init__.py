"""What advances a workflow: the engine, the worker, journal, healing and takeover."""
