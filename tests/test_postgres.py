"""What only PostgreSQL can get wrong: many writers at READ
COMMITTED racing one read-then-write, a server stopped under a running store, the
LISTEN feed, and the CLI and a whole lifecycle on a ``postgresql://`` store.url.

The rest of the store's contract runs on both databases in the conformance suite
(test_store, test_store_faults, test_fencing, test_gate)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from test_gate import clean_run

from phasegate.core.contract import EventWrite, PhaseResult, ProposalDecided
from phasegate.store import Store, StoreUnavailable, open_store
from phasegate.store import tables as t
from phasegate.store.workflows import IssueTaken

from conftest import (
    HAPPY_ANSWERS,
    git,
    make_repo,
    new_workflow,
    phasegate_cli,
    scripted_cartridge,
)
from support.postgres import PostgresServer, fresh_schema

#: Threads racing in each test: more than the two cores, fewer than the server's connections.
RACERS = 8


@pytest.fixture
def stores(pg_url: str) -> Iterator[Callable[[], Store]]:
    """Open stores on this test's schema, each with its own engine (its own
    connections, as another worker process would have); all closed afterwards."""
    opened: list[Store] = []

    def one() -> Store:
        store = open_store(pg_url)
        opened.append(store)
        return store

    yield one
    for store in opened:
        store.close()


def race(racers: list[Callable[[], Any]]) -> list[Any]:
    """Run every callable in a thread of its own, all let go at one barrier; returns
    each one's result or the exception it raised, in order."""
    barrier = threading.Barrier(len(racers))
    results: list[Any] = [None] * len(racers)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = racers[i]()
        except Exception as exc:  # noqa: BLE001 - the race's outcome, judged by the test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(racers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def start_for_issue(store: Store) -> Callable[[], str]:
    return lambda: store.create_workflow(
        title="t",
        ticket="x",
        repo_path="/r",
        base_branch="main",
        auto_merge=False,
        content_language="en",
        issue=("octo/widgets", 7),
    )


# -- many writers, one read-then-write ------------------------------------------------------


def test_workers_racing_to_start_one_issue_start_one_workflow(
    stores: Callable[[], Store],
) -> None:
    racers = [stores() for _ in range(RACERS)]
    for _round in range(3):  # a fresh issue each round: the race is run more than once
        results = race([start_for_issue(s) for s in racers])
        started = [r for r in results if isinstance(r, str)]
        taken = [r for r in results if isinstance(r, IssueTaken)]
        assert len(started) == 1 and len(taken) == RACERS - 1, results
        assert {e.workflow_id for e in taken} == set(started)
        with racers[0].transaction() as conn:  # the next round's issue is free again
            conn.execute(t.workflows.update().values(issue_number=None))


def test_concurrent_claims_never_give_one_workflow_two_holders(
    stores: Callable[[], Store],
) -> None:
    racers = [stores() for _ in range(RACERS)]
    wf = new_workflow(racers[0])
    fences: set[int] = set()
    for _round in range(3):
        results = race(
            [lambda s=s, i=i: s.claim(wf, f"elsewhere:{i}:w", 60) for i, s in enumerate(racers)]
        )
        won = [(i, r) for i, r in enumerate(results) if isinstance(r, int)]
        assert len(won) == 1 and results.count(None) == RACERS - 1, results
        winner, fence = won[0]
        assert fence not in fences  # every claim moved the fence on
        fences.add(fence)
        row = racers[0].workflow_row(wf)
        assert (row["lease_owner"], row["fence"]) == (f"elsewhere:{winner}:w", fence)
        racers[0].release(wf, f"elsewhere:{winner}:w")


def test_workers_filling_their_threads_at_once_each_take_other_workflows(
    stores: Callable[[], Store],
) -> None:
    racers = [stores() for _ in range(RACERS)]
    workflows = [new_workflow(racers[0]) for _ in range(RACERS * 2)]
    results = race(
        [
            lambda s=s, i=i: s.claim_free(workflows, f"elsewhere:{i}:w", 60, limit=3)
            for i, s in enumerate(racers)
        ]
    )
    assert all(isinstance(r, dict) for r in results), results
    claimed = [wf for got in results for wf in got]
    assert len(claimed) == len(set(claimed))  # never one workflow to two workers
    # SKIP LOCKED: a batch another worker is taking is passed over, not waited on and
    # then found taken: 8 batches of 3 take all 16 (without it most took none).
    assert sorted(claimed) == sorted(workflows)
    for i, got in enumerate(results):
        for wf, fence in got.items():
            row = racers[0].workflow_row(wf)
            assert (row["lease_owner"], row["fence"]) == (f"elsewhere:{i}:w", fence)


