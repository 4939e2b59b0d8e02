"""Benchmark: queued workflows over real workers under a provider cap, and a killed worker's slots.

    .venv/bin/python benchmarks/queue_caps.py                     # 100 workflows, 2 workers
    .venv/bin/python benchmarks/queue_caps.py --workflows 12 --json   # a smoke run

On a PostgreSQL store (``PHASEGATE_POSTGRES_URL``, else a throwaway server
started by ``support.postgres``; a schema of its own), ``--workflows`` N
workflows are filed with priorities low, normal and high in a shuffled order
(seeded), then ``--workers`` real ``phasegate worker`` processes of
``--concurrency`` threads each take them, under ``[queue]
max_calls_per_provider = {command = CAP}``. Every role is a ``command`` that
sleeps ``--sleep`` seconds and fails, so a workflow is one agent call.

Printed, never judged:

- ``most_at_once``: the most calls of the provider running at one moment, from
  the agent run records (``agent_runs.started_at`` and ``duration_s``), and the cap;
- ``waited``: how many calls waited for a slot (``agent_waiting`` events);
- the claim order: each workflow's first event a worker wrote orders the claims;
  ``inversions`` counts the pairs claimed out of priority order (a lower one
  before a higher one), of ``pairs`` with different priorities; the mean claim
  position of each priority;
- the slot recovery: a worker on "another machine" (``PHASEGATE_HOSTNAME``) holds
  CAP slots with slow calls and is SIGKILLed while a call of another worker
  waits; ``recovery_s`` is from the kill to that call's start, against the
  killed worker's ``--lease-ttl``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store
from phasegate.store import tables as t

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the rig: tests/support
from support.postgres import PostgresUnavailable, drop_schema, fresh_schema, server_url  # noqa: E402

PHASEGATE = Path(sys.executable).parent / "phasegate"
ROLES = ("plan", "plan_review", "build", "review", "verification")
PRIORITIES = {"low": -1, "normal": 0, "high": 1}
_GIT_ID = ["-c", "user.name=bench", "-c", "user.email=bench@localhost"]

# One call per workflow: a moment's sleep, then a failure (agent_retries = 0). A workflow
# whose marker file exists sleeps long on its first call (the recovery part).
AGENT = """#!/bin/sh
if [ -e "{marks}/slow-$PHASEGATE_WORKFLOW_ID" ]; then
  rm -f "{marks}/slow-$PHASEGATE_WORKFLOW_ID"
  sleep 30
fi
sleep {sleep_s}
echo "no plan here"
exit 3
"""


def make_project(root: Path, url: str, cap: int, sleep_s: float) -> Path:
    """A repository whose every role is the failing agent above, on the store ``url``."""
    marks = root / "marks"
    marks.mkdir(parents=True)
    agent = root / "agent.sh"
    agent.write_text(AGENT.format(marks=marks, sleep_s=sleep_s))
    repo = root / "repo"
    repo.mkdir()
    roles = "".join(
        f'[roles.{role}]\nrunner = "command"\ncommand = "sh {agent}"\nsandbox = "none"\n'
        "timeout = 120\n\n"
        for role in ROLES
    )
    (repo / "phasegate.toml").write_text(
        '[workflow]\nbase_branch = "main"\n\n[landing_areas]\nchecks = []\n\n'
        f'[limits]\nagent_retries = 0\n\n[store]\nurl = "{url}"\n\n'
        f"[queue]\nmax_calls_per_provider = {{command = {cap}}}\n\n{roles}"
    )
    (repo / "README.md").write_text("# queue sample\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], [*_GIT_ID, "commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo


def spawn(
    repo: Path, log: Path, concurrency: int, lease_ttl: float, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    command = [str(PHASEGATE), "worker", "--repo", str(repo), "--concurrency", str(concurrency)]
    command += ["--poll", "0.5", "--lease-ttl", str(lease_ttl)]
    with log.open("ab") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1", **(env or {})},
        )


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, sig)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def until(done: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = done()
        if found:
            return found
        time.sleep(0.05)
    raise TimeoutError(f"not done within {timeout_s:g} s")


def most_at_once(runs: list[dict[str, Any]]) -> int:
    """The most runs whose [started_at, started_at + duration_s] overlap at one moment."""
    edges = []
    for run in runs:
        if run["started_at"] is None:
            continue
        end = run["started_at"] + timedelta(seconds=run["duration_s"])
        edges += [(run["started_at"], 1), (end, -1)]
    most = now = 0
    for _, step in sorted(edges, key=lambda e: (e[0], e[1])):
        now += step
        most = max(most, now)
    return most


def claim_order(store: Store, ids: list[str], after: int) -> list[str]:
    """The workflows ``ids`` in the order workers first wrote an event of theirs."""
    e = t.events.c
    with store.reading() as conn:
        first = dict(
            conn.execute(
                sa.select(e.workflow_id, sa.func.min(e.id))
                .where(e.id > after, e.workflow_id.in_(ids))
                .group_by(e.workflow_id)
            ).all()
        )
    return sorted(first, key=lambda i: first[i])


def queue_run(repo: Path, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Part one: N workflows, shuffled priorities, ``--workers`` workers, the cap."""
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    try:
        engine = Engine(repo, cartridge, store)
        names = [list(PRIORITIES)[i % 3] for i in range(args.workflows)]
        random.Random(args.seed).shuffle(names)
        priority = {
            engine.start(f"{name} {n}", "a ticket", priority=PRIORITIES[name]): PRIORITIES[name]
            for n, name in enumerate(names)
        }
        with store.reading() as conn:
            after = conn.execute(sa.select(sa.func.max(t.events.c.id))).scalar() or 0
        logs = [root / f"worker-{i}.log" for i in range(args.workers)]
        started = time.perf_counter()
        workers = [spawn(repo, log, args.concurrency, 60.0) for log in logs]
        try:
            until(
                lambda: all(
                    store.workflow_row(i)["status"] in ("failed", "paused") for i in priority
                ),
                args.timeout,
            )
            wall_s = time.perf_counter() - started
        finally:
            for proc in workers:
                stop(proc)
        with store.reading() as conn:
            runs = [dict(r) for r in conn.execute(sa.select(t.agent_runs)).mappings()]
            waited = conn.execute(
                sa.select(sa.func.count()).where(t.events.c.type == "agent_waiting")
            ).scalar()
        order = claim_order(store, list(priority), after)
    finally:
        store.close()
    ranks = [priority[i] for i in order]
    inversions = sum(1 for a in range(len(ranks)) for b in ranks[a + 1 :] if ranks[a] < b)
    pairs = sum(1 for a in range(len(ranks)) for b in ranks[a + 1 :] if ranks[a] != b)
    positions = {
        name: round(
            sum(n for n, i in enumerate(order, 1) if priority[i] == rank)
            / max(1, sum(1 for i in order if priority[i] == rank)),
            1,
        )
        for name, rank in PRIORITIES.items()
    }
    return {
        "workflows": args.workflows,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "cap": args.cap,
        "wall_s": round(wall_s, 2),
        "calls": len(runs),
        "most_at_once": most_at_once(runs),
        "waited": int(waited or 0),
        "inversions": inversions,
        "pairs": pairs,
        "threads": args.workers * args.concurrency,
        "mean_claim_position": positions,
        "tracebacks": sum(p.read_text(errors="replace").count("Traceback") for p in logs),
    }


