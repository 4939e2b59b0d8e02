"""The store under faults, on a real SQLite file: another connection holding the
write lock, a full database (``max_page_count``), a fence taken over; and the
pragmas that make it durable (issue 9, items 4, 7 and 11)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from phasegate.contract import EventWrite, MilestoneWrite, PhaseResult
from phasegate.store import Fence, FenceLost, Store, StoreUnavailable, open_store
from phasegate.testing import FixedClock

BUSY_S = 0.2


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
def store(db_path: Path, clock: FixedClock) -> Iterator[Store]:
    s = open_store(f"sqlite:///{db_path}", clock, busy_timeout_s=BUSY_S)
    yield s
    s.close()


def new_workflow(store: Store) -> str:
    return store.create_workflow(
        title="t",
        ticket="x",
        repo_path="/r",
        base_branch="main",
        auto_merge=False,
        content_language="en",
    )


@contextmanager
def write_lock_held(db_path: Path) -> Iterator[sqlite3.Connection]:
    """Another connection in ``BEGIN IMMEDIATE`` with a write made, held open."""
    other = sqlite3.connect(db_path, isolation_level=None, timeout=5)
    other.execute("BEGIN IMMEDIATE")
    other.execute("UPDATE workflows SET title = title")
    try:
        yield other
    finally:
        other.execute("ROLLBACK")
        other.close()


def limit_pages(store: Store) -> None:
    """Make the database full for every connection of ``store``: a real SQLITE_FULL."""
    with store.reading() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
    store.engine.dispose()
    sa.event.listen(store.engine, "connect", _limit(int(pages)))


def _limit(pages: int):  # noqa: ANN202 - a connect listener
    def on_connect(dbapi_conn, _record) -> None:  # noqa: ANN001
        dbapi_conn.execute(f"PRAGMA max_page_count={pages}")

    return on_connect


# -- durable and lock-light (item 11) --------------------------------------------------


def test_the_store_runs_with_synchronous_full_and_the_busy_timeout_it_was_given(
    store: Store,
) -> None:
    with store.reading() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == BUSY_S * 1000


def test_the_busy_timeout_can_come_from_the_store_url(db_path: Path) -> None:
    store = open_store(f"sqlite:///{db_path}?busy_timeout=0.5")
    try:
        with store.reading() as conn:
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 500
    finally:
        store.close()


def test_reads_go_on_while_another_connection_holds_the_write_lock(
    store: Store, db_path: Path
) -> None:
    wf = new_workflow(store)
    store.write_milestone(wf, "preparation", MilestoneWrite("issue_created", status="completed"))
    fence = store.claim(wf, "host:1:a", 60)
    assert fence is not None
    with write_lock_held(db_path):
        started = time.monotonic()
        ctx = store.load_context(wf)
        assert ctx.id == wf and [m.kind for m in ctx.milestones] == ["issue_created"]
        assert [w["id"] for w in store.list_workflows()] == [wf]
        assert store.runnable_workflow_ids(frozenset({"preparing"})) == [wf]
        assert store.events(wf)
        assert store.agent_runs(wf) == []
        assert store.usage_totals(wf).runs == 0
        assert store.count_agent_runs(wf, "build") == 0
        assert store.proposals(workflow_id=wf) == []
        assert store.gate_history() == []
        assert store.check_fence(wf, "host:1:a", fence) is True
        # Each read would have waited BUSY_S (then failed) had it asked for the write lock.
        assert time.monotonic() - started < BUSY_S
        with pytest.raises(StoreUnavailable, match=r"state\.db is unavailable: database is locked"):
            store.add_event(wf, EventWrite("note", {}))
    assert store.load_context(wf).version == ctx.version


# -- store faults (item 7) ---------------------------------------------------------------


def test_a_commit_while_the_store_is_locked_raises_store_unavailable_and_writes_nothing(
    store: Store, db_path: Path
) -> None:
    wf = new_workflow(store)
    ctx = store.load_context(wf)
    events = len(store.events(wf))
    result = PhaseResult(
        "completed",
        milestones=(MilestoneWrite("issue_created", status="completed"),),
        events=(EventWrite("note", {}),),
    )
    with write_lock_held(db_path), pytest.raises(StoreUnavailable, match="database is locked"):
        store.commit_phase_result(ctx, result)
    after = store.load_context(wf)
    assert (after.version, after.current_phase) == (ctx.version, "preparation")
    assert after.milestones == ()
    assert len(store.events(wf)) == events
    assert store.commit_phase_result(ctx, result)["current_phase"] == "planning"


def test_a_full_database_raises_store_unavailable_and_rolls_the_commit_back(store: Store) -> None:
    wf = new_workflow(store)
    ctx = store.load_context(wf)
    limit_pages(store)
    big = PhaseResult("completed", state={"blob": "x" * 200_000})
    with pytest.raises(StoreUnavailable, match="database or disk is full"):
        store.commit_phase_result(ctx, big)
    after = store.load_context(wf)
    assert (after.version, after.current_phase) == (ctx.version, "preparation")
    assert "blob" not in after.state


def test_an_unrelated_operational_error_is_not_taken_for_an_unavailable_store(
    store: Store,
) -> None:
    with pytest.raises(sa.exc.OperationalError, match="no such table"), store.reading() as conn:
        conn.exec_driver_sql("SELECT * FROM no_such_table")


# -- fencing (item 4) ----------------------------------------------------------------------


def test_a_commit_under_a_fence_another_claim_moved_on_writes_nothing(
    store: Store, clock: FixedClock
) -> None:
    wf = new_workflow(store)
    a = Fence(store, wf, "elsewhere:1:a", store.claim(wf, "elsewhere:1:a", 10) or 0)
    ctx = store.load_context(wf)
    a.check()  # still held
    clock.advance(11)  # a's lease expires unrenewed: b may take it
    with pytest.raises(FenceLost, match="taken over or expired"):
        a.check()
    b = Fence(store, wf, "elsewhere:2:b", store.claim(wf, "elsewhere:2:b", 10) or 0)
    assert b.value == a.value + 1

    with pytest.raises(FenceLost, match="not elsewhere:1:a"):
        store.commit_phase_result(ctx, PhaseResult("completed"), fence=a)
    assert a.lost.is_set()
    assert store.load_context(wf).version == ctx.version
    assert store.renew(wf, a.owner, a.value, 10) is False

    row = store.commit_phase_result(ctx, PhaseResult("completed"), fence=b)
    assert (row["current_phase"], row["version"]) == ("planning", ctx.version + 1)


def test_a_lost_fence_stays_lost_even_if_the_lease_is_free_again(store: Store) -> None:
    wf = new_workflow(store)
    fence = Fence(store, wf, "elsewhere:1:a", store.claim(wf, "elsewhere:1:a", 60) or 0)
    fence.lost.set()  # the heartbeat gave it up
    with pytest.raises(FenceLost):
        fence.check()
