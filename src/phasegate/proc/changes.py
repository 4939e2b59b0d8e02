"""How many times phasegate may have changed a checkout: one counter every writer bumps.

Git calls that may write (``phasegate.git.command``) and processes that may
write outside git (an agent's run, a check's process: ``phasegate.proc.process``)
both count here, below both of them, so neither imports the other for it.
"""

from __future__ import annotations

import threading

__all__ = ["changes", "note_change"]

_CHANGES = 0
_LOCK = threading.Lock()


def changes() -> int:
    """How many times, so far, phasegate may have changed a checkout: every git call
    but a read, before and after it runs, and every ``note_change`` (an agent ran,
    a supervised process ran), in any thread. What phasegate saw of a checkout
    when this was N is still so while it is N, but for a person's own edits
    (agents/service.py, healing.py). Another thread's workflow
    moves it too: that only makes a caller look again."""
    return _CHANGES


def note_change() -> None:
    """Count one change (``changes``): called before and after anything outside
    git that may write a checkout (an agent's run, a check's process)."""
    global _CHANGES
    with _LOCK:
        _CHANGES += 1
