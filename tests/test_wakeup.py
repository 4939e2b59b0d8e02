"""Wake-ups, not polls.

A worker waiting with ``poll_s=60`` acts on a person's decision made from
another connection at once: the store's ChangeFeed woke it (a 60 s poll could
not have); so does one committed in the moment between the worker's advance
letting the lease go and its reading the row it returns, and a workflow that
comes due while a pass runs. An idle waiting
workflow costs no write across many passes: the SQLite file's
``data_version``, seen from a connection of the test's own, does not move,
nor do the workflow's lease and fence.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from phasegate.config.cartridge import load_cartridge
from phasegate.core import decisions
from phasegate.core.contract import PhaseResult
from phasegate.runtime import worker as worker_module
from phasegate.runtime.engine import Engine
from phasegate.store import open_store, tables

WAIT_S = 30.0  # bound on a wait; a correctness check, never a timing judgement


class Running:
    """A worker on its own thread, over its own engine and store."""

    def __init__(self, repo: Path, poll_s: float, engine_cls: type[Engine] = Engine) -> None:
        cartridge = load_cartridge(repo)
        self.store = open_store(cartridge.store_url(repo))
        self.engine = engine_cls(repo, cartridge, self.store)
        self.passes = 0
        read_rows = self.store.lease_rows

        def counted(statuses: frozenset[str], **mine: str | None) -> list[dict[str, object]]:
            self.passes += 1  # each pass reads the runnable rows once
            return read_rows(statuses, **mine)

        self.store.lease_rows = counted  # type: ignore[method-assign]
        self.thread = threading.Thread(
            target=self.engine.run_worker, kwargs={"poll_s": poll_s}, daemon=True
        )

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.shutdown.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "the worker did not stop"
        self.store.close()


def _until(probe, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def _acted_on(
    repo: Path, engine_cls: type[Engine], store, workflow_id: str, decided: list[dict[str, object]]
) -> None:
    """A worker on ``engine_cls``, polling every 60 s, acts on the decision its engine
    commits into ``decided``: a store change woke it, the poll would come too late."""
    with Running(repo, poll_s=60.0, engine_cls=engine_cls):
        _until(lambda: bool(decided), "the worker's look and the decision committed in it")
        _until(
            lambda: store.workflow_row(workflow_id)["version"] > decided[0]["version"],
            "the worker to act on the decision (the next poll is 60 s away)",
        )
    assert store.workflow_row(workflow_id)["version"] > decided[0]["version"]


@pytest.fixture
def waiting(happy_repo: Path, engine_for) -> Iterator[tuple[Path, str]]:
    """A workflow in wait (no auto-merge), advanced there by an engine of its own."""
    engine, _store = engine_for(happy_repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt", auto_merge=False)
    assert engine.advance(workflow_id)["status"] == "waiting"
    yield happy_repo, workflow_id


def test_a_decision_made_while_the_worker_waits_60_s_is_acted_on_at_once(
    waiting: tuple[Path, str], engine_for
) -> None:
    repo, workflow_id = waiting
    person, store = engine_for(repo)
    fence = store.workflow_row(workflow_id)["fence"]
    with Running(repo, poll_s=60.0):
        _until(
            lambda: (
                (r := store.workflow_row(workflow_id))["fence"] > fence and r["lease_owner"] is None
            ),
            "the worker's first look at the workflow",
        )
        person.decide(workflow_id, lambda ctx: decisions.approve_merge(ctx, "a person"))
        _until(
            lambda: store.workflow_row(workflow_id)["status"] in ("completed", "failed", "paused"),
            "the worker to merge and verify the approved workflow",
        )
    assert store.workflow_row(workflow_id)["status"] == "completed"


def test_an_idle_waiting_workflow_costs_no_write_across_many_passes(
    waiting: tuple[Path, str],
) -> None:
    repo, workflow_id = waiting
    db = repo / ".phasegate" / "state.db"
    watcher = sqlite3.connect(db)
    try:
        with Running(repo, poll_s=0.02) as worker:
            # its first look at the workflow claims and releases the lease (two writes)
            _until(
                lambda: (
                    worker.passes >= 2
                    and watcher.execute(
                        "SELECT lease_owner IS NULL AND fence > 0 FROM workflows WHERE id = ?",
                        (workflow_id,),
                    ).fetchone()[0]
                ),
                "the first look",
            )
            before = watcher.execute("PRAGMA data_version").fetchone()[0]
            lease = watcher.execute(
                "SELECT version, fence, lease_owner FROM workflows WHERE id = ?", (workflow_id,)
            ).fetchone()
            passes = worker.passes
            _until(lambda: worker.passes >= passes + 20, "twenty more passes")
            after = watcher.execute("PRAGMA data_version").fetchone()[0]
            again = watcher.execute(
                "SELECT version, fence, lease_owner FROM workflows WHERE id = ?", (workflow_id,)
            ).fetchone()
    finally:
        watcher.close()
    assert after == before, "a pass wrote to the store"
    assert again == lease and lease[2] is None, "the lease was claimed again"


def test_a_decision_committed_as_the_worker_lets_the_lease_go_is_acted_on(
    waiting: tuple[Path, str], engine_for
) -> None:
    repo, workflow_id = waiting
    person, store = engine_for(repo)
    decided: list[dict[str, object]] = []

    class DecidedOnAsItLetsGo(Engine):
        """The worker's engine, with a person's decision committed right after its
        advance released the lease and before advance reads the row it returns."""

        def _let_go(self, workflow_id: str) -> None:
            super()._let_go(workflow_id)
            if not decided and threading.current_thread().name.startswith("advance-"):
                decided.append(
                    person.decide(workflow_id, lambda ctx: decisions.feedback(ctx, "one more"))
                )

    _acted_on(repo, DecidedOnAsItLetsGo, store, workflow_id, decided)


def test_a_decision_whose_pass_came_while_its_workflow_s_thread_ran_is_acted_on(
    waiting: tuple[Path, str], engine_for, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The thread looking at a waiting workflow has read it; a person decides; the
    pass that decision starts skips the workflow (its thread still runs); the
    thread ends with the version it read. The thread's end must read the rows
    again: nothing else changes, and the poll is 60 s away."""
    repo, workflow_id = waiting
    person, store = engine_for(repo)
    decided: list[dict[str, object]] = []
    skipped = threading.Event()
    real_due = worker_module._Worker._due

    def due_noting_skips(self: worker_module._Worker) -> tuple:
        out = real_due(self)
        if decided and workflow_id in self.running:
            skipped.set()  # this pass read the decided row and skipped it
        return out

    monkeypatch.setattr(worker_module._Worker, "_due", due_noting_skips)

    class DecidedOnAfterItsLook(Engine):
        """The worker's engine, with a person's decision committed after its look at
        the waiting workflow read it, and the thread held until a pass skipped it."""

        def idle_at(self, workflow_id: str) -> int | None:
            idle = super().idle_at(workflow_id)
            if not decided and idle is not None:
                decided.append(
                    person.decide(workflow_id, lambda ctx: decisions.feedback(ctx, "one more"))
                )
                assert skipped.wait(WAIT_S), "no pass read the rows after the decision"
            return idle

    _acted_on(repo, DecidedOnAfterItsLook, store, workflow_id, decided)