def recovery_run(repo: Path, root: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Part two: a worker "elsewhere" holds the cap's slots and is SIGKILLed while a
    call of a worker here waits; how long until that call starts."""
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    doomed = survivor = None
    try:
        engine = Engine(repo, cartridge, store)
        for n in range(args.cap):
            workflow_id = engine.start(f"slow {n}", "a ticket")
            (root / "marks" / f"slow-{workflow_id}").touch()
        env = {"PHASEGATE_HOSTNAME": "elsewhere"}
        doomed = spawn(repo, root / "doomed.log", args.cap, args.lease_ttl, env)
        until(lambda: sum(1 for s in store.slot_rows() if s["live"]) >= args.cap, args.timeout)
        urgent = engine.start("urgent", "a ticket", priority=1)
        survivor = spawn(repo, root / "survivor.log", 1, 60.0)
        until(lambda: any(e["type"] == "agent_waiting" for e in store.events(urgent)), args.timeout)
        stop(doomed, signal.SIGKILL)
        killed_at = store.clock.now()
        run = until(
            lambda: next((r for r in store.agent_runs(urgent) if r["started_at"]), None),
            args.timeout,
        )
    finally:
        for proc in (doomed, survivor):
            if proc is not None:
                stop(proc)
        store.close()
    return {
        "lease_ttl_s": args.lease_ttl,
        "recovery_s": round((run["started_at"] - killed_at).total_seconds(), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workflows", type=int, default=100)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--cap", type=int, default=3)
    parser.add_argument("--sleep", type=float, default=0.2, help="seconds each call sleeps")
    parser.add_argument("--lease-ttl", type=float, default=3.0, help="the killed worker's")
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        admin, server = server_url()
    except PostgresUnavailable as exc:
        print(f"no PostgreSQL to run on: {exc}")
        return 0
    name, url = fresh_schema(admin)
    try:
        with tempfile.TemporaryDirectory(prefix="phasegate-queues-") as tmp:
            root = Path(tmp)
            repo = make_project(root, url, args.cap, args.sleep)
            figures = {"queue": queue_run(repo, root, args)}
            figures["recovery"] = recovery_run(repo, root, args)
    finally:
        drop_schema(admin, name)
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    q, r = figures["queue"], figures["recovery"]
    print(
        f"{q['workflows']} workflows, {q['workers']} workers x {q['concurrency']} threads, "
        f"provider cap {q['cap']}: {q['wall_s']} s wall, {q['calls']} calls"
    )
    print(f"  most calls at once: {q['most_at_once']} (cap {q['cap']}); {q['waited']} waited")
    print(
        f"  claims out of priority order: {q['inversions']} of {q['pairs']} pairs "
        f"({q['threads']} threads claim at once); mean claim position "
        + ", ".join(f"{k} {v}" for k, v in q["mean_claim_position"].items())
    )
    print(
        f"  slots of a SIGKILLed worker back after {r['recovery_s']} s "
        f"(its lease: {r['lease_ttl_s']:g} s); tracebacks in the logs: {q['tracebacks']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
