"""Fencing (docs/contracts/lifecycle.md: leases and fencing): a heartbeat that
cannot renew keeps trying and says when the lease is lost; a worker whose lease
was taken over starts no agent, runs no side effect and commits nothing. Real
threads, a real write lock held by another SQLite connection, a real worker
process stopped with SIGSTOP past its lease's expiry."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_restart import FEATURE, Lab, assert_exactly_once, wait_until

from phasegate.config.cartridge import load_cartridge
from phasegate.core.contract import MilestoneWrite
from phasegate.git.workspace import Workspace
from phasegate.journal import SideEffects
from phasegate.proc.process import start_ticks
from phasegate.runtime.engine import Engine
from phasegate.runtime.heartbeat import Heartbeat
from phasegate.store import Fence, FenceLost, Store, StoreUnavailable, open_store
from phasegate.testing import InMemoryForge

from conftest import (
    HAPPY_ANSWERS,
    LOCKED,
    git,
    make_repo,
    new_workflow,
    scripted_cartridge,
    writes_held,
)

HOST = os.uname().nodename


@pytest.fixture
def url(store_url: str) -> str:
    """The conformance suite's store: SQLite, then PostgreSQL (conftest)."""
    return store_url


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    s = open_store(url, busy_timeout_s=0.05)
    yield s
    s.close()


def hold_write_lock(url: str | Path, seconds: float) -> None:
    """Hold what the store's writes wait for from another connection for ``seconds``
    (``url``: a store URL, or a SQLite file's path)."""
    with writes_held(url if isinstance(url, str) else f"sqlite:///{url}"):
        time.sleep(seconds)


def heartbeat(store: Store, wf: str, ttl_s: float) -> tuple[Heartbeat, Fence]:
    owner = f"{HOST}:{os.getpid()}:hb"
    fence = Fence(store, wf, owner, store.claim(wf, owner, ttl_s) or 0)
    beat = Heartbeat(store, fence, ttl_s)
    beat.start()
    return beat, fence


def test_a_renewal_that_fails_on_a_locked_store_is_retried_and_the_heartbeat_lives_on(
    store: Store, url: str
) -> None:
    wf = new_workflow(store)
    beat, fence = heartbeat(store, wf, ttl_s=3.0)  # a beat every 1 s, 0.25 s after a failure
    claimed_until = store.workflow_row(wf)["lease_expires_at"]
    try:
        hold_write_lock(url, 1.6)  # the beat at 1 s (and its retries) find the store locked
        wait_until(
            lambda: store.workflow_row(wf)["lease_expires_at"] > claimed_until,
            "a renewal after the lock was released",
            timeout=5,
        )
        assert beat.failures >= 1
        assert beat.is_alive()
        assert not fence.lost.is_set()
        fence.check()  # still this worker's lease
    finally:
        beat.stopped.set()
        beat.join(5)


def test_a_heartbeat_that_cannot_renew_for_a_whole_ttl_marks_the_fence_lost(
    store: Store, url: str
) -> None:
    wf = new_workflow(store)
    beat, fence = heartbeat(store, wf, ttl_s=1.2)
    hold_write_lock(url, 2.0)
    beat.join(5)
    assert not beat.is_alive() and beat.failures >= 2
    assert fence.lost.is_set()
    # the store's fault, not a takeover: what a stopped worker then says
    assert fence.unrenewed is not None and re.search(LOCKED, fence.unrenewed.reason)
    with pytest.raises(FenceLost):
        fence.check()


def test_a_heartbeat_whose_lease_was_taken_over_marks_the_fence_lost(store: Store) -> None:
    wf = new_workflow(store)
    beat, fence = heartbeat(store, wf, ttl_s=0.6)
    store.release(wf, fence.owner)  # as if it had expired: another worker claims it
    assert store.claim(wf, "elsewhere:1:b", 60) == fence.value + 1
    beat.join(5)
    assert fence.lost.is_set() and beat.failures == 0 and fence.unrenewed is None
    assert store.workflow_row(wf)["lease_owner"] == "elsewhere:1:b"


# -- a worker stopped past its lease's expiry -------------------------------------------------

WORKER_A = """\
import logging, sys
from pathlib import Path
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import open_store
repo, wf = Path(sys.argv[1]), sys.argv[2]
cartridge = load_cartridge(repo)
store = open_store(cartridge.store_url(repo))
row = Engine(repo, cartridge, store, lease_ttl_s=float(sys.argv[3])).advance(wf)
print("advance returned", row["status"], row["current_phase"], flush=True)
"""


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.cleanup()


def _snapshot(store: Store, wf: str) -> dict[str, Any]:
    return {
        "row": store.workflow_row(wf),
        "milestones": store.milestone_rows(wf),
        "events": store.events(wf),
        "agent_runs": store.agent_runs(wf),
    }