def test_a_workflow_come_due_between_a_pass_s_read_and_its_look_ahead_is_looked_at_then(
    waiting: tuple[Path, str], engine_for, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's first pass reads the due rows just before the waiting workflow's
    due time, which passes before the pass looks ahead for the next one. The look
    ahead must still see it: else the worker sleeps out its 60 s poll."""
    repo, workflow_id = waiting
    _, store = engine_for(repo)
    due_at = store.schedule(workflow_id, store.workflow_row(workflow_id)["version"], 0.3)
    assert due_at is not None
    real_due = worker_module._Worker._due
    first = threading.Event()

    def due_then_late(self: worker_module._Worker) -> tuple:
        out = real_due(self)
        if not first.is_set():
            first.set()
            assert workflow_id not in out[1], "read before its due time"
            while store.clock.now() <= due_at:  # the due time passes within the pass
                time.sleep(0.05)
        return out

    monkeypatch.setattr(worker_module._Worker, "_due", due_then_late)
    looked = threading.Event()

    class Looking(Engine):
        def idle_at(self, workflow_id: str) -> int | None:
            looked.set()
            return super().idle_at(workflow_id)

    with Running(repo, poll_s=60.0, engine_cls=Looking):
        assert looked.wait(WAIT_S), "the worker slept out its poll (60 s)"
    assert first.is_set()


def test_a_running_worker_releases_a_workflow_whose_dependency_completed_unseen(
    happy_repo: Path, engine_for, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A completion that released nothing (written by an older version, or by hand)
    leaves its dependent blocked; a worker already running releases it with its
    periodic cleanups, not only at its start."""
    monkeypatch.setattr(worker_module, "CLEANUP_RETRY_S", 0.1)
    engine, store = engine_for(happy_repo)
    first = engine.start("first", "Write feature.txt")
    engine.decide(first, lambda _ctx: PhaseResult("pause", reason="held back by the test"))
    second = engine.start("second", "Write feature.txt", after=[first])
    assert store.workflow_row(second)["status"] == "blocked"
    with Running(happy_repo, poll_s=0.2) as running:
        _until(lambda: running.passes >= 2, "the worker's first passes")
        assert store.workflow_row(second)["status"] == "blocked"
        with store.transaction() as conn:  # completed without the commit path's release
            conn.execute(
                tables.workflows.update()
                .where(tables.workflows.c.id == first)
                .values(status="completed")
            )
        _until(
            lambda: bool(store.events(second, types=["dependencies_met"])),
            "the running worker to release the second workflow",
        )
    assert store.workflow_row(second)["status"] != "blocked"