def test_local_forge_numbers_stay_unique_under_concurrent_inserts(
    stores: Callable[[], Store],
) -> None:
    racers = [stores() for _ in range(RACERS)]
    insert = t.forge_issues
    results = race(
        [
            lambda s=s, i=i: s.forge_insert(
                insert, "octo/widgets", title=f"i{i}", body="", state="open"
            )
            for i, s in enumerate(racers)
        ]
    )
    assert sorted(results) == list(range(1, RACERS + 1)), results


def test_concurrent_decisions_are_numbered_one_by_one_and_one_proposal_is_decided_once(
    stores: Callable[[], Store],
) -> None:
    racers = [stores() for _ in range(RACERS)]
    rows = [racers[0].record_run(clean_run(f"r{i}"))[0] for i in range(RACERS)]
    results = race(
        [
            lambda s=s, row=row: s.decide_proposal(row["id"], "approved", "ana")
            for s, row in zip(racers, rows, strict=True)
        ]
    )
    assert all(isinstance(r, dict) for r in results), results
    assert sorted(r["decision_seq"] for r in results) == list(range(1, RACERS + 1))

    [late] = racers[0].record_run(clean_run("late"))
    results = race(
        [
            lambda s=s, i=i: s.decide_proposal(late["id"], "approved", f"p{i}")
            for i, s in enumerate(racers)
        ]
    )
    decided = [r for r in results if isinstance(r, dict)]
    refused = [r for r in results if isinstance(r, ProposalDecided)]
    assert len(decided) == 1 and len(refused) == RACERS - 1, results
    assert racers[0].proposal(late["id"])["decided_by"] == decided[0]["decided_by"]


def test_binds_of_one_session_line_racing_leave_one_row(stores: Callable[[], Store]) -> None:
    racers = [stores() for _ in range(RACERS)]
    wf = new_workflow(racers[0])
    results = race(
        [
            lambda s=s, i=i: s.bind_provider_session(wf, "build", "claude", f"s-{i}")
            for i, s in enumerate(racers)
        ]
    )
    assert results == [None] * RACERS  # no IntegrityError: one upsert, not update-then-insert
    with racers[0].reading() as conn:
        count = conn.execute(
            sa.select(sa.func.count()).select_from(t.provider_sessions)
        ).scalar_one()
    assert count == 1
    assert racers[0].provider_session(wf, "build") in {f"s-{i}" for i in range(RACERS)}


def test_workers_opening_a_fresh_schema_at_once_migrate_it_once(
    postgres_server_url: str,
) -> None:
    _name, url = fresh_schema(postgres_server_url)
    results = race([lambda: open_store(url) for _ in range(4)])
    try:
        assert all(isinstance(r, Store) for r in results), results
        wf = new_workflow(results[0])
        assert results[-1].workflow_row(wf)["status"] == "preparing"
    finally:
        for store in results:
            if isinstance(store, Store):
                store.close()


# -- wake-ups ------------------------------------------------------------------------------


def test_the_listen_feed_wakes_on_a_commit_from_another_connection(
    stores: Callable[[], Store],
) -> None:
    watcher, writer = stores(), stores()
    wf = new_workflow(writer)
    feed = watcher.changes()
    try:
        assert feed.wait(0.2) is False  # nothing committed since the feed began
        ctx = writer.load_context(wf)
        threading.Timer(0.2, lambda: writer.commit_phase_result(ctx, PhaseResult("retry"))).start()
        assert feed.wait(30) is True
        # A write that tells nobody (an event) and a rolled-back notify wake no one.
        writer.add_event(wf, EventWrite("note", {}))
        with pytest.raises(RuntimeError), writer.transaction() as conn:
            writer.dialect.notify(conn)
            raise RuntimeError("rolled back")
        assert feed.wait(0.3) is False
        stop = threading.Event()
        stop.set()
        assert feed.wait(30, stop) is False  # a set stop returns at once, not after 30 s
    finally:
        feed.close()


