"""The status label on a workflow's issue: set where the workflow rests, not at every step.

A label is a view of the store for people on the forge, and a claim: an issue
with a status label has a workflow, so no watcher of another store starts one
for it (``forge.base.status_label``). Each change costs two forge calls, so the
label follows where a workflow rests — a wait for CI or a person, a pause, its
end — and not every phase it passes through in one advance; the first step of
a workflow this engine has not labelled yet sets it at once (the claim).
"""

from __future__ import annotations

import logging

from phasegate.core.contract import COMPLETED
from phasegate.forge.base import Forge, ForgeError, status_label

__all__ = ["StatusLabels"]

log = logging.getLogger(__name__)


class StatusLabels:
    """The labels this engine set on its workflows' issues, and setting them."""

    def __init__(self, forge: Forge) -> None:
        self.forge = forge
        self.set_to: dict[str, str | None] = {}  # workflow → the status label last set

    def current(self, workflow_id: str, status: str) -> bool:
        """Whether the label this engine last set is ``status``'s."""
        return self.set_to.get(workflow_id, "") == status_label(status)

    def show(self, workflow_id: str, number: int | None, status: str, *, resting: bool) -> None:
        """Show ``status`` on issue ``number`` (``phasegate:planning`` …
        ``phasegate:needs-you``) when the workflow rests there, or when this engine
        has set no label on it yet. Best effort: a forge that refuses it is logged
        and the label is tried at the next rest."""
        label = status_label(status)
        known = self.set_to.get(workflow_id, "")
        if not number or known == label or (not resting and workflow_id in self.set_to):
            return
        if status == COMPLETED:
            # The verification that completes a workflow labelled its issue itself,
            # before closing it (phases/acceptance_verification.py).
            self.set_to[workflow_id] = label
            return
        try:
            self.forge.set_status_label(int(number), label)
        except ForgeError as exc:
            log.warning("status label %s on #%s not set: %s", label, number, exc)
            return
        self.set_to[workflow_id] = label
