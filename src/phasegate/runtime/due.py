"""When a workflow an advance left runnable is looked at again, as the worker decides it.

On a team's forge a workflow that only waits on it (for people, or for its CI)
is due again after ``forge.poll_s``, the forge's rate limit (``wait_s``). On
the local forge one waiting for people is watched instead: due again when its
row or the local forge's issues and pull requests change (``Left.watched``).
The worker's module docstring says the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from phasegate.config.cartridge import Cartridge
from phasegate.core.contract import MERGE, PHASE_STATUS_MAP, PR_REVIEW, WAIT

__all__ = [
    "RELOOKS",
    "WAITING_FOR_PEOPLE",
    "Left",
    "earliest",
    "polling",
    "wait_s",
    "waiting_for_people",
    "waits_on_ci",
]


def waits_on_ci(row: Mapping[str, Any]) -> bool:
    """Whether the workflow, as ``advance`` left it, waits for the forge's CI
    (the ``wait`` of pr_review, or of merge on the head it merges: phases/ci.py)."""
    phase = row["current_phase"]
    return phase in (PR_REVIEW, MERGE) and row["status"] == PHASE_STATUS_MAP[phase]


def wait_s(cartridge: Cartridge) -> float:
    """Seconds between two looks at a workflow waiting on the cartridge's forge
    (``forge.poll_s``: a team's forge has a rate limit); 0 on the local forge,
    whose waits are watched for changes instead."""
    forge = cartridge.forge
    return 0.0 if forge.kind == "local" else forge.poll_s


def earliest(a: datetime | None, b: datetime | None) -> datetime | None:
    """The earlier of two moments, either of which may be unknown (None)."""
    return b if a is None else a if b is None else min(a, b)


def polling(row: Mapping[str, Any]) -> bool:
    """Whether the workflow, as ``advance`` left it, only waits on the forge."""
    return row["status"] == "waiting" or waits_on_ci(row)


#: The phase and status of a workflow waiting for people (``Engine.idle_at``).
WAITING_FOR_PEOPLE = {"current_phase": WAIT, "status": "waiting"}


#: Advances of a waiting workflow on one thread while a look after each finds
#: something new (``_Worker._advance_until_idle``): a bound, never reached by a wait
#: phase that commits what it found.
RELOOKS = 3


def waiting_for_people(row: Mapping[str, Any]) -> bool:
    """Whether the workflow, as ``advance`` left it, waits for people in the wait phase."""
    return bool(row["current_phase"] == WAIT and row["status"] == "waiting")


@dataclass(frozen=True)
class Left:
    """How an advance left a workflow that is still runnable: its row's ``version``
    and the local forge's marker read before the advance began. ``watched``: it
    waits for people on the local forge, due again only when either changes;
    else when it is due is the store's (``workflows.due_at``)."""

    version: int
    forge: tuple[int, int] | None
    watched: bool
