"""A person's actions beside the workflow's own, each re-exported by ``phasegate.operations``:
the queue's (``queue``), the cleanup's (``cleanup``), an epic's (``epic``) and which actions a
workflow's state admits (``offered``)."""
