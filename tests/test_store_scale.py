"""The store's reads for many workflows at once, its figures and its prune, the same
on SQLite and PostgreSQL (``store_url``: the conformance suite's two stores)."""

from __future__ import annotations

from datetime import timedelta

from phasegate.core.contract import NEEDS_YOU_STATUSES, RUNNABLE_STATUSES, EventWrite
from phasegate.store import AgentRunRecord, open_store
from phasegate.store import tables as t
from phasegate.store.figures import PhaseTally
from phasegate.store.prune import PRUNED_EVENT
from phasegate.testing import FixedClock

from conftest import new_workflow


def test_bulk_reads_figures_and_prune_agree_on_both_stores(store_url: str) -> None:
    clock = FixedClock()
    store = open_store(store_url, clock)
    try:
        done, failed, going = (new_workflow(store) for _ in range(3))
        for workflow_id, status in ((done, "completed"), (failed, "failed")):
            with store.transaction() as conn:
                conn.execute(
                    t.workflows.update()
                    .where(t.workflows.c.id == workflow_id)
                    .values(status=status, current_phase=status)
                )
        for workflow_id, model in ((done, "claude-opus-4-5"), (going, "")):
            store.add_event(workflow_id, EventWrite("agent_started", {"role": "build"}))
            for n in range(30):
                store.add_event(workflow_id, EventWrite("agent_output", {"text": f"{n}\n"}))
            store.add_event(workflow_id, EventWrite("forge_retry", {"status": 502}))
            store.record_agent_run(
                AgentRunRecord(
                    workflow_id, "development", "build", "build", "claude", 1, 0, "ok",
                    input_tokens=100, output_tokens=10, cost_usd=0.5, duration_s=42.0,
                    model=model,
                )
            )  # fmt: skip
        tally = PhaseTally()
        store.figures(clock.now(), RUNNABLE_STATUSES, NEEDS_YOU_STATUSES, tally)
        clock.advance(60)
        store.add_event(going, EventWrite("phase_change", {"phase": "planning"}))
        # A scraper's tally, brought up to date, sums what a fresh read sums.
        kept = store.figures(clock.now(), RUNNABLE_STATUSES, NEEDS_YOU_STATUSES, tally)
        assert kept.phase_seconds["preparation"] == (1, 60.0)

        rows, totals = store.board_rows(1)
        assert totals == {"done": 1, "failed": 1}
        assert sorted(r["id"] for r in rows) == sorted([done, failed, going])
        assert store.usage_by_workflow([done])[done].cost_usd == 0.5
        assert set(store.usage_by_workflow()) == {done, going}
        newest = store.newest_events(going, 3, without=("agent_output",))
        assert [e["type"] for e in newest] == ["agent_started", "forge_retry", "phase_change"]
        output = store.newest_events(going, 2, types=("agent_output",))
        assert [e["data"]["text"] for e in output] == ["28\n", "29\n"]

        figures = store.figures(clock.now(), RUNNABLE_STATUSES, NEEDS_YOU_STATUSES)
        assert figures.workflows[("completed", "completed")] == 1
        assert figures.queue_depth == 1  # `going`, in preparation; the others finished
        assert figures.forge_faults == {"forge_retry": 2}
        # Spend reads by role and model: the one the binding named, else "" (the runner's own).
        assert figures.usage == {
            ("build", "claude", "claude-opus-4-5"): (100, 10, 0.5),
            ("build", "claude", ""): (100, 10, 0.5),
        }
        assert figures.agent_seconds[("build", "claude")][1:] == (2, 84.0)
        assert figures.phase_seconds["preparation"] == (1, 60.0)

        pruned = store.prune(clock.now() + timedelta(seconds=1))
        assert pruned.workflows == [done]  # `failed` holds its trail alone: nothing to prune
        assert pruned.events == {"agent_output": 30, "agent_started": 1, "forge_retry": 1}
        assert [e["type"] for e in store.events(done)] == ["phase_change", PRUNED_EVENT]
        assert len(store.events(going)) == 34  # not finished: whole
        assert store.pruned_of(done)["event_count"] == 32  # type: ignore[index]
        after = store.figures(clock.now(), RUNNABLE_STATUSES, NEEDS_YOU_STATUSES)
        assert after.forge_faults == {"forge_retry": 2}
        assert store.prune(clock.now() + timedelta(seconds=1)).workflows == []
    finally:
        store.close()
