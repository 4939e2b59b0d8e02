"""Benchmark: a person's decision to the worker's action on it.

    .venv/bin/python benchmarks/wakeup.py [--decisions 30] [--workflows 10] [--json]

A real ``phasegate worker`` (its default ``--poll`` unless ``--poll`` is given)
brings ``--workflows`` workflows (zero-latency agents, ``scale.make_project``,
no auto-merge) to ``wait``. Then, one at a time, a person's ``feedback
--no-advance`` is committed on a waiting workflow (``Engine.decide``, what the
CLI does) and the time is taken from the decision's commit (its ``decide``
returning) to the worker's first commit acting on it: the row leaving
``wait`` (the wait phase sends the workflow back to development with the
feedback). The workflow is given back to wait before it is decided on again;
decisions go round the workflows. ``resume`` has the same path (a decision
committed, a worker to wake) and is not timed separately.

Printed: median, p90 and max over the decisions, for SQLite and for
PostgreSQL (as in ``scale.py``: ``PHASEGATE_POSTGRES_URL``, else a throwaway
server; ``--no-postgres`` skips it). The target is a median of at most 50 ms.
Figures are printed, never judged.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from phasegate.config.cartridge import load_cartridge
from phasegate.core import decisions
from phasegate.runtime.engine import Engine, LeaseHeld
from phasegate.store import Store, open_store

sys.path.insert(0, str(Path(__file__).parent))
from scale import (  # noqa: E402  (a sibling script, not a package)
    file_workflows,
    fresh_store_url,
    make_project,
    postgres_server,
    spawn_worker,
    stop_worker,
)

_ROW = sa.table(
    "workflows",
    sa.column("id"),
    sa.column("current_phase"),
    sa.column("status"),
    sa.column("lease_owner"),
)
_PHASE = sa.select(_ROW.c.current_phase, _ROW.c.status, _ROW.c.lease_owner).where(
    _ROW.c.id == sa.bindparam("w_id")
)


def _phase(store: Store, workflow_id: str) -> tuple[str, str, str | None]:
    with store.reading() as conn:
        row = conn.execute(_PHASE, {"w_id": workflow_id}).one()
    return row.current_phase, row.status, row.lease_owner


def _until(probe: Any, timeout_s: float, look_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            return False
        time.sleep(look_s)
    return True


def _waiting(store: Store, workflow_id: str) -> bool:
    """In wait with no lease held: the worker's advance of it has ended."""
    return _phase(store, workflow_id) == ("wait", "waiting", None)


def measure(
    root: Path, *, decisions_n: int, workflows: int, poll_s: float | None, store_url: str | None
) -> dict[str, Any]:
    """Seconds from each decision's commit to the worker's commit acting on it."""
    repo = make_project(root, 0.0, store_url)
    ids = file_workflows(repo, workflows, auto_merge=False)
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    engine = Engine(repo, cartridge, store)
    log = root / "worker.log"
    worker = spawn_worker(repo, log, poll_s=poll_s)
    latencies: list[float] = []
    lost: list[str] = []
    try:
        for workflow_id in ids:
            if not _until(lambda w=workflow_id: _waiting(store, w), 300, 0.05):
                raise SystemExit(f"workflow {workflow_id} did not reach wait:\n{_tail(log)}")
        for i in range(decisions_n):
            workflow_id = ids[i % len(ids)]
            # Every workflow back in wait, not only the one decided on next: else the
            # worker's threads may all still be running earlier decisions' lifecycles
            # and the figure is the queue behind them, not the wake-up.
            for other in ids:
                _until(lambda w=other: _waiting(store, w), 300, 0.01)
            while True:
                try:
                    engine.decide(workflow_id, lambda c, i=i: decisions.feedback(c, f"more {i}"))
                    break
                except LeaseHeld:
                    time.sleep(0.005)  # the worker is looking at it: decide once it let go
            decided = time.perf_counter()
            if _until(lambda w=workflow_id: _phase(store, w)[0] != "wait", 60, 0.001):
                latencies.append(time.perf_counter() - decided)
            else:
                lost.append(workflow_id)
    finally:
        usage = stop_worker(worker)
        store.close()
    return {"latencies_s": latencies, "not_acted_on": lost, "worker": usage}


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


def _summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    if not ordered:
        return {}
    return {
        "median_s": statistics.median(ordered),
        "p90_s": ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))],
        "max_s": ordered[-1],
        "n": len(ordered),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=30, help="decisions timed")
    parser.add_argument("--workflows", type=int, default=10, help="workflows decided on")
    parser.add_argument("--poll", type=float, default=None, help="the worker's --poll (s)")
    parser.add_argument(
        "--no-postgres", action="store_true", help="SQLite only (no PostgreSQL figure)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    if args.decisions < 1 or args.workflows < 1:
        parser.error("--decisions and --workflows must be at least 1")
    results: dict[str, Any] = {"notes": [], "stores": {}}
    kwargs = dict(decisions_n=args.decisions, workflows=args.workflows, poll_s=args.poll)
    with postgres_server(not args.no_postgres, results["notes"]) as pg:
        for name, server in [("sqlite", None)] + ([("postgresql", pg)] if pg else []):
            with (
                tempfile.TemporaryDirectory(prefix="phasegate-wakeup-") as tmp,
                fresh_store_url(server) as url,
            ):
                run = measure(Path(tmp), store_url=url, **kwargs)
            results["stores"][name] = {**run, **_summary(run["latencies_s"])}
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    poll = "its default --poll" if args.poll is None else f"--poll {args.poll:g}"
    print(f"decision (feedback --no-advance) -> the worker's commit acting on it ({poll})")
    for name, run in results["stores"].items():
        if "median_s" not in run:
            print(f"  {name:10s} no decision was acted on within 60 s")
            continue
        print(
            f"  {name:10s} median {run['median_s'] * 1000:7.1f} ms   "
            f"p90 {run['p90_s'] * 1000:7.1f} ms   max {run['max_s'] * 1000:7.1f} ms   "
            f"({run['n']} decisions; target: median <= 50 ms, "
            f"{run['median_s'] / 0.050:.1f}x it)"
        )
        if run["not_acted_on"]:
            print(f"  {name:10s} not acted on within 60 s: {run['not_acted_on']}")
    for note in results["notes"]:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
