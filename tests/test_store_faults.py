"""The store under faults, on a real SQLite file: another connection holding the
write lock, a full database (``max_page_count``), a fence taken over; and the
pragmas that make it durable."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from phasegate.config.cartridge import load_cartridge
from phasegate.core import decisions
from phasegate.core.contract import RUNNABLE_STATUSES, EventWrite, MilestoneWrite, PhaseResult
from phasegate.runtime.engine import Engine
from phasegate.store import Fence, FenceLost, Store, StoreUnavailable, open_store
from phasegate.testing import FixedClock

from conftest import (
    HAPPY_ANSWERS,
    LOCKED,
    git,
    make_repo,
    new_workflow,
    on_sqlite,
    phasegate_cli,
    scripted_cartridge,
    writes_held,
)

BUSY_S = 0.2


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
def url(store_url: str) -> str:
    """The conformance suite's store: SQLite, then PostgreSQL (conftest)."""
    return store_url


@pytest.fixture
def store(url: str, clock: FixedClock) -> Iterator[Store]:
    s = open_store(url, clock, busy_timeout_s=BUSY_S)
    yield s
    s.close()


def sqlite_only(url: str, why: str) -> None:
    if not on_sqlite(url):
        pytest.skip(f"SQLite only: {why}")


def limit_pages(store: Store) -> None:
    """Make the database full for every connection of ``store``: a real SQLITE_FULL
    for any write that needs a page more (``store.limit`` is the listener)."""
    with store.reading() as conn:
        pages = conn.exec_driver_sql("PRAGMA page_count").scalar()
    store.engine.dispose()
    store.limit = _limit(int(pages))
    sa.event.listen(store.engine, "connect", store.limit)


def _limit(pages: int):  # noqa: ANN202 - a connect listener
    def on_connect(dbapi_conn, _record) -> None:  # noqa: ANN001
        dbapi_conn.execute(f"PRAGMA max_page_count={pages}")

    return on_connect


# -- durable and lock-light ------------------------------------------------------------


def test_the_store_runs_with_synchronous_full_and_the_busy_timeout_it_was_given(
    store: Store, url: str
) -> None:
    if not on_sqlite(url):
        with store.reading() as conn:  # the busy timeout is lock_timeout there
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == f"{BUSY_S * 1000:.0f}ms"
        return
    with store.reading() as conn:
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == BUSY_S * 1000


def test_the_busy_timeout_can_come_from_the_store_url(url: str) -> None:
    store = open_store(f"{url}{'&' if '?' in url else '?'}busy_timeout=0.5")
    try:
        with store.reading() as conn:
            if on_sqlite(url):
                assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 500
            else:
                assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "500ms"
    finally:
        store.close()


def test_reads_go_on_while_another_connection_holds_the_write_lock(store: Store, url: str) -> None:
    wf = new_workflow(store)
    store.write_milestone(wf, "preparation", MilestoneWrite("issue_created", status="completed"))
    fence = store.claim(wf, "host:1:a", 60)
    assert fence is not None
    with writes_held(url):
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
        # A read that asked for the write lock would have failed here with StoreUnavailable
        # after BUSY_S: that each returned is the proof (no clock: CI machines stall).
        assert store.check_fence(wf, "host:1:a", fence) is True
        with pytest.raises(StoreUnavailable, match=rf"is unavailable: ({LOCKED})"):
            store.add_event(wf, EventWrite("note", {}))
    assert store.load_context(wf).version == ctx.version


# -- store faults ------------------------------------------------------------------------


def test_a_commit_while_the_store_is_locked_raises_store_unavailable_and_writes_nothing(
    store: Store, url: str
) -> None:
    wf = new_workflow(store)
    ctx = store.load_context(wf)
    events = len(store.events(wf))
    result = PhaseResult(
        "completed",
        milestones=(MilestoneWrite("issue_created", status="completed"),),
        events=(EventWrite("note", {}),),
    )
    with writes_held(url), pytest.raises(StoreUnavailable, match=LOCKED):
        store.commit_phase_result(ctx, result)
    after = store.load_context(wf)
    assert (after.version, after.current_phase) == (ctx.version, "preparation")
    assert after.milestones == ()
    assert len(store.events(wf)) == events
    assert store.commit_phase_result(ctx, result)["current_phase"] == "planning"


