"""Benchmark: a store after a year of work stays as fast as an empty one.

    .venv/bin/python benchmarks/store_scale.py          # 10,000 workflows, 1,000,000 events
    .venv/bin/python benchmarks/store_scale.py --workflows 1000 --events 100000   # CI's short run
    .venv/bin/python benchmarks/store_scale.py --no-postgres --json

For SQLite and for PostgreSQL (as in ``scale.py``: ``PHASEGATE_POSTGRES_URL``,
else a throwaway server; ``--no-postgres`` skips it), a store is filled with
``--workflows`` workflows and ``--events`` events, written in bulk (one
``executemany`` on SQLite, ``COPY`` on PostgreSQL), not through the engine.
The rows are shaped like real ones: a year of workflows, most of them completed, some
cancelled or failed, a few waiting for a person, running under another
machine's lease, paused or queued; five repositories; milestones, agent runs
with tokens and cost, graph runs and their proposals, forge retries; events
spread unevenly, a few workflows holding tens of thousands of agent output
lines. PostgreSQL is then analyzed, as its autovacuum would.

Then it measures, beside the same on a store holding ``--peer-workflows``
workflows (the peer run: an all but empty store):

- the dashboard's board (``GET /`` through FastAPI's TestClient, a bearer token);
- a workflow's page (``GET /workflows/{id}``): the workflow with the most events,
  and a typical one;
- ``GET /metrics`` (a scrape: every figure read from the store), without a target;
- ``phasegate status`` as a process, and ``status --json``;
- a wake-up, as ``wakeup.py`` measures it: a person's decision to a real
  worker's commit acting on it, its workflows filed on the filled store.

Targets: board and page at most 300 ms, ``status`` at most 1 s, the wake-up's
median at most 50 ms. Printed: each figure (median of ``--runs`` runs),
the peer's, and their ratio. At full size (10,000 workflows and 1,000,000
events, or more) a missed target exits 1; a smaller run only prints.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from scale import (  # noqa: E402  (a sibling script, not a package)
    PHASEGATE,
    fresh_store_url,
    make_project,
    postgres_server,
)
from wakeup import measure as measure_wakeup  # noqa: E402

from phasegate.config.cartridge import load_cartridge  # noqa: E402
from phasegate.runtime.engine import Engine  # noqa: E402
from phasegate.store import Store, open_store  # noqa: E402

#: The targets, seconds (the wake-up's is its median).
TARGETS = {"board_s": 0.300, "page_s": 0.300, "status_s": 1.0, "wakeup_median_s": 0.050}
FULL = (10_000, 1_000_000)
TOKEN = "store-scale-benchmark-token"
REPOSITORIES = ("acme/api", "acme/web", "acme/mobile", "acme/infra", None)

#: How workflows end up, by weight: a year of work is mostly done, and what is not
#: (2 %: 200 of 10,000) is a team's work in hand, started in the last two weeks.
STATUSES: tuple[tuple[str, str, float], ...] = (
    ("completed", "completed", 88.0),
    ("cancelled", "development", 6.0),
    ("failed", "development", 2.5),
    ("failed", "merge", 1.5),
    ("waiting", "wait", 0.6),
    ("paused", "acceptance_verification", 0.2),
    ("awaiting_approval", "planning", 0.1),
    ("planning_timeout", "planning", 0.05),
    ("preparing", "preparation", 0.15),
    ("planning", "planning", 0.15),
    ("developing", "development", 0.4),
    ("pr_review", "pr_review", 0.2),
    ("reporting", "report", 0.05),
    ("merging", "merge", 0.05),
    ("verification_pending", "acceptance_verification", 0.05),
)
PHASES = (
    "preparation", "planning", "development", "pr_review", "report", "merge",
    "acceptance_verification",
)  # fmt: skip
ROLES = ("plan", "plan_review", "build", "review", "verification")
RUNNERS = ("claude", "codex", "gemini", "opencode")
MILESTONE_KINDS = ("issue_created", "branch_created", "pr_opened", "checks", "review", "merged")
LINE = "    self.assertEqual(result.total, expected_total)  # the totals agree after the change\n"
PLAN = (
    "1. Read the module and its tests to see where the totals are summed.\n"
    "2. Add the missing rounding step, with a test for the boundary case.\n"
    "3. Run the suite; update the changelog.\n"
) * 8


# -- the fill ---------------------------------------------------------------------------


class Rows:
    """Every row of a filled store, as plain tuples in the tables' column order."""

    def __init__(self) -> None:
        self.workflows: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str, datetime]] = []
        self.milestones: list[dict[str, Any]] = []
        self.agent_runs: list[dict[str, Any]] = []
        self.graph_runs: list[dict[str, Any]] = []
        self.proposals: list[dict[str, Any]] = []


