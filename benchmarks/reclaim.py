"""Benchmark: a worker starting after a crash reclaims the dead worker's workflows
(the target: 1,000 in flight reclaimed in 5 s at most).

    .venv/bin/python benchmarks/reclaim.py [--workflows 1000] [--concurrency 16 1] [--json]

The sample project of ``phasegate demo`` (real git, a real SQLite file) with
N workflows in flight: each waits for a person (phase wait, status waiting),
its lease held, unexpired, by a worker of this host that was SIGKILLed (a pid
with no process). A fresh in-process ``run_worker`` starts. Printed per
concurrency: the seconds until the dead worker's leases are all released
(``free_gone_leases``: one statement; from then any worker, on any host, may
take them), the seconds until every workflow is reclaimed (the new worker
looked at it: the wait phase's reads, ``Engine.idle_at``, or an advance under
its lease when there was something to do), the milliseconds per workflow,
and the ratio to concurrency 1 for the same N. Every figure is measured in this one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store
from phasegate.store import tables as t
from phasegate.tools.demo import make_sample_project


def _dead_owner() -> str:
    """A lease owner of this host whose process is gone, as a SIGKILLed worker leaves."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return f"{os.uname().nodename}:{gone.pid}:dead"


def _in_flight(store: Store, repo: Path, n: int, owner: str) -> list[str]:
    """N workflows waiting for a person, their leases held by ``owner`` for an hour."""
    ids = [
        store.create_workflow(
            title=f"feature {i}",
            ticket="ticket",
            repo_path=str(repo),
            base_branch="main",
            auto_merge=False,
            content_language="en",
            state={},
        )
        for i in range(n)
    ]
    c = t.workflows.c
    with store.transaction() as conn:
        conn.execute(
            t.workflows.update()
            .where(c.id.in_(ids))
            .values(
                current_phase="wait",
                status="waiting",
                lease_owner=owner,
                lease_expires_at=store.clock.now() + timedelta(hours=1),
                fence=1,
            )
        )
    return ids


def _freed(store: Store, ids: list[str]) -> int:
    """How many of ``ids`` the dead worker no longer holds (their fence moved past its 1)."""
    c = t.workflows.c
    with store.reading() as conn:
        return int(
            conn.execute(sa.select(sa.func.count()).where(c.id.in_(ids), c.fence > 1)).scalar_one()
        )


def _counting_looks(engine: Engine) -> set[str]:
    """The workflows ``engine`` has looked at so far (a look at a waiting one takes no
    lease and writes nothing, so only the engine itself can tell)."""
    looked: set[str] = set()
    idle_at, advance = engine.idle_at, engine.advance

    def look(workflow_id: str) -> int | None:
        version = idle_at(workflow_id)
        if version is not None:
            looked.add(workflow_id)
        return version

    def advanced(workflow_id: str, **kwargs: Any) -> dict[str, Any]:
        row = advance(workflow_id, **kwargs)
        looked.add(workflow_id)
        return row

    engine.idle_at = look  # type: ignore[method-assign]
    engine.advance = advanced  # type: ignore[method-assign]
    return looked


def measure(n: int, concurrency: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "sample"
        make_sample_project(repo)
        cartridge = load_cartridge(repo)
        store = open_store(cartridge.store_url(repo))
        ids = _in_flight(store, repo, n, _dead_owner())
        engine = Engine(repo, cartridge, store)
        looked = _counting_looks(engine)
        worker = threading.Thread(
            target=engine.run_worker, kwargs={"poll_s": 1.0, "concurrency": concurrency}
        )
        started = time.perf_counter()
        worker.start()
        freed_s = None
        while True:
            if freed_s is None and _freed(store, ids) == n:
                freed_s = time.perf_counter() - started
            if len(looked) == n:
                break
            time.sleep(0.005)
        seconds = time.perf_counter() - started
        engine.shutdown.set()
        worker.join()
        store.close()
    return {
        "workflows": n,
        "concurrency": concurrency,
        "leases_free_s": round(freed_s or seconds, 3),
        "seconds": round(seconds, 3),
        "ms_per_workflow": round(1000 * seconds / n, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 1])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [measure(args.workflows, c) for c in args.concurrency]
    one = next((r for r in rows if r["concurrency"] == 1), None)
    for row in rows:
        row["vs_concurrency_1"] = round(one["seconds"] / row["seconds"], 2) if one else None
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"reclaim after a crash: {args.workflows} workflows in flight (wait), dead leases")
    print("  leases free: the dead worker's leases released (every worker may take them)")
    print("  reclaimed:   each also looked at by the new worker (its wait phase run)")
    print(
        f"{'concurrency':>12} {'leases free s':>14} {'reclaimed s':>12} {'ms/wf':>7} {'vs c=1':>7}"
    )
    for row in rows:
        ratio = f"{row['vs_concurrency_1']:.2f}x" if row["vs_concurrency_1"] else "-"
        print(
            f"{row['concurrency']:>12} {row['leases_free_s']:>14.3f} {row['seconds']:>12.2f} "
            f"{row['ms_per_workflow']:>7.2f} {ratio:>7}"
        )


if __name__ == "__main__":
    main()