def test_a_full_database_raises_store_unavailable_and_rolls_the_commit_back(
    store: Store, url: str
) -> None:
    sqlite_only(url, "max_page_count makes a real SQLITE_FULL; a server's disk is not ours to fill")
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
    # SQLite says it with an OperationalError, PostgreSQL with a ProgrammingError.
    with pytest.raises(sa.exc.DBAPIError, match="no_such_table"), store.reading() as conn:
        conn.exec_driver_sql("SELECT * FROM no_such_table")


# -- fencing -------------------------------------------------------------------------------


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


# -- the engine under store faults -----------------------------------------------------------

BIG_PLAN = "1. Write feature.txt\n" + "".join(f"   step detail {i}\n" for i in range(1500))


def _answers(plan: str) -> str:
    return HAPPY_ANSWERS.replace('text = "1. Write feature.txt"', f"text = {json.dumps(plan)}")


@pytest.fixture
def fault_repo(tmp_path: Path) -> Path:
    """The happy path with scripted agents; the plan is long (~30 kB), so the planning
    commit needs pages the database does not have yet."""
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(_answers(BIG_PLAN))
    (repo / "phasegate.toml").write_text(scripted_cartridge())
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


class FaultAtPlanningCommit(Store):
    """A Store that causes a real fault when the planning phase commits: ``fault``
    (a callable given this store) runs once, right before that commit's transaction."""

    fault: Callable[[Store], None] = staticmethod(lambda _store: None)
    seen: list[BaseException]

    def commit_phase_result(self, ctx, result, *, fence=None, due_in_s=None):  # noqa: ANN001, ANN201
        if ctx.current_phase == "planning" and not self.seen and result.outcome == "completed":
            self.before = self.load_context(ctx.id)
            self.fault(self)
            try:
                return super().commit_phase_result(ctx, result, fence=fence, due_in_s=due_in_s)
            except StoreUnavailable as exc:
                self.seen.append(exc)
                raise
        return super().commit_phase_result(ctx, result, fence=fence, due_in_s=due_in_s)


def _faulty_engine(repo: Path, fault: Callable[[Store], None], **kwargs: Any) -> Engine:
    cartridge = load_cartridge(repo)
    plain = open_store(cartridge.store_url(repo), busy_timeout_s=BUSY_S)
    store = FaultAtPlanningCommit(plain.engine, plain.clock, plain.dialect)
    store.fault, store.seen = fault, []
    return Engine(repo, cartridge, store, **kwargs)


def _hold_write_lock(seconds: float) -> Callable[[Store], None]:
    def fault(store: Store) -> None:
        other = sqlite3.connect(
            store.where, isolation_level=None, timeout=5, check_same_thread=False
        )
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE workflows SET title = title")
        store.lock_holder = threading.Timer(seconds, lambda: (other.rollback(), other.close()))
        store.lock_holder.start()

    return fault


def _advance_until_settled(engine: Engine, wf: str) -> dict[str, Any]:
    row = engine.store.workflow_row(wf)
    for _ in range(10):
        row = engine.advance(wf)
        if row["status"] not in RUNNABLE_STATUSES:
            break
    return row


def _assert_nothing_of_the_commit_written(store: FaultAtPlanningCommit, wf: str) -> None:
    after = store.load_context(wf)
    before = store.before
    assert (after.version, after.current_phase) == (before.version, "planning")
    assert after.milestones == before.milestones
    assert "plan" not in after.state
    assert not [m for m in after.milestones if m.status == "in_progress"]


def test_a_commit_locked_for_a_moment_is_retried_and_the_workflow_completes(
    fault_repo: Path,
) -> None:
    engine = _faulty_engine(fault_repo, _hold_write_lock(0.5), store_retry_delays_s=(0.3, 0.6, 1.2))
    wf = engine.start("Add the feature", "Write feature.txt")
    row = _advance_until_settled(engine, wf)
    store = engine.store
    assert [type(e) for e in store.seen] == [StoreUnavailable]  # the first try was locked
    assert row["status"] == "completed", row["error"]
    store.close()