def _event_counts(rng: random.Random, workflows: int, events: int) -> list[int]:
    """Events per workflow summing to ``events``: most near the mean, a long tail
    (one workflow holds 5 % of all), as agents that talk a lot make it."""
    weights = [rng.paretovariate(1.6) for _ in range(workflows)]
    heavy = 0.05 * events
    scale = (events - heavy) / sum(weights)
    counts = [max(6, int(w * scale)) for w in weights]
    counts[0] += int(heavy)
    counts[-1] += events - sum(counts)  # exact, whatever the rounding took
    if counts[-1] < 6:
        counts[0] += counts[-1] - 6
        counts[-1] = 6
    return counts


def make_rows(workflows: int, events: int, now: datetime, seed: int = 24) -> Rows:
    """The rows of a store of ``workflows`` workflows and ``events`` events."""
    rng = random.Random(seed)
    rows = Rows()
    counts = _event_counts(rng, workflows, events)
    statuses = [s[:2] for s in STATUSES]
    weights = [s[2] for s in STATUSES]
    year = 365 * 86400
    for n in range(workflows):
        wid = f"{n:08x}"
        status, phase = rng.choices(statuses, weights)[0]
        if n == 0:
            status, phase = "completed", "completed"  # the heavy one is done
        running = status not in ("completed", "cancelled", "failed")
        # What is not finished was started lately: older work was done or cancelled.
        created = now - timedelta(seconds=rng.uniform(3600, 14 * 86400 if running else year))
        span = timedelta(seconds=rng.uniform(300, 6 * 3600))
        ended = min(now, created + span)
        repository = rng.choice(REPOSITORIES)
        rounds = rng.choice((1, 1, 1, 2, 3))
        leased = status in ("developing", "pr_review", "planning", "merging") and rng.random() < 0.6
        report = {
            "workflow": wid, "title": f"Fix the totals in module {n}", "dev_round": rounds,
            "changes": {"files": 3, "insertions": 40, "deletions": 7},
            "checks": {"passed": 2, "total": 2, "attempts": 1, "results": []},
            "review": {"rounds": 1, "verdict": "approve", "comments": "Looks right."},
            "usage": {"tokens": 52000, "cost_usd": 0.41, "runs": 8}, "content_language": "en",
        }  # fmt: skip
        state = {
            "profile": {
                "name": rng.choice(("review", "trusted", "strict")),
                "auto_merge": False,
                "auto_reversion_from_apply": 1.0,
                "auto_strategy_revision": 1.0,
                "autonomy": "propose",
                "graduation": True,
            },
            "graph_mode": n % 33 == 0,
            "cartridge_sha": f"{rng.getrandbits(160):040x}",
            "base_sha": f"{rng.getrandbits(160):040x}",
            "plan": PLAN,
            "reversion_count": 1 if rounds > 2 else 0,
            "report": report if phase in ("wait", "merge", "completed") else None,
            "merge_approved": status == "completed",
            "merge_approved_by": "alice" if status == "completed" else None,
        }
        rows.workflows.append(
            {
                "id": wid, "title": f"Fix the totals in module {n}",
                "ticket": f"The totals of module {n} are off by one cent.\n" * 5,
                "repo_path": f"/srv/clones/{repository or 'local'}", "base_branch": "main",
                "current_phase": phase, "status": status, "current_round": rounds,
                "dev_round": rounds, "branch_name": f"phasegate/{wid}-fix-totals",
                "worktree_path": None if not running else f"/srv/worktrees/{wid}",
                "issue_number": n + 1, "pr_number": n + 1 if phase != "preparation" else None,
                "merge_sha": f"{rng.getrandbits(160):040x}" if status == "completed" else None,
                "auto_merge": False, "user_feedback": None, "content_language": "en",
                "error": "checks failed 3 times: test_totals" if status == "failed" else None,
                "state": json.dumps(state), "version": 8 + rounds * 6,
                "lease_owner": f"build-{n % 3}:4242:{wid}" if leased else None,
                "lease_expires_at": now + timedelta(seconds=50) if leased else None,
                "fence": 3, "created_at": created,
                "updated_at": now - timedelta(seconds=rng.uniform(1, 900)) if running else ended,
                "completed_at": ended if status == "completed" else None,
                "parent_workflow_id": f"{n - 1:08x}" if n % 97 == 96 else None,
                "repository": repository,
                "due_at": now + timedelta(minutes=5) if status == "paused" else None,
            }
        )  # fmt: skip
        _workflow_children(rng, rows, wid, created, ended, rounds, counts[n], status)
    rows.events.sort(key=lambda e: e[3])  # as workflows running side by side interleave
    return rows


