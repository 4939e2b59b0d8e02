"""Forge outages: a workflow paused on an unavailable forge is resumed by the worker
after a backoff, a bounded number of times, and every retry of a forge call is
an event of the workflow that made it (docs/github.md: faults).

A phase that meets ``ForgeUnavailable`` pauses with reason ``forge_unavailable``
(``runtime.faults``). ``scheduled`` (called by ``Engine.commit``) makes that
pause due again in the store (``workflows.due_at``, as a wait's next look is):
after ``forge.auto_resume_s`` seconds, doubled for each automatic resume in a
row, ``MAX_WAIT_S`` at most, while fewer than ``forge.max_auto_resumes`` were
made; past that the pause is a person's, its reason says so, and it has no due
time. The worker finds the pauses whose time has come (``Store.due_pauses``)
and, on a thread of each, ``resume`` resumes one through the single commit path,
under the workflow's lease, with a ``forge_auto_resume`` event; a foreground
run (``phasegate run``) waits for its own workflow's (``resume_in_s``). A pause
for anything else (a person's decision, an agent's failure, a token to fix)
never has a due time, so it is never resumed here.

``recording`` writes each wait before another try of a forge call
(``phasegate.forge.retries``) as a ``forge_retry`` event of the workflow whose
thread made the call, outside any phase commit, as the agents' output is.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from phasegate.config.forge import ForgeSettings
from phasegate.core.contract import (
    PHASE_STATUS_MAP,
    ContractViolation,
    EventWrite,
    PhasegateError,
    PhaseResult,
    WorkflowContext,
)
from phasegate.forge.retries import ForgeRetry, watching
from phasegate.runtime.faults import FORGE_PAUSE
from phasegate.store import Store, StoreUnavailable

__all__ = [
    "AUTO_RESUME",
    "FORGE_PAUSE",
    "FORGE_RETRY",
    "Decision",
    "MAX_WAIT_S",
    "auto_resume",
    "labelled_status",
    "recording",
    "resume",
    "resume_in_s",
    "resume_wait_s",
    "scheduled",
]

log = logging.getLogger(__name__)

#: The event of one retry of a forge call: ``{call, status, wait_s, attempt, why}``.
FORGE_RETRY = "forge_retry"
#: The event of the worker's resume of a forge pause: ``{attempt, of, reason}``.
AUTO_RESUME = "forge_auto_resume"
#: The longest wait before an automatic resume (seconds), unless ``forge.auto_resume_s``
#: itself is longer.
MAX_WAIT_S = 600.0

#: A decision to commit under the workflow's lease (``Engine.decide``'s argument).
Decision = Callable[[WorkflowContext], PhaseResult]
Decide = Callable[[str, Decision], Any]
EventCallback = Callable[[str, str, Mapping[str, Any]], None]


def resume_wait_s(settings: ForgeSettings, spent: int) -> float:
    """Seconds before the automatic resume that follows ``spent`` others in a row."""
    first = settings.auto_resume_s
    return float(min(first * 2**spent, max(first, MAX_WAIT_S)))


def _forge_pause(result: PhaseResult) -> bool:
    return result.outcome == "pause" and (result.reason or "").startswith(FORGE_PAUSE)


def scheduled(
    settings: ForgeSettings, ctx: WorkflowContext, result: PhaseResult, due_in_s: float
) -> tuple[PhaseResult, float]:
    """The result to commit for ``ctx`` and the seconds until the workflow is due
    again (``due_in_s`` unless a forge pause changes it; 0: at once).

    A forge pause gets its automatic resume's wait (no shorter than the wait the
    forge asked for: ``forge_retry_after_s``), and its reason says when and
    which one of how many it is; one past ``forge.max_auto_resumes`` gets a
    reason that asks a person to resume it, and no due time. Any other result
    sets the count of automatic resumes in a row back to 0 (the forge answered
    in between), except the automatic resume itself, which counts one more.
    """
    spent = int(ctx.state.get("forge_resumes") or 0)
    if not _forge_pause(result):
        if spent and "forge_resumes" not in result.state:
            result = dataclasses.replace(result, state={**result.state, "forge_resumes": 0})
        return result, due_in_s
    bound = settings.max_auto_resumes
    if spent >= bound:
        tried = f"; still unavailable after {bound} automatic resumes" if bound else ""
        said = f"{tried}; a person resumes it (`phasegate resume {ctx.id}`) once the forge answers"
        return dataclasses.replace(result, reason=f"{result.reason}{said}"), 0.0
    wait = max(resume_wait_s(settings, spent), float(result.state.get("forge_retry_after_s") or 0))
    said = f"; resumed by itself in {wait:g} s (automatic resume {spent + 1} of {bound})"
    return dataclasses.replace(result, reason=f"{result.reason}{said}"), wait


def auto_resume(settings: ForgeSettings, version: int) -> Decision:
    """The worker's resume of a forge pause found due at ``version``: the phase runs
    again (its own retry counters kept: a person's resume grants new ones), one
    more automatic resume is counted, and an ``AUTO_RESUME`` event says so.
    Raises ContractViolation when the workflow moved on since (a person resumed
    it, or it paused again and is not due yet)."""

    def decide(ctx: WorkflowContext) -> PhaseResult:
        if ctx.version != version or not (ctx.error or "").startswith(FORGE_PAUSE):
            raise ContractViolation(f"workflow {ctx.id} changed since its pause was due")
        spent = int(ctx.state.get("forge_resumes") or 0) + 1
        data = {"attempt": spent, "of": settings.max_auto_resumes, "reason": ctx.error}
        return PhaseResult(
            "retry",
            status=PHASE_STATUS_MAP[ctx.current_phase],
            state={"forge_resumes": spent},
            events=(EventWrite(AUTO_RESUME, data),),
        )

    return decide


def resume(decide: Decide, settings: ForgeSettings, workflow_id: str, version: int) -> bool:
    """Resume the forge pause of ``workflow_id`` found due at ``version`` (``decide(id,
    auto_resume(...))``: ``Engine.decide``); True when it was. One that another
    process holds, or that moved on meanwhile, is left as it is (logged): False.
    Raises StoreUnavailable."""
    try:
        decide(workflow_id, auto_resume(settings, version))
    except StoreUnavailable:
        raise
    except PhasegateError as exc:  # LeaseHeld, a person's decision came first
        log.info("%s not resumed after its forge_unavailable pause: %s", workflow_id, exc)
        return False
    log.warning("%s: resumed after its forge_unavailable pause", workflow_id)
    return True


def resume_in_s(store: Store, row: Mapping[str, Any]) -> float | None:
    """Seconds until the automatic resume of the workflow ``row`` (0: due now), or
    None when it is no forge pause with a due time (``scheduled``)."""
    due = row.get("due_at")
    if row["status"] != "paused" or due is None:
        return None
    if not str(row.get("error") or "").startswith(FORGE_PAUSE):
        return None
    return max(0.0, float((due - store.clock.now()).total_seconds()))


def labelled_status(row: Mapping[str, Any]) -> str:
    """The status the issue's label shows for the workflow ``row``: its phase's while
    it is a forge pause that is resumed by itself (no person's turn yet, as on the
    board), else its own."""
    if row["status"] == "paused" and row.get("due_at") is not None:
        return str(PHASE_STATUS_MAP.get(row["current_phase"], row["status"]))
    return str(row["status"])


def recording(
    store: Store, workflow_id: str, notify: EventCallback | None = None
) -> AbstractContextManager[None]:
    """Within the block, each retry of a forge call this thread makes is a
    ``FORGE_RETRY`` event of ``workflow_id``, also handed to ``notify(workflow_id,
    type, data)`` when given (the engine's ``on_event``: progress display)."""

    def seen(retry: ForgeRetry) -> None:
        data = retry.as_data()
        store.add_event(workflow_id, EventWrite(FORGE_RETRY, data))
        if notify is not None:
            notify(workflow_id, FORGE_RETRY, data)

    return watching(seen)
