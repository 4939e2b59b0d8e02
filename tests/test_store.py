"""The store's conformance suite, on a real SQLite file and a real PostgreSQL server
(the ``store_url`` fixture): migrations, usage, dedupe keys, leases, journal; SQLite's
pragmas on SQLite only."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from phasegate.core.contract import MilestoneView, MilestoneWrite, WorkflowNotFound
from phasegate.forge import ForgeError
from phasegate.git.workspace import Workspace
from phasegate.journal import SideEffects
from phasegate.store import HEAD_REVISION, AgentRunRecord, Store, open_store
from phasegate.store import tables as t
from phasegate.store.store import make_dialect
from phasegate.store.tables import metadata
from phasegate.testing import FixedClock, InMemoryForge

from conftest import new_workflow, on_sqlite

HOST = os.uname().nodename


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
def db_url(store_url: str) -> str:
    return store_url


@pytest.fixture
def store(db_url: str, clock: FixedClock) -> Store:
    s = open_store(db_url, clock)
    yield s
    s.close()


# -- migrations ------------------------------------------------------------------------


def _same_server_default(
    _ctx: Any,
    _inspected: Any,
    _meta: Any,
    inspected: str | None,
    _default: Any,
    rendered: str | None,
) -> bool:
    # SQLite reflects DEFAULT '' as "('')" and DEFAULT '0' as "'0'"; alembic's own
    # comparison reports the empty-string default as changed although the DDL is
    # identical; PostgreSQL reflects DEFAULT '0' on a float as "'0'::double precision"
    # and false as "false". Compare the bare values instead; any real difference shows.
    def bare(value: str | None) -> str | None:
        if value is None:
            return None
        value = value.split("::")[0].strip("()'\"")
        return {"false": "0", "true": "1"}.get(value.lower(), value)

    return bare(inspected) != bare(rendered)


def schema_diffs(store: Store, target: sa.MetaData) -> list[Any]:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"compare_type": True, "compare_server_default": _same_server_default}
        )
        return compare_metadata(context, target)


def _revision(store: Store) -> str | None:
    with store.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def test_every_migration_in_turn_ends_at_the_tables_module(db_url: str, clock: FixedClock) -> None:
    # A new store is made from the tables module at once (open_store); this is the
    # proof that the migrations an older store goes through end at the same schema.
    dialect = make_dialect(db_url)
    migrated = Store(dialect.engine(), clock, dialect)
    try:
        migrated.migrate(HEAD_REVISION)  # a revision named: Alembic's steps, one by one
        assert schema_diffs(migrated, metadata) == []
        assert set(sa.inspect(migrated.engine).get_table_names()) == {
            *metadata.tables,
            "alembic_version",
        }
        assert _revision(migrated) == HEAD_REVISION == "0014"
    finally:
        migrated.close()


def test_a_new_store_is_made_at_the_newest_revision_as_alembic_records_it(
    db_url: str, clock: FixedClock
) -> None:
    store = open_store(db_url, clock)
    try:
        assert schema_diffs(store, metadata) == []
        assert set(sa.inspect(store.engine).get_table_names()) == {
            *metadata.tables,
            "alembic_version",
        }
        assert _revision(store) == HEAD_REVISION
        # Alembic itself finds it at head: a later version's migrations start from here.
        store.migrate(HEAD_REVISION)
        assert _revision(store) == HEAD_REVISION
        assert schema_diffs(store, metadata) == []
    finally:
        store.close()


def test_stores_opened_at_once_on_a_new_database_make_it_once(
    db_url: str, clock: FixedClock
) -> None:
    # Workers starting together: one makes the tables, the others wait and find them.
    opened: list[Store] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def open_one() -> None:
        start.wait()
        try:
            opened.append(open_store(db_url, clock))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == [] and len(opened) == 6
        with opened[0].engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT version_num FROM alembic_version").all()
        assert rows == [(HEAD_REVISION,)]
        assert schema_diffs(opened[-1], metadata) == []
    finally:
        for store in opened:
            store.close()


def test_the_schema_comparison_does_see_a_difference(store: Store) -> None:
    # The comparison above must be able to fail: a column the migrations lack is reported.
    changed = sa.MetaData()
    for table in metadata.tables.values():
        table.to_metadata(changed)
    changed.tables["workflows"].append_column(sa.Column("urgency", sa.Integer))
    diffs = schema_diffs(store, changed)
    assert [d[0] for d in diffs] == ["add_column"]
    assert diffs[0][3].name == "urgency"


def test_reopening_migrates_nothing_and_keeps_data(db_url: str, clock: FixedClock) -> None:
    first = open_store(db_url, clock)
    wf = new_workflow(first)
    first.close()
    again = open_store(db_url, clock)
    try:
        assert again.workflow_row(wf)["title"] == "t"
        assert schema_diffs(again, metadata) == []
    finally:
        again.close()


# -- SQLite settings ---------------------------------------------------------------------


def test_sqlite_pragmas(store: Store, db_url: str) -> None:
    if not on_sqlite(db_url):
        pytest.skip("PRAGMAs are SQLite's: WAL, its busy timeout, foreign keys switched on")
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() > 0
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_foreign_keys_are_enforced(store: Store, clock: FixedClock) -> None:
    with pytest.raises(sa.exc.IntegrityError), store.transaction() as conn:
        conn.execute(
            t.events.insert().values(workflow_id="nope", type="x", data={}, created_at=clock.now())
        )


# -- agent runs ----------------------------------------------------------------------------


def run_record(workflow_id: str, **overrides: Any) -> AgentRunRecord:
    values: dict[str, Any] = {
        "workflow_id": workflow_id,
        "phase": "development",
        "role": "build",
        "session_line": "main",
        "runner": "scripted",
        "round": 1,
        "attempt": 1,
        "outcome": "ok",
    }
    return AgentRunRecord(**{**values, **overrides})


def test_agent_runs_are_summed_never_overwritten(store: Store) -> None:
    wf, other = new_workflow(store), new_workflow(store)
    # Same workflow, role, round and attempt: a retry is a new row, not an update.
    store.record_agent_run(run_record(wf, input_tokens=60, output_tokens=40, cost_usd=0.25))
    store.record_agent_run(
        run_record(wf, input_tokens=30, output_tokens=70, cost_usd=0.5, outcome="garbage")
    )
    store.record_agent_run(run_record(other, input_tokens=1000, output_tokens=1000, cost_usd=9))

    runs = store.agent_runs(wf)
    assert [(r["input_tokens"], r["output_tokens"], r["outcome"]) for r in runs] == [
        (60, 40, "ok"),
        (30, 70, "garbage"),
    ]
    totals = store.usage_totals(wf)
    assert (totals.input_tokens, totals.output_tokens, totals.tokens, totals.runs) == (
        90,
        110,
        200,
        2,
    )
    assert totals.cost_usd == pytest.approx(0.75)
    assert store.count_agent_runs(wf, "build") == 2
    assert store.count_agent_runs(wf, "review") == 0
    assert store.usage_totals(new_workflow(store)).runs == 0


# -- the dedupe key ---------------------------------------------------------------------


def test_a_session_line_binds_one_provider_session_and_a_rebind_replaces_it(
    store: Store, clock: FixedClock
) -> None:
    wf = new_workflow(store)
    assert store.provider_session(wf, "build") is None
    store.bind_provider_session(wf, "build", "claude", "s-1")
    created = clock.now()
    clock.advance(5)
    store.bind_provider_session(wf, "build", "codex", "s-2")
    store.bind_provider_session(wf, "review", "claude", "s-3")
    assert store.provider_session(wf, "build") == "s-2"
    assert store.provider_session(wf, "review") == "s-3"
    with store.reading() as conn:
        rows = conn.execute(
            sa.select(t.provider_sessions).where(t.provider_sessions.c.session_line == "build")
        ).all()
    assert len(rows) == 1 and rows[0].runner == "codex"
    assert (rows[0].created_at.replace(tzinfo=None), rows[0].updated_at.replace(tzinfo=None)) == (
        created.replace(tzinfo=None),
        clock.now().replace(tzinfo=None),
    )


def test_a_milestone_is_upserted_on_its_dedupe_key(store: Store) -> None:
    wf = new_workflow(store)
    running = MilestoneWrite("tests_run", status="in_progress", round=1, attempt=1)
    first = store.write_milestone(wf, "development", running)
    settled = store.write_milestone(
        wf, "development", MilestoneWrite("tests_run", status="failed", round=1, attempt=1)
    )
    assert settled.id == first.id
    assert settled.dedupe_key == f"{wf}:development:tests_run:r1:a1"
    assert settled.status == "failed"
    # Another attempt or round is another row.
    store.write_milestone(wf, "development", MilestoneWrite("tests_run", round=1, attempt=2))
    store.write_milestone(wf, "development", MilestoneWrite("tests_run", round=2, attempt=1))
    assert len(store.milestones(wf)) == 3


def test_the_dedupe_key_is_unique_in_the_schema(store: Store, clock: FixedClock) -> None:
    wf = new_workflow(store)
    row = store.write_milestone(wf, "planning", MilestoneWrite("plan_created", round=1))
    with pytest.raises(sa.exc.IntegrityError), store.transaction() as conn:
        conn.execute(
            t.milestones.insert().values(
                workflow_id=wf,
                kind="plan_created",
                phase="planning",
                round=1,
                attempt=0,
                status="completed",
                dedupe_key=row.dedupe_key,
                summary="",
                data={},
                created_at=clock.now(),
                updated_at=clock.now(),
            )
        )
    assert len(store.milestones(wf)) == 1


# -- leases ----------------------------------------------------------------------------------


def test_lease_claim_renew_release(store: Store, clock: FixedClock) -> None:
    wf = new_workflow(store)
    a, b = f"{HOST}:{os.getpid()}:a", f"{HOST}:{os.getpid()}:b"  # both alive: this process

    assert store.claim(wf, a, 60) == 1
    assert store.claim(wf, b, 60) is None
    assert store.claim(wf, a, 60) == 2  # the holder may claim again; the fence moves on

    assert store.renew(wf, a, 2, 60) is True
    assert store.renew(wf, a, 1, 60) is False  # a stale fence
    assert store.renew(wf, b, 2, 60) is False  # not the holder
    assert store.workflow_row(wf)["lease_expires_at"] == clock.now() + timedelta(seconds=60)

    store.release(wf, b)  # only the holder releases
    assert store.claim(wf, b, 60) is None
    store.release(wf, a)
    assert store.workflow_row(wf)["lease_owner"] is None
    assert store.claim(wf, b, 60) == 3


def test_an_expired_lease_can_be_claimed(store: Store, clock: FixedClock) -> None:
    wf = new_workflow(store)
    alive = f"{HOST}:{os.getpid()}:a"
    assert store.claim(wf, alive, 10) == 1
    clock.advance(9)
    assert store.claim(wf, "elsewhere:1:b", 10) is None
    assert store.renew(wf, alive, 1, 10) is True  # renewed at t=9: now until t=19
    clock.advance(9)
    assert store.claim(wf, "elsewhere:1:b", 10) is None
    clock.advance(2)
    assert store.claim(wf, "elsewhere:1:b", 10) == 2
    assert store.renew(wf, alive, 1, 10) is False


def test_claim_free_takes_free_leases_oldest_first_and_leaves_held_ones(
    store: Store, clock: FixedClock
) -> None:
    workflows = []
    for _ in range(4):
        workflows.append(new_workflow(store))
        clock.advance(1)  # created one after the other: the order claims follow
    held = workflows[0]
    assert store.claim(held, "elsewhere:1:a", 10) == 1

    assert store.claim_free(workflows, "elsewhere:2:b", 60, limit=2) == {
        workflows[1]: 1,
        workflows[2]: 1,
    }
    assert store.claim_free(workflows, "elsewhere:3:c", 60, limit=5) == {workflows[3]: 1}
    assert store.claim_free(workflows, "elsewhere:3:c", 60) == {}  # its own is not free to it
    clock.advance(11)  # a's lease expired unrenewed
    assert store.claim_free(workflows, "elsewhere:4:d", 60) == {held: 2}
    assert store.workflow_row(held)["lease_owner"] == "elsewhere:4:d"
    assert store.renew(held, "elsewhere:1:a", 1, 10) is False  # a's fence is stale


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_lease_held_by_a_dead_process_on_this_host_can_be_claimed(store: Store) -> None:
    wf = new_workflow(store)
    dead = _dead_pid()
    assert store.claim(wf, f"{HOST}:{dead}:gone", 3600) == 1
    assert store.claim(wf, f"{HOST}:{os.getpid()}:next", 60) == 2

    # A holder on another host cannot be checked: it keeps the lease until it expires.
    other = new_workflow(store)
    assert store.claim(other, f"not-{HOST}:{dead}:remote", 3600) == 1
    assert store.claim(other, f"{HOST}:{os.getpid()}:next", 60) is None


def test_claiming_an_unknown_workflow_is_an_error(store: Store) -> None:
    with pytest.raises(WorkflowNotFound, match="nope"):
        store.claim("nope", "x", 60)


# -- the side-effect journal -------------------------------------------------------------


class Killed(BaseException):
    """The process dying mid-effect: not an Exception, so the journal cannot settle the row."""


class DyingForge:
    """Wraps a forge; ``method`` kills the 'process' before or after doing its work.

    ``error`` may instead be an Exception, e.g. a ForgeError for a call that
    timed out on our side after the forge did it.
    """

    def __init__(
        self,
        inner: CountingForge,
        method: str,
        *,
        after: bool,
        error: BaseException | None = None,
    ) -> None:
        self.inner, self.method, self.after = inner, method, after
        self.error = error or Killed(method)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name != self.method:
            return attr

        def dying(*args: Any, **kwargs: Any) -> Any:
            if self.after:
                attr(*args, **kwargs)
            raise self.error

        return dying


class UntouchableForge:
    """Any forge call at all is a test failure."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"forge.{name} was called")