def _workflow_children(
    rng: random.Random,
    rows: Rows,
    wid: str,
    created: datetime,
    ended: datetime,
    rounds: int,
    n_events: int,
    status: str,
) -> None:
    """One workflow's milestones, agent runs, graph run and exactly ``n_events`` events."""
    span = max(1.0, (ended - created).total_seconds())

    def at(fraction: float) -> datetime:
        return created + timedelta(seconds=span * min(1.0, fraction))

    events: list[tuple[str, dict[str, Any]]] = [("decision", {"action": "start", "by": "alice"})]
    for i, phase in enumerate(PHASES[: 3 + rounds]):
        events.append(("phase_change", {"phase": phase}))
        kind = MILESTONE_KINDS[i % len(MILESTONE_KINDS)]
        key = f"{wid}:{phase}:{kind}:r{rounds}:a0:{i}"
        rows.milestones.append(
            {
                "workflow_id": wid, "kind": kind, "phase": phase, "round": rounds,
                "attempt": 0, "status": "completed", "dedupe_key": key,
                "summary": f"{kind}: done", "data": json.dumps({"result": {"number": i}}),
                "created_at": at(i / 8), "updated_at": at(i / 8 + 0.01),
            }
        )  # fmt: skip
        events.append(
            ("milestone_updated", {"kind": kind, "phase": phase, "status": "completed", "key": key})
        )
    for i, role in enumerate(ROLES[: 2 + rounds]):
        runner = RUNNERS[(i + len(wid)) % len(RUNNERS)]
        duration = rng.uniform(5, 600)
        rows.agent_runs.append(
            {
                "workflow_id": wid, "phase": PHASES[min(i + 1, 6)], "role": role,
                "session_line": role, "runner": runner, "round": rounds, "attempt": 0,
                "outcome": "ok" if rng.random() < 0.95 else "failed",
                "error_kind": None, "error": None,
                "input_tokens": rng.randint(2_000, 90_000),
                "output_tokens": rng.randint(200, 9_000),
                "cost_usd": round(rng.uniform(0.01, 0.9), 4), "duration_s": duration,
                "session_id": f"s-{wid}-{i}", "created_at": at((i + 1) / 8),
                "model": ("claude-sonnet-4-5", "gpt-5-codex", "")[i % 3],
            }
        )  # fmt: skip
        events.append(
            (
                "agent_started",
                {"role": role, "phase": PHASES[min(i + 1, 6)], "round": rounds, "runner": runner},
            )
        )
        events.append(("agent_finished", {"role": role, "outcome": "ok", "error": None}))
    if rng.random() < 0.05:
        events.append(
            (
                "forge_retry",
                {"call": "GET /repos/acme/api/pulls/7", "status": 502, "attempt": 2, "wait_s": 0.5},
            )
        )
    if status in ("waiting", "paused", "awaiting_approval"):
        events.append(("needs_you", {"status": status, "phase": "wait"}))
    if wid.endswith("0") and int(wid, 16) % 33 == 0 or status == "awaiting_approval":
        _graph_run(rows, wid, at(0.3), status)
    # The rest: agent output, a line an event, within the last agent's run.
    last_start = max(i for i, (kind, _data) in enumerate(events) if kind == "agent_started")
    output = max(0, n_events - len(events))
    lines = [
        ("agent_output", {"role": "build", "phase": "development", "round": rounds, "text": LINE})
    ] * output
    events[last_start + 1 : last_start + 1] = lines
    events = events[:n_events] if len(events) > n_events else events
    step = 1.0 / max(1, len(events))
    rows.events.extend(
        (wid, kind, json.dumps(data), at(i * step)) for i, (kind, data) in enumerate(events)
    )


