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


def test_two_workers_hold_a_provider_cap_of_3_and_claim_by_priority(
    tmp_path: Path, pg_url: str, engine_on: Any
) -> None:
    repo = _project(tmp_path, pg_url, "[queue]\nmax_calls_per_provider = {command = 3}\n")
    engine, store = engine_on(repo)
    # Oldest first: the low ones, then normal, then high; claims must go the other way.
    ids = {
        name: [engine.start(f"{name} {n}", "add a feature", priority=rank) for n in range(count)]
        for name, rank, count in (("low", -1, 2), ("normal", 0, 2), ("high", 1, 4))
    }
    with store.reading() as conn:
        before = conn.execute(sa.select(sa.func.max(t.events.c.id))).scalar()
    logs = [tmp_path / "worker-1.log", tmp_path / "worker-2.log"]
    workers = [_worker(repo, log) for log in logs]
    every = [i for group in ids.values() for i in group]
    try:
        _until(
            "every workflow stopped after its call",
            lambda: all(store.workflow_row(i)["status"] in ("failed", "paused") for i in every),
            logs,
        )
    finally:
        codes = [_stop(proc) for proc in workers]
    runs = _runs(store)
    assert len(runs) == len(every), "a plan each"
    assert all(r["started_at"] is not None for r in runs)
    assert _most_at_once(runs) == 3, "three at once, never four, though six threads ran"
    with store.reading() as conn:
        waited = conn.execute(
            sa.select(sa.func.count()).where(t.events.c.type == "agent_waiting")
        ).scalar()
        # Each workflow's first event a worker wrote: the order its claims came in.
        first = dict(
            conn.execute(
                sa.select(t.events.c.workflow_id, sa.func.min(t.events.c.id))
                .where(t.events.c.id > before)
                .group_by(t.events.c.workflow_id)
            ).all()
        )
    assert waited > 0, "some calls waited for a slot"
    # Six threads took the four high and two normal first; a low one only after a
    # thread was free again.
    assert max(first[i] for i in ids["high"]) < min(first[i] for i in ids["low"])
    assert max(first[i] for i in ids["normal"]) < min(first[i] for i in ids["low"])
    texts = [p.read_text(errors="replace") for p in logs]
    assert all("Traceback" not in text for text in texts), texts
    assert all(sum(text.count(f"{i} → ") for i in every) > 0 for text in texts), "both worked"
    assert codes == [130, 130]


def test_a_killed_workers_slots_come_back_within_its_lease(
    tmp_path: Path, pg_url: str, engine_on: Any
) -> None:
    repo = _project(tmp_path, pg_url, "", sleep_s=0.1)
    # The cap is the shared store's, set by a person: every worker on the store holds it.
    capped = phasegate_cli("queue", "cap", "provider", "command", "3", "-C", str(repo), "--json")
    assert capped.returncode == 0, capped.stdout + capped.stderr
    assert json.loads(capped.stdout)["cap"] == 3
    engine, store = engine_on(repo)
    slow = [engine.start(f"slow {n}", "add a feature") for n in range(3)]
    for workflow_id in slow:
        (tmp_path / "marks" / f"slow-{workflow_id}").touch()
    logs = [tmp_path / "doomed.log", tmp_path / "survivor.log"]
    # "Another machine": its death cannot be seen from here, only its lease running out.
    doomed = _worker(repo, logs[0], env={"PHASEGATE_HOSTNAME": "elsewhere"}, lease_ttl=3.0)
    survivor = None
    try:
        _until(
            "the doomed worker holding three slots",
            lambda: sum(1 for s in store.slot_rows() if s["live"]) == 3,
            logs,
        )
        urgent = engine.start("urgent", "add a feature", priority=1)
        survivor = _worker(repo, logs[1])
        _until(
            "the survivor's call waiting for a slot",
            lambda: [e for e in store.events(urgent) if e["type"] == "agent_waiting"],
            logs,
        )
        _stop(doomed, signal.SIGKILL)
        killed_at = store.clock.now()
        run = _until(
            "the survivor's call run",
            lambda: next((r for r in _runs(store) if r["workflow_id"] == urgent), None),
            logs,
        )
        held = [e for e in store.events(urgent) if e["type"] == "agent_waiting"]
    finally:
        if survivor is not None:
            _stop(survivor)
    assert held and held[0]["data"]["scope"] == "provider" and held[0]["data"]["cap"] == 3
    back_after = (run["started_at"] - killed_at).total_seconds()
    # The slots expire with the lease (3 s, renewed every second); a waiting call
    # looks again at least every queue.slot_poll_s (1 s).
    assert 0 < back_after <= 3.0 + 1.0 + 1.0, back_after
    shown = phasegate_cli("queue", "show", "--repo", str(repo), "--json")
    view = json.loads(shown.stdout)
    assert view["store_caps"][0]["cap"] == 3
    assert not any(call["holder"].startswith("elsewhere:") for call in view["slots"])
    git(repo, "status")  # the repository is intact