class CountingForge(InMemoryForge):
    """InMemoryForge that counts merges (its merge may be called again without a trace)."""

    def __init__(self) -> None:
        super().__init__()
        self.merges = 0

    def merge_pull_request(self, number: int, message: str, head: str | None = None) -> str:
        self.merges += 1
        return super().merge_pull_request(number, message, head)


# (forge method, the journaled call, how many of its effects the forge holds)
EFFECTS: dict[str, tuple[str, Callable[[SideEffects], Any], Callable[[CountingForge], int]]] = {
    "issue": (
        "create_issue",
        lambda e: e.create_issue("preparation", "title", "body"),
        lambda f: len(f.issues),
    ),
    "comment": (
        "comment",
        lambda e: e.comment("report", 1, "the report", "report:d1"),
        lambda f: len(f.posted),
    ),
    "pull_request": (
        "create_pull_request",
        lambda e: e.open_pull_request("pr_review", "topic", "main", "t", "b"),
        lambda f: len(f.prs),
    ),
    "merge": (
        "merge_pull_request",
        lambda e: e.merge("merge", 1, "merge #1"),
        lambda f: f.merges,
    ),
}


@pytest.fixture
def forge() -> CountingForge:
    f = CountingForge()
    f.create_pull_request("feature", "main", "t", "b")  # #1, for the merge effect
    return f