# -- faults the server reports: StoreUnavailable by SQLSTATE, never a traceback ------------


def admin(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def test_a_connection_terminated_mid_transaction_is_store_unavailable_and_nothing_is_written(
    stores: Callable[[], Store], postgres_server_url: str
) -> None:
    store = stores()
    wf = new_workflow(store)
    ctx = store.load_context(wf)
    said = "admin shutdown|connection failed or lost"
    with pytest.raises(StoreUnavailable, match=said), store.transaction() as conn:
        conn.execute(t.workflows.update().values(title="half"))
        pid = conn.execute(sa.select(sa.func.pg_backend_pid())).scalar_one()
        with admin(postgres_server_url) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))
        conn.execute(sa.select(1))
    assert store.workflow_row(wf)["title"] == "t"  # a new connection; the update was lost
    assert store.commit_phase_result(ctx, PhaseResult("completed"))["current_phase"] == "planning"


def test_too_many_connections_is_store_unavailable(pg_url: str, postgres_server_url: str) -> None:
    role = f"r_{uuid.uuid4().hex[:8]}"
    with admin(postgres_server_url) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN CONNECTION LIMIT 0")
    try:
        url = sa.engine.make_url(pg_url).set(username=role).render_as_string(hide_password=False)
        # Refused while connecting: libpq gives no SQLSTATE then, the refusal is all there is.
        with pytest.raises(
            StoreUnavailable, match="unavailable: connection .*too many connections"
        ):
            open_store(url)
    finally:
        with admin(postgres_server_url) as conn:
            conn.execute(f"DROP ROLE {role}")


# -- a server stopped under a running store ------------------------------------------------


def test_a_server_stopped_mid_run_is_store_unavailable_and_the_store_resumes_after(
    own_server: PostgresServer,
) -> None:
    store = open_store(own_server.url, busy_timeout_s=2)
    feed = store.changes()
    try:
        wf = new_workflow(store)
        ctx = store.load_context(wf)
        own_server.stop(remove=False)
        with pytest.raises(StoreUnavailable, match="is unavailable: connection") as raised:
            store.commit_phase_result(ctx, PhaseResult("completed"))
        assert "127.0.0.1" in str(raised.value)
        with pytest.raises(StoreUnavailable):
            store.load_context(wf)
        assert feed.wait(5) is True  # lost its connection: look anyway

        own_server.start()
        assert store.load_context(wf).version == ctx.version  # nothing half-written
        row = store.commit_phase_result(ctx, PhaseResult("completed"))
        assert row["current_phase"] == "planning"
        # the feed listens again, and hears the next commit
        deadline = time.monotonic() + 30
        while feed.wait(0.2) and time.monotonic() < deadline:
            pass  # drains the wake-ups of its reconnecting and of the commit above
        other = open_store(own_server.url)
        try:
            ctx = other.load_context(wf)
            threading.Timer(
                0.2, lambda: other.commit_phase_result(ctx, PhaseResult("retry"))
            ).start()
            assert feed.wait(30) is True
        finally:
            time.sleep(0.3)
            other.close()
    finally:
        feed.close()
        store.close()


# -- the CLI and a whole lifecycle on a postgresql:// store.url -----------------------------


def test_run_and_status_on_a_postgresql_store_url_complete_a_lifecycle(
    tmp_path: Path, pg_url: str
) -> None:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge(extra=f'[store]\nurl = "{pg_url}"\n'))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")

    run = phasegate_cli("run", "--repo", str(repo), "Add the feature", "--json", timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    wf = json.loads(run.stdout)["id"]
    status = phasegate_cli("status", "--repo", str(repo), "--json")
    assert status.returncode == 0, status.stderr
    [entry] = json.loads(status.stdout)
    assert (entry["id"], entry["current_phase"], entry["status"]) == (wf, "completed", "completed")
    assert not (repo / ".phasegate" / "state.db").exists()  # the state is in PostgreSQL
    store = open_store(pg_url)
    try:
        row = store.workflow_row(wf)
        assert row["merge_sha"] and row["lease_owner"] is None
        assert git(repo, "show", f"{row['merge_sha']}:feature.txt") == "the feature"
        kinds = {m.kind for m in store.milestones(wf)}
        assert "branch_created" in kinds, kinds
    finally:
        store.close()