def _graph_run(rows: Rows, wid: str, when: datetime, status: str) -> None:
    run_id = f"run-{wid}"
    calls = [{"index": i, "role": "plan", "thread": "t1", "response": PLAN[:600]} for i in range(6)]
    rows.graph_runs.append(
        {
            "run_id": run_id, "workflow_id": wid, "date": when.date().isoformat(),
            "record": json.dumps({"run_id": run_id, "calls": calls, "proposals": []}),
            "created_at": when,
        }
    )  # fmt: skip
    if status == "awaiting_approval":
        rows.proposals.append(
            {
                "id": f"p{wid}", "record_id": f"{run_id}/draft_pr_create/1", "run_id": run_id,
                "position": 1, "workflow_id": wid, "kind": "draft_pr_create",
                "title": "Open the draft pull request", "payload": "{}", "evidence": "{}",
                "attempts": 1, "self_modification": False, "paths": "[]", "mode": "propose",
                "status": "proposed", "decided_by": None, "decided_at": None,
                "decision_seq": None, "reason": None, "created_at": when,
            }
        )  # fmt: skip


def started_under(rows: Rows, repo: Path) -> Rows:
    """``rows``, the workflows in hand started under ``repo``'s committed cartridge
    (the older ones under earlier texts of it), as in a team's store: what
    ``status`` checks before it trusts the cartridge unvalidated."""
    sha = subprocess.run(
        ["git", "rev-parse", "HEAD:phasegate.toml"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for row in rows.workflows:
        if row["status"] not in ("completed", "cancelled", "failed"):
            state = json.loads(row["state"])
            state["cartridge_sha"] = sha
            row["state"] = json.dumps(state)
    return rows


def fill(store: Store, rows: Rows) -> float:
    """Write ``rows`` into ``store`` in bulk; returns the seconds it took."""
    started = time.perf_counter()
    raw = store.engine.raw_connection()
    try:
        if store.dialect.name == "sqlite":
            _fill_sqlite(raw, rows)
        else:
            _fill_postgres(raw, rows)
    finally:
        raw.close()
    return time.perf_counter() - started


def _tables(rows: Rows) -> list[tuple[str, list[str], list[tuple[Any, ...]]]]:
    out: list[tuple[str, list[str], list[tuple[Any, ...]]]] = []
    for name in ("workflows", "milestones", "agent_runs", "graph_runs", "proposals"):
        dicts = getattr(rows, name)
        if dicts:
            columns = list(dicts[0])
            out.append((name, columns, [tuple(d[c] for c in columns) for d in dicts]))
    out.append(("events", ["workflow_id", "type", "data", "created_at"], rows.events))
    return out


def _sqlite_value(value: Any) -> Any:
    # As SQLAlchemy stores a DateTime on SQLite: naive UTC text.
    if isinstance(value, datetime):
        return (
            value.astimezone(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
        )
    return value


def _fill_sqlite(raw: Any, rows: Rows) -> None:
    cursor = raw.cursor()
    cursor.execute("BEGIN IMMEDIATE")
    for name, columns, values in _tables(rows):
        marks = ", ".join("?" for _ in columns)
        cursor.executemany(
            f"INSERT INTO {name} ({', '.join(columns)}) VALUES ({marks})",
            ([_sqlite_value(v) for v in row] for row in values),
        )
    cursor.execute("COMMIT")


def _fill_postgres(raw: Any, rows: Rows) -> None:
    with raw.cursor() as cursor:
        for name, columns, values in _tables(rows):
            with cursor.copy(f"COPY {name} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in values:
                    copy.write_row(row)
    raw.commit()
    raw.autocommit = True
    with raw.cursor() as cursor:
        cursor.execute("ANALYZE")  # what autovacuum does after a bulk load
    raw.autocommit = False


# -- the measures -----------------------------------------------------------------------


def _timed(act: Callable[[], Any], runs: int) -> float:
    """The median seconds of ``runs`` calls of ``act``, after one not counted."""
    act()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        act()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _heaviest(store: Store) -> tuple[str, str]:
    """The workflow with the most events, and one with the median count."""
    import sqlalchemy as sa

    with store.reading() as conn:
        counts = conn.execute(
            sa.text("SELECT workflow_id, count(*) AS n FROM events GROUP BY workflow_id ORDER BY n")
        ).all()
    return counts[-1][0], counts[len(counts) // 2][0]


def measure_store(root: Path, url: str, rows: Rows, runs: int, decisions: int) -> dict[str, Any]:
    """Fill the store at ``url`` with ``rows`` and time what a person and a worker do."""
    from fastapi.testclient import TestClient

    from phasegate.web.app import create_app
    from phasegate.web.auth import Access

    result: dict[str, Any] = {
        "workflows": len(rows.workflows),
        "events": len(rows.events),
    }
    repo = make_project(root / "board", 0.0, url)
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    try:
        result["fill_s"] = fill(store, started_under(rows, repo))
        heavy, typical = _heaviest(store)
        engine = Engine(repo, cartridge, store)
        app = create_app(engine, Access(token=TOKEN, user="bench"))
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        with TestClient(app) as client:

            def get(path: str) -> Callable[[], None]:
                def act() -> None:
                    answer = client.get(path, headers=bearer)
                    if answer.status_code != 200:
                        raise SystemExit(f"GET {path}: {answer.status_code} {answer.text[:300]}")

                return act

            result["board_s"] = _timed(get("/"), runs)
            result["page_s"] = _timed(get(f"/workflows/{heavy}"), runs)
            result["typical_page_s"] = _timed(get(f"/workflows/{typical}"), runs)
            result["metrics_s"] = _timed(get("/metrics"), runs)
        status = [str(PHASEGATE), "status", "--repo", str(repo)]
        result["status_s"] = _timed(lambda: _run(status), max(1, runs // 2))
        result["status_json_s"] = _timed(lambda: _run([*status, "--json"]), max(1, runs // 2))
    finally:
        store.close()
    woken = measure_wakeup(
        root / "wakeup", decisions_n=decisions, workflows=3, poll_s=None, store_url=url
    )
    latencies = woken["latencies_s"]
    result["wakeup_median_s"] = statistics.median(latencies) if latencies else float("inf")
    result["wakeup_max_s"] = max(latencies) if latencies else float("inf")
    return result


def _run(command: list[str]) -> None:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr[-2000:]}")


@contextmanager
def _store_url(name: str, server: str | None, root: Path) -> Iterator[str]:
    """A fresh store's URL: a SQLite file under ``root``, or a schema on ``server``."""
    if name == "sqlite":
        yield f"sqlite:///{root / 'store.db'}"
        return
    with fresh_store_url(server) as url:
        assert url is not None
        yield url


# -- the report ---------------------------------------------------------------------------


def misses(run: dict[str, Any]) -> list[str]:
    """The targets ``run`` missed, named."""
    return [
        f"{key} {run[key] * 1000:.0f} ms > {limit * 1000:.0f} ms"
        for key, limit in TARGETS.items()
        if run[key] > limit
    ]


def report(results: dict[str, Any]) -> None:
    shown = (
        ("board_s", "board (GET /)"),
        ("page_s", "page, most events"),
        ("typical_page_s", "page, typical"),
        ("metrics_s", "GET /metrics"),
        ("status_s", "phasegate status"),
        ("status_json_s", "status --json"),
        ("wakeup_median_s", "wake-up median"),
        ("wakeup_max_s", "wake-up max"),
    )
    for name, pair in results["stores"].items():
        big, peer = pair["filled"], pair["peer"]
        print(
            f"{name}: {big['workflows']:,} workflows, {big['events']:,} events "
            f"(filled in {big['fill_s']:.1f} s) vs a store of {peer['workflows']:,}"
        )
        for key, label in shown:
            target = TARGETS.get(key)
            bar = f"  (target <= {target * 1000:.0f} ms)" if target else ""
            ratio = big[key] / peer[key] if peer[key] else float("inf")
            print(
                f"  {label:20s} {big[key] * 1000:8.1f} ms   peer {peer[key] * 1000:7.1f} ms   "
                f"{ratio:5.2f}x{bar}"
            )
    for note in results["notes"]:
        print(f"note: {note}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=FULL[0], help="workflows filled")
    parser.add_argument("--events", type=int, default=FULL[1], help="events filled")
    parser.add_argument("--peer-workflows", type=int, default=10, help="the peer store's size")
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each read")
    parser.add_argument("--decisions", type=int, default=12, help="wake-ups timed")
    parser.add_argument(
        "--stores", nargs="+", choices=("sqlite", "postgresql"), default=["sqlite", "postgresql"]
    )
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    if args.workflows < 10 or args.events < 10 * args.workflows:
        parser.error("--workflows must be at least 10, --events at least 10 a workflow")
    now = datetime.now(UTC)
    filled = make_rows(args.workflows, args.events, now)
    peer = make_rows(args.peer_workflows, 60 * args.peer_workflows, now)
    results: dict[str, Any] = {"notes": [], "stores": {}, "targets": TARGETS}
    wanted = "postgresql" in args.stores and not args.no_postgres
    with postgres_server(wanted, results["notes"]) as pg:
        for name in [s for s in args.stores if s == "sqlite" or (s == "postgresql" and pg)]:
            pair: dict[str, Any] = {}
            for which, rows in (("peer", peer), ("filled", filled)):
                print(f"measuring {name}, {which} store ...", file=sys.stderr, flush=True)
                with tempfile.TemporaryDirectory(prefix="phasegate-store-scale-") as tmp:
                    root = Path(tmp)
                    with _store_url(name, pg, root) as url:
                        pair[which] = measure_store(root, url, rows, args.runs, args.decisions)
            results["stores"][name] = pair
    judged = args.workflows >= FULL[0] and args.events >= FULL[1]
    missed = {
        name: misses(pair["filled"])
        for name, pair in results["stores"].items()
        if misses(pair["filled"])
    }
    results["missed"] = missed
    if args.json:
        print(json.dumps(results, indent=2, default=str))
    else:
        report(results)
        for name, what in missed.items():
            print(f"{name}: missed {'; '.join(what)}" + ("" if judged else " (not judged)"))
    return 1 if judged and missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