def effects_for(store: Store, forge: Any, wf: str, tmp_path: Path) -> SideEffects:
    return SideEffects(store, forge, Workspace(), wf, tmp_path)


def count_of(name: str, forge: CountingForge) -> int:
    counted = EFFECTS[name][2](forge)
    return counted - 1 if name == "pull_request" else counted  # minus the fixture's PR


def journal_rows(store: Store, wf: str) -> list[MilestoneView]:
    return store.milestones(wf)


@pytest.mark.parametrize("name", EFFECTS)
def test_a_completed_effect_is_not_repeated(
    name: str, store: Store, forge: CountingForge, tmp_path: Path
) -> None:
    wf = new_workflow(store)
    _, call, _ = EFFECTS[name]
    first = call(effects_for(store, forge, wf, tmp_path))
    assert count_of(name, forge) == 1
    # With the milestone completed the forge is not even asked.
    again = call(effects_for(store, UntouchableForge(), wf, tmp_path))
    assert again == first
    assert count_of(name, forge) == 1
    rows = journal_rows(store, wf)
    assert len(rows) == 1 and rows[0].status == "completed"


@pytest.mark.parametrize("name", EFFECTS)
def test_reconcile_settles_an_effect_that_happened(
    name: str, store: Store, forge: CountingForge, tmp_path: Path
) -> None:
    wf = new_workflow(store)
    method, call, _ = EFFECTS[name]
    with pytest.raises(Killed):
        call(effects_for(store, DyingForge(forge, method, after=True), wf, tmp_path))
    (row,) = journal_rows(store, wf)
    assert row.status == "in_progress"
    assert count_of(name, forge) == 1

    effects = effects_for(store, forge, wf, tmp_path)
    assert effects.reconcile() == [f"{row.kind}: found, settled completed"]
    (settled,) = journal_rows(store, wf)
    assert (settled.id, settled.status) == (row.id, "completed")
    assert settled.data["result"]

    result = call(effects)
    assert count_of(name, forge) == 1
    if name != "comment":  # comment() returns whether it was posted
        assert {str(v) for v in settled.data["result"].values()} == {str(result)}
    assert effects.reconcile() == []


