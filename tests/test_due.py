"""When a workflow is due is the store's (``workflows.due_at``), not a worker's memory.

The commit path writes it with the phase result (a wait on a team's forge: after
``forge.poll_s``), a worker when a look found nothing new (``LeaseRows.schedule``);
a pass lists and claims a workflow only once the store's clock reaches it. So a
worker started afresh (another object, another process) honours a due time
another one wrote. On SQLite and PostgreSQL (the ``store_url`` fixture); time
moves by the store's FixedClock, never by sleeping.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from test_forge_phases import TeamForge, team_repo

import phasegate.store
from phasegate.config.cartridge import load_cartridge
from phasegate.config.forge import ForgeSettings
from phasegate.core.contract import RUNNABLE_STATUSES, PhaseResult
from phasegate.forge.base import Check
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store
from phasegate.store.store import make_dialect
from phasegate.store.values import HEAD_REVISION
from phasegate.testing import FixedClock

from conftest import new_workflow

MIGRATIONS = Path(phasegate.store.__file__).parent / "migrations"
FORGE_POLL_S = 600.0  # the team forge's poll: far beyond any pass of these tests
WAIT_S = 60.0  # bound on a wait; a correctness check, never a timing judgement


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
def store(store_url: str, clock: FixedClock) -> Iterator[Store]:
    s = open_store(store_url, clock)
    yield s
    s.close()


def _due_ids(store: Store, clock: FixedClock) -> list[str]:
    return [r["id"] for r in store.lease_rows(RUNNABLE_STATUSES, due_by=clock.now())]


# -- the store ---------------------------------------------------------------------------


def test_a_workflow_scheduled_for_later_is_listed_and_claimed_only_once_due(
    store: Store, clock: FixedClock
) -> None:
    later = new_workflow(store)
    clock.advance(1)  # created one after the other: the order passes list them in
    now = new_workflow(store)
    row = store.commit_phase_result(
        store.load_context(later), PhaseResult("wait", state={"looked": 1}), due_in_s=30
    )
    assert row["due_at"] == clock.now() + timedelta(seconds=30)
    assert store.workflow_row(now)["due_at"] is None  # never scheduled: due now

    assert _due_ids(store, clock) == [now]
    assert store.next_due_at(RUNNABLE_STATUSES, clock.now()) == row["due_at"]
    assert store.claim_free([later], "elsewhere:1:a", 60) == {}
    clock.advance(29)
    assert store.claim_free([later], "elsewhere:1:a", 60) == {}

    clock.advance(1)
    assert _due_ids(store, clock) == [later, now]  # oldest first, as ever
    assert store.next_due_at(RUNNABLE_STATUSES, clock.now()) is None
    assert store.claim_free([later], "elsewhere:1:a", 60) == {later: 1}


def test_once_claims_a_workflow_scheduled_for_later_too(store: Store, clock: FixedClock) -> None:
    wf = new_workflow(store)
    store.commit_phase_result(
        store.load_context(wf), PhaseResult("wait", state={"a": 1}), due_in_s=5
    )
    assert store.claim_free([wf], "elsewhere:1:a", 60) == {}
    assert store.claim_free([wf], "elsewhere:1:a", 60, scheduled=True) == {wf: 1}


def test_any_commit_makes_a_workflow_due_at_once_and_a_stale_schedule_writes_nothing(
    store: Store, clock: FixedClock
) -> None:
    wf = new_workflow(store)
    version = store.workflow_row(wf)["version"]
    assert store.schedule(wf, version, 60) == clock.now() + timedelta(seconds=60)
    assert _due_ids(store, clock) == []

    # A person's decision (any commit without a due time) makes it due now, and a
    # look that read the row before it reschedules nothing.
    store.commit_phase_result(store.load_context(wf), PhaseResult("retry", state={"b": 1}))
    assert store.workflow_row(wf)["due_at"] is None
    assert store.schedule(wf, version, 60) is None
    assert _due_ids(store, clock) == [wf]


def test_migration_0006_upgrades_a_0005_store_its_workflows_due_now(
    store_url: str, clock: FixedClock
) -> None:
    dialect = make_dialect(store_url)
    old = Store(dialect.engine(), clock, dialect)
    old.migrate("0005")
    assert "due_at" not in {c["name"] for c in sa.inspect(old.engine).get_columns("workflows")}
    wf = new_workflow(old)
    old.close()

    store = open_store(store_url, clock)
    try:
        with store.engine.connect() as conn:
            version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
        assert version == HEAD_REVISION
        indexes = {i["name"] for i in sa.inspect(store.engine).get_indexes("workflows")}
        assert "ix_workflows_due" in indexes
        assert store.workflow_row(wf)["due_at"] is None
        assert _due_ids(store, clock) == [wf]
        with store.transaction() as conn:  # and back: the column goes with its index
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS))
            config.attributes["connection"] = conn
            command.downgrade(config, "0005")
        columns = {c["name"] for c in sa.inspect(store.engine).get_columns("workflows")}
        indexes = {i["name"] for i in sa.inspect(store.engine).get_indexes("workflows")}
        assert "due_at" not in columns and "ix_workflows_due" not in indexes
    finally:
        store.close()


# -- the worker --------------------------------------------------------------------------


def _engine(repo: Path, store: Store, forge: TeamForge) -> Engine:
    """A fresh engine (nothing remembered) whose cartridge's forge is a team's."""
    engine = Engine(repo, load_cartridge(repo), store, forge=forge)
    engine.cartridge = engine.cartridge.model_copy(
        update={"forge": ForgeSettings(kind="github", repository="o/r", poll_s=FORGE_POLL_S)}
    )
    return engine


def _passes(engine: Engine, store: Store, n: int) -> None:
    """Run a worker on ``engine`` (fresh memory) for ``n`` passes with no advance
    running after them, polling every 10 ms."""
    passes = iter(range(n))
    read_rows = store.lease_rows

    def counted(statuses: frozenset[str], **kwargs: object) -> list[dict[str, object]]:
        if not engine.fences and next(passes, None) is None:
            engine.shutdown.set()
        return read_rows(statuses, **kwargs)  # type: ignore[arg-type]

    store.lease_rows = counted  # type: ignore[method-assign]
    try:
        engine.run_worker(poll_s=0.01)
    finally:
        del store.lease_rows


def test_a_workflow_waiting_on_ci_is_looked_at_again_only_when_due_even_by_a_new_worker(
    tmp_path: Path, store_url: str, clock: FixedClock
) -> None:
    repo, _ = team_repo(tmp_path)
    forge = TeamForge()
    forge.state_of_ci = [Check("ci/tests", "pending")]
    first = open_store(store_url, clock)
    try:
        engine = _engine(repo, first, forge)
        workflow_id = engine.start("Add the feature", "Write feature.txt")
        row = engine.advance(workflow_id)
        assert (row["current_phase"], row["status"]) == ("pr_review", "pr_review")
        # written with the wait's commit, in its transaction
        assert row["due_at"] == clock.now() + timedelta(seconds=FORGE_POLL_S)
        assert len(forge.looked_at) == 1
    finally:
        first.close()  # the first "process" is gone, and all it knew

    for elapsed in (0.0, FORGE_POLL_S - 1):
        clock.advance(elapsed)
        store = open_store(store_url, clock)
        try:
            _passes(_engine(repo, store, forge), store, 4)
            assert store.workflow_row(workflow_id)["fence"] == row["fence"], "claimed early"
        finally:
            store.close()
        assert len(forge.looked_at) == 1, "looked at before it was due"

    clock.advance(1)
    store = open_store(store_url, clock)
    try:
        _passes(_engine(repo, store, forge), store, 4)
        assert len(forge.looked_at) == 2, "not looked at once due"
        # Nothing new: no commit, and the next look is the store's again.
        again = store.workflow_row(workflow_id)
        assert again["version"] == row["version"]
        assert again["due_at"] == clock.now() + timedelta(seconds=FORGE_POLL_S)
    finally:
        store.close()


def _until(probe: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_a_worker_process_started_afresh_honours_a_due_time_written_before_it(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(happy_repo)  # the repository's own store: SQLite
    later = engine.start("Later", "Write later.txt", auto_merge=False)
    now = engine.start("Now", "Write feature.txt", auto_merge=False)
    assert store.schedule(later, store.workflow_row(later)["version"], 3600) is not None

    worker = subprocess.Popen(
        [str(Path(sys.executable).parent / "phasegate"), "worker", "--repo", str(happy_repo)]
        + ["--poll", "0.05"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        # The workflow due now is advanced to wait: the worker has passed over both.
        _until(lambda: store.workflow_row(now)["status"] == "waiting", "the due one's advance")
        row = store.workflow_row(later)
        assert (row["status"], row["fence"]) == ("preparing", 0), "claimed before it was due"

        store.schedule(later, row["version"], 0)  # its time has come
        _until(lambda: store.workflow_row(later)["fence"] > 0, "the worker to claim it")
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(WAIT_S)
