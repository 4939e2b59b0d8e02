"""A person's actions beside the workflow's own: the queue's (``queue``) and the
cleanup's (``cleanup``), each re-exported by ``phasegate.operations``."""