@pytest.mark.parametrize("name", EFFECTS)
def test_reconcile_cancels_an_absent_effect_and_the_next_call_repeats_it(
    name: str, store: Store, forge: CountingForge, tmp_path: Path
) -> None:
    wf = new_workflow(store)
    method, call, _ = EFFECTS[name]
    with pytest.raises(Killed):
        call(effects_for(store, DyingForge(forge, method, after=False), wf, tmp_path))
    (row,) = journal_rows(store, wf)
    assert row.status == "in_progress"
    assert count_of(name, forge) == 0

    effects = effects_for(store, forge, wf, tmp_path)
    assert effects.reconcile() == [f"{row.kind}: not found, will be repeated"]
    (cancelled,) = journal_rows(store, wf)
    assert (cancelled.id, cancelled.status) == (row.id, "cancelled")

    call(effects)
    assert count_of(name, forge) == 1
    (repeated,) = journal_rows(store, wf)  # the same key: settled in place, not a new row
    assert (repeated.id, repeated.dedupe_key, repeated.status) == (
        row.id,
        row.dedupe_key,
        "completed",
    )


@pytest.mark.parametrize("name", EFFECTS)
def test_an_effect_that_errored_after_it_happened_is_not_repeated(
    name: str, store: Store, forge: CountingForge, tmp_path: Path
) -> None:
    # A forge call that times out on our side may still have been done by the forge:
    # the journal row is failed, and the next call must find the effect, not redo it.
    wf = new_workflow(store)
    method, call, _ = EFFECTS[name]
    late = DyingForge(forge, method, after=True, error=ForgeError(f"{method}: timed out"))
    with pytest.raises(ForgeError, match="timed out"):
        call(effects_for(store, late, wf, tmp_path))
    (row,) = journal_rows(store, wf)
    assert row.status == "failed"

    call(effects_for(store, forge, wf, tmp_path))
    assert count_of(name, forge) == 1
    (settled,) = journal_rows(store, wf)
    assert (settled.id, settled.status) == (row.id, "completed")