def test_a_commit_locked_past_every_retry_leaves_the_workflow_as_committed_then_resumes(
    fault_repo: Path,
) -> None:
    engine = _faulty_engine(fault_repo, _hold_write_lock(3.0), store_retry_delays_s=(0.1, 0.1))
    store = engine.store
    wf = engine.start("Add the feature", "Write feature.txt")
    with pytest.raises(StoreUnavailable, match=r"state\.db is unavailable: database is locked"):
        engine.advance(wf)
    assert len(store.seen) == 1
    store.lock_holder.join()
    _assert_nothing_of_the_commit_written(store, wf)
    assert store.workflow_row(wf)["status"] == "planning"  # runnable: nothing to undo

    row = _advance_until_settled(engine, wf)
    assert row["status"] == "completed", row["error"]
    assert store.load_context(wf).state["plan"] == BIG_PLAN.strip()
    store.close()


def test_a_full_disk_at_a_phase_commit_writes_nothing_and_resume_continues(
    fault_repo: Path,
) -> None:
    engine = _faulty_engine(fault_repo, limit_pages, store_retry_delays_s=(0.05,))
    store = engine.store
    wf = engine.start("Add the feature", "Write feature.txt")
    try:
        row = engine.advance(wf)
    except StoreUnavailable as exc:  # even the pause did not fit
        assert "database or disk is full" in str(exc)
    else:  # the pause fitted: paused with the reason
        assert (row["status"], row["current_phase"]) == ("paused", "planning")
        assert "store unavailable: database or disk is full" in row["error"]
    assert [type(e) for e in store.seen] == [StoreUnavailable]
    assert "database or disk is full" in str(store.seen[0])
    after = store.load_context(wf)
    assert after.current_phase == "planning" and "plan" not in after.state
    assert after.milestones == store.before.milestones

    store.engine.dispose()  # space again: the connections open without the limit
    sa.event.remove(store.engine, "connect", store.limit)
    if store.workflow_row(wf)["status"] == "paused":
        engine.decide(wf, decisions.resume)
    row = _advance_until_settled(engine, wf)
    assert row["status"] == "completed", row["error"]
    assert store.load_context(wf).state["plan"] == BIG_PLAN.strip()
    store.close()


def test_the_cli_reads_while_the_store_is_locked_and_a_write_stops_with_one_line(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    db = repo / ".phasegate" / "state.db"
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(extra=f'[store]\nurl = "sqlite:///{db}?busy_timeout=0.3"\n')
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    open_store(f"sqlite:///{db}").close()  # the schema exists: opening it only reads

    with writes_held(f"sqlite:///{db}"):
        status = phasegate_cli("status", "--repo", str(repo), timeout=60)
        run = phasegate_cli("run", "Add feature.txt", "--repo", str(repo), timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    assert run.returncode == 1, run.stdout + run.stderr  # not bad input: try again later
    assert "Traceback" not in run.stderr
    said = " ".join(run.stderr.split())
    assert "state.db is unavailable: database is locked" in said
    store = open_store(f"sqlite:///{db}")
    assert store.list_workflows() == []  # nothing half-written
    store.close()


def test_a_file_that_is_not_a_store_is_named_in_one_line_and_nothing_runs(
    happy_repo: Path,
) -> None:
    store = happy_repo / ".phasegate" / "state.db"
    store.parent.mkdir(exist_ok=True)
    store.write_bytes(b"not a database, whatever it was " * 200)
    with pytest.raises(StoreUnavailable, match="file is not a database"):
        open_store(f"sqlite:///{store}")
    for args in (["status"], ["run", "the ticket"]):
        proc = phasegate_cli(*args, "--repo", str(happy_repo))
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        assert f"the store {store} is unavailable: file is not a database" in proc.stderr
    assert store.read_bytes().startswith(b"not a database")  # left as it was
