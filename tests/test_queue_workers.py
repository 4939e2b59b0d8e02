"""Queues across real worker processes on one PostgreSQL store.

Two ``phasegate worker`` processes share a provider cap of 3: never more than 3
agent calls to that provider at once, judged from the agent run records'
start and end times; the workflows of higher priority are claimed before
those of lower; a SIGKILLed worker on "another machine" gives its slots back
once its lease runs out, and a waiting call of another worker takes them.
docs/queues.md says what these promise.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store
from phasegate.store import tables as t

from conftest import git, make_repo, phasegate_cli

PHASEGATE = Path(sys.executable).parent / "phasegate"
ROLES = ("plan", "plan_review", "build", "review", "verification")
WAIT_S = 120.0  # a bound on a run, for a failure message: never a speed judgement

# Every role is this command: the plan sleeps a moment, so calls overlap, and then
# fails, so a workflow is one call and stops (retries: 0). A workflow whose marker
# file exists sleeps 10 s on its first call (the kill test).
AGENT = """#!/bin/sh
if [ -e "{marks}/slow-$PHASEGATE_WORKFLOW_ID" ]; then
  rm -f "{marks}/slow-$PHASEGATE_WORKFLOW_ID"
  sleep 10
fi
sleep {sleep_s}
echo "no plan here"
exit 3
"""


def _project(tmp_path: Path, url: str, queue: str, sleep_s: float = 0.2) -> Path:
    marks = tmp_path / "marks"
    marks.mkdir()
    agent = tmp_path / "agent.sh"
    agent.write_text(AGENT.format(marks=marks, sleep_s=sleep_s))
    roles = "".join(
        f'[roles.{role}]\nrunner = "command"\ncommand = "sh {agent}"\nsandbox = "none"\n'
        "timeout = 60\n\n"
        for role in ROLES
    )
    cartridge = (
        '[workflow]\nbase_branch = "main"\n\n[landing_areas]\nchecks = []\n\n'
        f'[limits]\nagent_retries = 0\n\n[store]\nurl = "{url}"\n\n{queue}\n{roles}'
    )
    return make_repo(tmp_path / "repo", {"README.md": "# queues\n", "phasegate.toml": cartridge})


def _worker(
    repo: Path, log: Path, *, env: dict[str, str] | None = None, lease_ttl: float = 60.0
) -> subprocess.Popen[bytes]:
    command = [str(PHASEGATE), "worker", "--repo", str(repo), "--concurrency", "3"]
    command += ["--poll", "0.5", "--lease-ttl", str(lease_ttl)]
    with log.open("ab") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "200", **(env or {})},
        )


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode


@pytest.fixture
def engine_on(tmp_path: Path) -> Iterator[Any]:
    opened: list[Store] = []

    def make(repo: Path) -> tuple[Engine, Store]:
        cartridge = load_cartridge(repo)
        store = open_store(cartridge.store_url(repo))
        opened.append(store)
        return Engine(repo, cartridge, store), store

    yield make
    for store in opened:
        store.close()


def _until(what: str, done: Any, logs: list[Path]) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        found = done()
        if found:
            return found
        if time.monotonic() > deadline:
            tails = "\n".join(p.read_text(errors="replace")[-3000:] for p in logs if p.exists())
            raise AssertionError(f"not {what} within {WAIT_S:g} s\n{tails}")
        time.sleep(0.1)


def _runs(store: Store) -> list[dict[str, Any]]:
    with store.reading() as conn:
        return [dict(r) for r in conn.execute(sa.select(t.agent_runs)).mappings()]


def _waits(store: Store) -> list[dict[str, Any]]:
    """Every ``agent_waiting`` event: a call that found a cap reached."""
    with store.reading() as conn:
        query = sa.select(t.events).where(t.events.c.type == "agent_waiting")
        return [dict(r) for r in conn.execute(query).mappings()]


def _most_at_once(runs: list[dict[str, Any]]) -> int:
    """The most runs whose [started_at, started_at + duration_s] overlap at one moment."""
    edges = []
    for run in runs:
        start = run["started_at"]
        edges += [(start, 1), (start + timedelta(seconds=run["duration_s"]), -1)]
    most = now = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):  # an end before a start
        now += step
        most = max(most, now)
    return most


def test_two_workers_hold_a_cap_of_3_claim_by_priority_and_get_a_killed_workers_slots(
    tmp_path: Path, pg_url: str, engine_on: Any
) -> None:
    # The cartridge caps the provider at 5, the shared store at 3: the smaller holds.
    repo = _project(tmp_path, pg_url, "[queue]\nmax_calls_per_provider = {command = 5}\n")
    capped = phasegate_cli("queue", "cap", "provider", "command", "3", "-C", str(repo), "--json")
    assert capped.returncode == 0, capped.stdout + capped.stderr
    engine, store = engine_on(repo)
    # A worker on "another machine" (its death seen only as its lease running out)
    # takes three slow workflows: it holds all three slots.
    slow = [engine.start(f"slow {n}", "add a feature") for n in range(3)]
    for workflow_id in slow:
        (tmp_path / "marks" / f"slow-{workflow_id}").touch()
    logs = [tmp_path / "doomed.log", tmp_path / "worker-1.log", tmp_path / "worker-2.log"]
    env = {"PHASEGATE_HOSTNAME": "elsewhere"}
    doomed = _worker(repo, logs[0], env=env, lease_ttl=3.0)
    workers: list[subprocess.Popen[bytes]] = []
    try:
        _until(
            "the doomed worker holding three slots",
            lambda: sum(1 for s in store.slot_rows() if s["live"]) == 3,
            logs,
        )
        # Oldest first: low, then normal, then high; claims must go the other way.
        ids = {
            name: [engine.start(f"{name} {n}", "a feature", priority=rank) for n in range(count)]
            for name, rank, count in (("low", -1, 2), ("normal", 0, 2), ("high", 1, 4))
        }
        every = [i for group in ids.values() for i in group]
        with store.reading() as conn:
            before = conn.execute(sa.select(sa.func.max(t.events.c.id))).scalar()
        workers = [_worker(repo, log) for log in logs[1:]]
        _until(
            "six calls of the two workers waiting for a slot",
            lambda: len(_waits(store)) >= 6,
            logs,
        )
        _stop(doomed, signal.SIGKILL)
        killed_at = store.clock.now()
        _until(
            "every workflow stopped after its call",
            lambda: all(
                store.workflow_row(i)["status"] in ("failed", "paused") for i in every + slow
            ),
            logs,
        )
    finally:
        _stop(doomed, signal.SIGKILL)
        codes = [_stop(proc) for proc in workers]
    runs = _runs(store)
    assert sorted(r["workflow_id"] for r in runs) == sorted(every + slow), "the killed calls again"
    assert all(r["started_at"] is not None for r in runs)
    assert _most_at_once(runs) == 3, "three at once, never four, though six threads ran"
    waited = _waits(store)
    assert {(e["data"]["scope"], e["data"]["key"], e["data"]["cap"]) for e in waited} == {
        ("provider", "command", 3)
    }
    # The killed worker's slots expire with its lease (3 s, renewed every second); a
    # waiting call looks again at least every queue.slot_poll_s (1 s).
    back_after = (min(r["started_at"] for r in runs) - killed_at).total_seconds()
    assert 0 < back_after <= 3.0 + 1.0 + 1.0, back_after
    with store.reading() as conn:
        # Each workflow's first event a worker wrote: the order its claims came in.
        first = dict(
            conn.execute(
                sa.select(t.events.c.workflow_id, sa.func.min(t.events.c.id))
                .where(t.events.c.id > before)
                .group_by(t.events.c.workflow_id)
            ).all()
        )
    # The free slots went to the waiting calls of the higher priority first.
    by_start = sorted((r for r in runs if r["workflow_id"] in every), key=lambda r: r["started_at"])
    assert {r["workflow_id"] for r in by_start[:4]} == set(ids["high"])
    # Six threads took the four high and two normal first; a low one only once a
    # thread was free again.
    assert max(first[i] for i in ids["high"]) < min(first[i] for i in ids["low"])
    assert max(first[i] for i in ids["normal"]) < min(first[i] for i in ids["low"])
    texts = [p.read_text(errors="replace") for p in logs[1:]]
    assert all("Traceback" not in text for text in texts), texts
    assert all(sum(text.count(f"{i} → ") for i in every) > 0 for text in texts), "both worked"
    assert codes == [130, 130]
    view = json.loads(phasegate_cli("queue", "show", "-C", str(repo), "--json").stdout)
    assert view["slots"] == [] and view["store_caps"][0]["cap"] == 3
    git(repo, "status")  # the repository is intact
