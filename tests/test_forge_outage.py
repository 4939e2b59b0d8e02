"""A forge pause's due time and its bound, without a forge (runtime/outage.py):
the backoff the commit path writes, the pauses the store lists as due (never a
person's; on SQLite and PostgreSQL), the count of automatic resumes and what
sets it back. Time moves by the store's FixedClock, never by sleeping."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from phasegate.cli.status_table import unheld_note
from phasegate.config.forge import ForgeSettings
from phasegate.core.contract import (
    RUNNABLE_STATUSES,
    ContractViolation,
    PhaseResult,
    WorkflowContext,
)
from phasegate.forge.base import ForgeUnavailable
from phasegate.journal import COMMENT_DROPPED
from phasegate.runtime.faults import FORGE_PAUSE, fault_result
from phasegate.runtime.outage import (
    AUTO_RESUME,
    FORGE_RETRY,
    auto_resume,
    resume,
    resume_wait_s,
    scheduled,
)
from phasegate.store import Store, open_store
from phasegate.summary import FORGE_FAULT_EVENTS
from phasegate.testing import FixedClock

from conftest import new_workflow

SETTINGS = ForgeSettings(kind="github", repository="octo/app", max_auto_resumes=3)
PAUSE = PhaseResult("pause", reason=f"{FORGE_PAUSE}planning: GitHub answered 502 to POST /x")


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
def store(store_url: str, clock: FixedClock) -> Iterator[Store]:
    s = open_store(store_url, clock)
    yield s
    s.close()


def context(spent: int = 0, **given: object) -> WorkflowContext:
    fields: dict[str, object] = {
        "id": "w1",
        "title": "t",
        "ticket": "x",
        "repo_path": "/r",
        "base_branch": "main",
        "current_phase": "planning",
        "status": "planning",
        "version": 4,
        "state": {"forge_resumes": spent},
        **given,
    }
    return WorkflowContext(**fields)  # type: ignore[arg-type]


def test_the_waits_double_from_auto_resume_s_up_to_ten_minutes() -> None:
    waits = [resume_wait_s(ForgeSettings(kind="github"), n) for n in range(7)]
    assert waits == [30.0, 60.0, 120.0, 240.0, 480.0, 600.0, 600.0]
    slow = ForgeSettings(kind="github", auto_resume_s=900.0)
    assert resume_wait_s(slow, 3) == 900.0  # a first wait past the cap is kept, not cut


def test_a_forge_pause_is_due_after_its_wait_until_the_bound_then_waits_for_a_person() -> None:
    result, due = scheduled(SETTINGS, context(1), PAUSE, 0.0)
    assert due == 60.0
    assert result.reason is not None and result.reason.startswith(PAUSE.reason or "")
    assert result.reason.endswith("resumed by itself in 60 s (automatic resume 2 of 3)")

    result, due = scheduled(SETTINGS, context(3), PAUSE, 0.0)
    assert due == 0.0
    assert result.reason is not None and result.reason.startswith(FORGE_PAUSE)
    assert "still unavailable after 3 automatic resumes" in result.reason
    assert "`phasegate resume w1`" in result.reason

    never = ForgeSettings(kind="github", max_auto_resumes=0)
    result, due = scheduled(never, context(0), PAUSE, 0.0)
    assert due == 0.0 and "automatic" not in (result.reason or "")


def test_a_rate_limit_longer_than_the_bound_resumes_no_sooner_than_the_forge_asked() -> None:
    asked = ForgeUnavailable("GitHub rate limit on PUT /merge", retry_after_s=999.0)
    paused = fault_result("merge", "w1", asked)
    assert paused.outcome == "pause" and paused.state == {"forge_retry_after_s": 999.0}
    result, due = scheduled(SETTINGS, context(0), paused, 0.0)
    assert due == 999.0 and (result.reason or "").endswith(
        "resumed by itself in 999 s (automatic resume 1 of 3)"
    )
    short = fault_result("merge", "w1", ForgeUnavailable("x", retry_after_s=5.0))
    assert scheduled(SETTINGS, context(1), short, 0.0)[1] == 60.0  # its own backoff is longer


def test_any_other_commit_sets_the_count_back_and_keeps_its_own_due_time() -> None:
    other = PhaseResult("pause", reason="plan rejected")  # a person's turn: never scheduled
    result, due = scheduled(SETTINGS, context(2), other, 0.0)
    assert (due, result.state) == (0.0, {"forge_resumes": 0})
    wait = PhaseResult("wait", state={"looked": 1})  # type: ignore[typeddict-unknown-key]
    result, due = scheduled(SETTINGS, context(2), wait, 30.0)
    assert due == 30.0 and result.state == {"looked": 1, "forge_resumes": 0}
    result, _ = scheduled(SETTINGS, context(0), other, 0.0)
    assert result is other  # nothing to set back: the result is left as it is


def test_the_workers_resume_counts_one_more_and_refuses_a_workflow_that_moved_on() -> None:
    paused = context(1, status="paused", error=PAUSE.reason)
    result = auto_resume(SETTINGS, 4)(paused)
    assert (result.outcome, result.status, result.state) == (
        "retry",
        "planning",
        {"forge_resumes": 2},
    )
    (event,) = result.events
    assert event.type == AUTO_RESUME and (event.data["attempt"], event.data["of"]) == (2, 3)
    # The result keeps its count: committing it does not set the count back.
    assert scheduled(SETTINGS, paused, result, 0.0) == (result, 0.0)
    with pytest.raises(ContractViolation):
        auto_resume(SETTINGS, 3)(paused)  # a person resumed it since it was listed
    with pytest.raises(ContractViolation):
        auto_resume(SETTINGS, 4)(context(1, status="paused", error="plan rejected"))


def test_the_store_lists_a_forge_pause_once_due_and_never_a_persons_pause(
    store: Store, clock: FixedClock
) -> None:
    forge = new_workflow(store)
    person = new_workflow(store)
    other = new_workflow(store)
    row = store.commit_phase_result(store.load_context(forge), PAUSE, due_in_s=30)
    store.commit_phase_result(store.load_context(person), PhaseResult("pause", reason="why"))
    # a due time on a pause of another reason is not one the worker acts on
    store.commit_phase_result(
        store.load_context(other), PhaseResult("pause", reason="why"), due_in_s=30
    )
    statuses = RUNNABLE_STATUSES | {"paused"}
    assert store.due_pauses(FORGE_PAUSE, clock.now()) == []
    assert store.next_due_at(statuses, clock.now()) == row["due_at"]  # the worker wakes then
    clock.advance(30)
    assert store.due_pauses(FORGE_PAUSE, clock.now()) == [(forge, row["version"])]
    needs_you = {w: store.events(w, types=("needs_you",)) for w in (forge, person)}
    assert needs_you[forge] == [] and len(needs_you[person]) == 1

    decided: list[str] = []

    def decide(workflow_id: str, decision: object) -> None:
        ctx = store.load_context(workflow_id)
        store.commit_phase_result(ctx, decision(ctx))  # type: ignore[operator]
        decided.append(workflow_id)

    assert resume(decide, SETTINGS, forge, row["version"]) is True
    assert decided == [forge] and store.workflow_row(forge)["status"] == "preparing"
    assert resume(decide, SETTINGS, forge, row["version"]) is False  # it moved on since
    assert store.due_pauses(FORGE_PAUSE, clock.now() + timedelta(days=1)) == []


def test_show_and_the_dashboard_name_every_forge_fault_event() -> None:
    assert set(FORGE_FAULT_EVENTS) == {FORGE_RETRY, AUTO_RESUME, COMMENT_DROPPED}


def test_status_names_a_forge_pause_no_worker_is_there_to_resume() -> None:
    paused = {"id": "w1", "status": "paused", "repo_path": ".", "resumes_at": "2026-01-01"}
    person = {"id": "w2", "status": "paused", "repo_path": ".", "resumes_at": None}
    note = unheld_note([paused, person])
    assert note is not None and note.startswith("w1 is not being advanced now")
    assert unheld_note([person]) is None  # a person's pause: theirs to resume
    assert unheld_note([{**paused, "worker": "host:1"}]) is None