@pytest.mark.slow
def test_a_worker_whose_lease_was_taken_over_starts_no_agent_and_commits_nothing(
    lab: Lab, tmp_path: Path
) -> None:
    lab.configure(hang_role="build")  # A's first build call hangs
    wf = lab.start()
    script = tmp_path / "worker_a.py"
    script.write_text(WORKER_A)
    ttl = 1.5
    with (lab.logs / "worker-a.log").open("wb") as log:
        a = subprocess.Popen(
            [sys.executable, str(script), str(lab.repo), wf, str(ttl)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    lab.workers.append(a)
    wait_until(lambda: lab.calls("build") >= 1, "A's build agent to start", on_timeout=lab.log_tail)
    os.kill(a.pid, signal.SIGSTOP)  # A (not its agent) stops: no more heartbeats
    try:
        time.sleep(ttl + 1.0)  # past A's lease's expiry

        cartridge = load_cartridge(lab.repo)
        store = open_store(cartridge.store_url(lab.repo))
        try:
            b = Engine(lab.repo, cartridge, store)
            for _ in range(10):  # B takes the lease over by expiry and finishes the workflow
                if b.advance(wf)["status"] == "completed":
                    break
            before = _snapshot(store, wf)
            assert before["row"]["status"] == "completed", lab.log_tail()
            builds = lab.calls("build")
            assert builds == 2  # A's (hung, stopped by B's reconciliation) and B's
        finally:
            os.kill(a.pid, signal.SIGCONT)
        assert a.wait(timeout=30) == 0, lab.log_tail()
        after = _snapshot(store, wf)
        store.close()
    finally:
        if a.poll() is None:
            os.kill(a.pid, signal.SIGCONT)

    assert after == before  # A wrote nothing after the takeover: no row, event, run, commit
    assert lab.calls("build") == builds  # and started no other agent
    output = (lab.logs / "worker-a.log").read_text()
    assert "advance of " + wf + " stopped" in output, output
    assert "Traceback" not in output, output
    assert_exactly_once(lab.repo, wf)
    assert git(lab.repo, "show", "main:feature.txt") + "\n" == FEATURE


def test_a_stale_worker_does_not_reconcile_away_the_live_worker_s_agent(
    store: Store, tmp_path: Path
) -> None:
    wf = new_workflow(store)
    stale = Fence(store, wf, "elsewhere:1:a", store.claim(wf, "elsewhere:1:a", 60) or 0)
    store.release(wf, stale.owner)
    assert store.claim(wf, f"{HOST}:{os.getpid()}:b", 60) == stale.value + 1
    # B's agent, running, journaled as B's AgentService does it
    agent = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        store.write_milestone(
            wf,
            "development",
            MilestoneWrite(
                "agent_process",
                status="in_progress",
                key="build",
                data={"host": HOST, "pgid": agent.pid, "ticks": start_ticks(agent.pid)},
            ),
        )
        effects = SideEffects(store, InMemoryForge(), Workspace(), wf, tmp_path, fence=stale)
        with pytest.raises(FenceLost):
            effects.reconcile()
        with pytest.raises(FenceLost):
            effects.create_issue("preparation", "t", "body")
        assert agent.poll() is None  # B's agent lives on
        assert [m.status for m in store.milestones(wf)] == ["in_progress"]
    finally:
        agent.kill()
        agent.wait()


@pytest.mark.parametrize(
    ("busy_s", "locked_s"),
    [(0.05, 2.2), (4.0, 5.0)],
    ids=["the heartbeat gives up first", "a step's own check finds the lease expired first"],
)
def test_a_lease_lost_to_a_locked_store_says_the_store_not_another_process(
    tmp_path: Path, busy_s: float, locked_s: float
) -> None:
    repo = make_repo(tmp_path / "repo", {"README.md": "# s\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    started = tmp_path / "build-started"
    slow_build = (
        f'runner = "command"\ncommand = "touch {started}; sleep 3; '
        'echo the feature > feature.txt; echo built"\n'
        "timeout = 30\n"
    )
    (repo / "phasegate.toml").write_text(scripted_cartridge(role_overrides={"build": slow_build}))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    db = repo / ".phasegate" / "state.db"
    cartridge = load_cartridge(repo)
    # With a busy timeout longer than the lease, a renewal is still waiting on the lock
    # when the step's own check (after the build agent) finds the lease expired.
    store = open_store(f"sqlite:///{db}", busy_timeout_s=busy_s)
    engine = Engine(repo, cartridge, store, lease_ttl_s=1.2, store_retry_delays_s=(0.1,))
    wf = engine.start("Add the feature file", "Add feature.txt.")
    holder = None
    try:

        def lock_during_the_build() -> None:
            # Locked once the build agent runs, so only the heartbeat meets the lock
            # (not the phase's own writes before the agent, on a slow machine).
            wait_until(started.exists, "the build agent")
            hold_write_lock(db, locked_s)  # renewals fail past the 1.2 s lease

        holder = threading.Thread(target=lock_during_the_build)
        holder.start()
        with pytest.raises(StoreUnavailable) as raised:
            engine.advance(wf)
        said = str(raised.value)
        assert "lease" in said and wf in said and "state.db" in said
        assert "another process" not in said
    finally:
        if holder is not None:
            holder.join(10)
    row = store.workflow_row(wf)
    assert row["current_phase"] == "development" and row["error"] is None  # as last committed
    store.close()
