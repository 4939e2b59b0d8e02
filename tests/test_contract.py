"""Characterization of the transition table and the single commit path
(docs/contracts/lifecycle.md)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from phasegate.core.contract import (
    ACCEPTANCE_VERIFICATION,
    OUTCOMES,
    PHASE_ORDER,
    PHASE_STATUS_MAP,
    PSEUDO_PHASES,
    ContractViolation,
    MilestoneWrite,
    PhaseResult,
    StaleContext,
    next_phase,
)
from phasegate.store import Store, commit_phase_result, open_store
from phasegate.store import tables as t
from phasegate.testing import FixedClock

from conftest import new_workflow

ALL_PHASES = (*PHASE_ORDER, "wait")


@pytest.fixture
def store(store_url: str) -> Store:
    # The commit path's contract, on both databases (conftest's store_url).
    s = open_store(store_url, FixedClock())
    yield s
    s.close()


def workflow_in(store: Store, phase: str) -> str:
    """A workflow placed in ``phase`` by the commit path itself."""
    wf = new_workflow(store)
    if phase != "preparation":
        commit_phase_result(store, store.load_context(wf), PhaseResult.advance(phase))
    return wf


def test_phase_order_and_status_map_are_the_spec_table() -> None:
    assert PHASE_ORDER == (
        "preparation",
        "planning",
        "development",
        "pr_review",
        "report",
        "merge",
        "acceptance_verification",
    )
    assert PSEUDO_PHASES == ("wait", "completed")
    assert dict(PHASE_STATUS_MAP) == {
        "preparation": "preparing",
        "planning": "planning",
        "development": "developing",
        "pr_review": "pr_review",
        "report": "reporting",
        "wait": "waiting",
        "merge": "merging",
        "acceptance_verification": "verification_pending",
        "completed": "completed",
    }


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        ("preparation", "planning"),
        ("planning", "development"),
        ("development", "pr_review"),
        ("pr_review", "report"),
        ("report", "merge"),
        ("merge", "acceptance_verification"),
        ("acceptance_verification", "acceptance_verification"),
        ("no_such_phase", "planning"),
        ("", "planning"),
    ],
)
def test_next_phase(phase: str, expected: str) -> None:
    assert next_phase(phase) == expected


# (outcome) -> (phase after, status after, error after) for a result with no next_phase
EXPECTED_BY_OUTCOME = {
    "completed": lambda p: (next_phase(p), PHASE_STATUS_MAP[next_phase(p)], None),
    "failed": lambda p: (p, "failed", "why"),
    "pause": lambda p: (p, "paused", "why"),
    "retry": lambda p: (p, PHASE_STATUS_MAP[p], None),
    "wait": lambda p: (p, PHASE_STATUS_MAP[p], None),
}


@pytest.mark.parametrize("outcome", OUTCOMES)
@pytest.mark.parametrize("phase", ALL_PHASES)
def test_every_phase_by_every_outcome(store: Store, phase: str, outcome: str) -> None:
    wf = workflow_in(store, phase)
    ctx = store.load_context(wf)
    result = PhaseResult(
        outcome,
        reason="why",  # type: ignore[arg-type]
        milestones=(MilestoneWrite("probe", round=1, attempt=2),),
    )
    row = commit_phase_result(store, ctx, result)
    expected_phase, expected_status, expected_error = EXPECTED_BY_OUTCOME[outcome](phase)
    if phase == "wait" and outcome == "completed":  # wait is not in PHASE_ORDER
        expected_phase, expected_status = "planning", "planning"
    assert (row["current_phase"], row["status"], row["error"]) == (
        expected_phase,
        expected_status,
        expected_error,
    )
    assert row["version"] == ctx.version + 1
    probe = store.load_context(wf).milestone("probe")
    assert probe is not None and probe.phase == phase
    assert probe.dedupe_key == f"{wf}:{phase}:probe:r1:a2"


@pytest.mark.parametrize("target", [*PHASE_ORDER, *PSEUDO_PHASES])
def test_completed_moves_to_any_legal_next_phase(store: Store, target: str) -> None:
    wf = workflow_in(store, "report")
    row = commit_phase_result(store, store.load_context(wf), PhaseResult.advance(target))
    assert row["current_phase"] == target
    assert row["status"] == PHASE_STATUS_MAP[target]
    assert (row["completed_at"] is not None) == (target == "completed")


def _snapshot(store: Store, wf: str) -> tuple[object, ...]:
    with store.engine.connect() as conn:
        row = conn.execute(sa.select(t.workflows).where(t.workflows.c.id == wf)).one()
        counts = tuple(
            conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one()
            for table in (t.milestones, t.events)
        )
    return (tuple(row), counts)


@pytest.mark.parametrize("illegal", ["merged", "done", "PLANNING", "waiting", "verification"])
@pytest.mark.parametrize("phase", ALL_PHASES)
def test_illegal_next_phase_is_rejected_and_nothing_is_written(
    store: Store, phase: str, illegal: str
) -> None:
    wf = workflow_in(store, phase)
    before = _snapshot(store, wf)
    result = PhaseResult(
        "completed", next_phase=illegal, milestones=(MilestoneWrite("should_not_exist"),)
    )
    with pytest.raises(ContractViolation, match="illegal next_phase"):
        commit_phase_result(store, store.load_context(wf), result)
    assert _snapshot(store, wf) == before


@pytest.mark.parametrize("outcome", ["failed", "pause", "retry", "wait"])
def test_only_completed_may_name_a_next_phase(store: Store, outcome: str) -> None:
    wf = workflow_in(store, "development")
    before = _snapshot(store, wf)
    with pytest.raises(ContractViolation, match="only a completed outcome"):
        commit_phase_result(
            store, store.load_context(wf), PhaseResult(outcome, next_phase="pr_review")
        )  # type: ignore[arg-type]
    assert _snapshot(store, wf) == before


def test_updates_may_not_set_phase_or_status(store: Store) -> None:
    wf = workflow_in(store, "planning")
    before = _snapshot(store, wf)
    for column in ("current_phase", "status", "version"):
        with pytest.raises(ContractViolation, match="may not set"):
            commit_phase_result(
                store, store.load_context(wf), PhaseResult("retry", updates={column: "x"})
            )
    assert _snapshot(store, wf) == before


def test_unknown_outcome_is_refused() -> None:
    with pytest.raises(ContractViolation, match="unknown outcome"):
        PhaseResult("advanced")  # type: ignore[arg-type]


def test_stale_context_is_refused_and_nothing_is_written(store: Store) -> None:
    wf = workflow_in(store, "planning")
    stale = store.load_context(wf)
    commit_phase_result(store, stale, PhaseResult("retry", updates={"current_round": 1}))
    before = _snapshot(store, wf)
    with pytest.raises(StaleContext):
        commit_phase_result(store, stale, PhaseResult.advance("development"))
    assert _snapshot(store, wf) == before


def test_milestones_settle_in_place_on_their_dedupe_key(store: Store) -> None:
    wf = workflow_in(store, "acceptance_verification")
    write = MilestoneWrite("acceptance_verification", status="in_progress", attempt=1, key="k")
    commit_phase_result(store, store.load_context(wf), PhaseResult("retry", milestones=(write,)))
    settled = MilestoneWrite(
        "acceptance_verification",
        status="completed",
        attempt=1,
        key="k",
        data={"verdict": "confirmed"},
    )
    commit_phase_result(store, store.load_context(wf), PhaseResult("retry", milestones=(settled,)))
    rows = store.load_context(wf).milestones_of("acceptance_verification")
    assert [(m.status, m.data.get("verdict")) for m in rows] == [("completed", "confirmed")]
    # another attempt is another row
    other = MilestoneWrite("acceptance_verification", status="failed", attempt=2, key="k")
    commit_phase_result(store, store.load_context(wf), PhaseResult("retry", milestones=(other,)))
    assert len(store.load_context(wf).milestones_of("acceptance_verification")) == 2


def test_state_merges_and_events_are_written_with_the_commit(store: Store) -> None:
    wf = workflow_in(store, "report")
    commit_phase_result(store, store.load_context(wf), PhaseResult("retry", state={"a": 1}))
    commit_phase_result(store, store.load_context(wf), PhaseResult.advance("wait", state={"b": 2}))
    ctx = store.load_context(wf)
    assert ctx.state == {"a": 1, "b": 2}
    phases = [e["data"]["phase"] for e in store.events(wf) if e["type"] == "phase_change"]
    assert phases == ["preparation", "report", "wait"]


def test_acceptance_verification_is_terminal_in_the_table() -> None:
    assert next_phase(ACCEPTANCE_VERIFICATION) == ACCEPTANCE_VERIFICATION
