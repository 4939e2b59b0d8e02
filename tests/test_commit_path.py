"""The commit path at the floor, on both databases: the row it
returns is the row stored (``UPDATE … RETURNING``), one commit's milestones and
events land in the order given, and a milestone written again in a later commit
is settled in place by the upsert (one statement, no read first)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from phasegate.core.contract import EventWrite, MilestoneWrite, PhaseResult
from phasegate.store import Store, open_store
from phasegate.testing import FixedClock

from conftest import new_workflow


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    s = open_store(store_url, FixedClock())
    yield s
    s.close()


def test_the_row_a_commit_returns_is_the_row_stored(store: Store) -> None:
    wf = new_workflow(store)
    ctx = store.load_context(wf)
    result = PhaseResult(
        "completed", updates={"branch_name": "phasegate/x"}, state={"plan": "1. do it"}
    )
    returned = store.commit_phase_result(ctx, result)
    assert returned == store.workflow_row(wf)
    assert (returned["current_phase"], returned["version"]) == ("planning", ctx.version + 1)
    assert returned["branch_name"] == "phasegate/x" and returned["state"]["plan"] == "1. do it"
    assert returned["updated_at"].tzinfo is not None


def test_one_commits_milestones_and_events_land_in_the_order_given(store: Store) -> None:
    wf = new_workflow(store)
    ctx = store.load_context(wf)
    before = len(store.events(wf))
    result = PhaseResult(
        "retry",
        milestones=(MilestoneWrite("first", round=1), MilestoneWrite("second", round=1)),
        events=(EventWrite("one", {"n": 1}), EventWrite("two", {"n": 2})),
    )
    store.commit_phase_result(ctx, result)
    assert [m.kind for m in store.milestones(wf)] == ["first", "second"]
    events = store.events(wf)[before:]
    assert [(e["type"], e["data"].get("kind") or e["data"].get("n")) for e in events] == [
        ("milestone_updated", "first"),
        ("milestone_updated", "second"),
        ("one", 1),
        ("two", 2),
    ]


def test_a_milestone_committed_again_is_settled_in_place(store: Store) -> None:
    wf = new_workflow(store)
    ctx = store.load_context(wf)
    running = MilestoneWrite("push", status="in_progress", round=1, summary="pushing")
    row = store.commit_phase_result(ctx, PhaseResult("retry", milestones=(running,)))
    first = store.milestones(wf)[0]
    ctx = store.load_context(wf)
    assert ctx.version == row["version"]
    done = MilestoneWrite("push", status="completed", round=1, summary="pushed", data={"sha": "a"})
    store.commit_phase_result(ctx, PhaseResult("retry", milestones=(done,)))
    (settled,) = store.milestones(wf)
    assert settled.id == first.id and settled.dedupe_key == first.dedupe_key
    assert (settled.status, settled.summary, settled.data) == ("completed", "pushed", {"sha": "a"})
