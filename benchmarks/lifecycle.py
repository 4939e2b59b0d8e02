"""Benchmarks: one demo lifecycle, and the single commit path against raw sqlite3.

    .venv/bin/python benchmarks/lifecycle.py [--runs 3] [--commits 500] [--json]

(a) The demo lifecycle: the sample project of ``phasegate demo`` taken from
    ``start`` to ``completed`` in-process (scripted agents, real git, real
    checks, a real SQLite file), each run in a fresh temporary directory; and
    the whole ``phasegate demo --dir`` command as a user runs it (process
    start, imports, migrations included). The same sample through the
    development graph (``demo --graph``: eight agent calls, each answer kept
    as it arrives, the plan's answers replayed in development, the check arm's
    scratch worktree, the apply arm), against the classic lifecycle as its
    peer; and the offline replay of that graph run.

(b) The commit path: ``commit_phase_result`` on a real SQLite file, each commit
    carrying one milestone and one event. Its peer baseline is the same
    transaction written by hand with the standard ``sqlite3`` module against the
    same schema with the same settings as the store (WAL, synchronous=FULL,
    foreign keys, a busy timeout, ``BEGIN IMMEDIATE``): one UPDATE of the
    workflow row (fenced on its version), one INSERT into milestones, one INSERT
    into events. A second raw variant runs every statement phasegate actually
    issues per commit (the UPDATE with ``RETURNING`` the new row, the milestone
    as an ``INSERT … ON CONFLICT (dedupe_key) DO UPDATE``, its
    ``milestone_updated`` event beside the result's), so the ratio splits into
    "more SQL" and "SQLAlchemy". The three are interleaved commit by commit so
    that machine noise hits them alike. What the caller does before a commit (the
    PhaseResult, the context of the last version) is not timed; the
    transaction's own work is, on both sides (its parameters, JSON, timestamps,
    the returned row). Each commit is timed twice: wall time
    (``perf_counter``; mostly the fsyncs of synchronous=FULL) and the process's
    CPU time (``process_time``; what the code costs); the target is phasegate's
    CPU per commit at most 3x raw sqlite3's.

(c) Git calls: one demo lifecycle (as in (a)) with every git process phasegate
    starts recorded (``phasegate.git.command.recording``), counted by subcommand. Its
    *git floor* is the same git work done in the fewest calls the lifecycle's
    own choices allow: every call that may change something (anything but a
    read: ``status``, ``diff``, ``rev-parse``, ``ls-files``, ...) plus each read
    whose answer is not otherwise known — the first of identical reads (same
    arguments, directory and input) with no changing call and no agent run
    between them; a read the ref ledger or the worktree lock makes for itself
    (``bookkeeping``) is never in the floor. Its time is those calls' measured
    wall times summed. Printed: calls, floor calls and their ratio, git seconds,
    floor seconds and their ratio. The floor is generous to phasegate: a read
    another read already answered in other words (``rev-parse`` after
    ``for-each-ref``) is still counted in it.

Prints a plain-text table (or JSON with ``--json``). Medians are reported
because a single fsync or GC pause should not move the figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy

from phasegate.agents import service
from phasegate.config.cartridge import load_cartridge
from phasegate.core.contract import EventWrite, MilestoneWrite, PhaseResult, WorkflowContext
from phasegate.git import guard
from phasegate.git.command import READ_SUBCOMMANDS, GitCall, recording
from phasegate.phases.graph_mode.harness import replay_check
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store
from phasegate.tools.demo import DEMO_TICKET, DEMO_TITLE, make_sample_project

_TIMESTAMP = "%Y-%m-%d %H:%M:%S.%f"  # how SQLAlchemy stores a DateTime in SQLite


# -- (a) the demo lifecycle ---------------------------------------------------------


def _demo_in_process(root: Path, graph: bool = False) -> dict[str, float]:
    """One demo lifecycle in ``root``; seconds per step. Raises if it does not complete.

    With ``graph`` the sample of ``phasegate demo --graph``: its run through the
    development graph, then ``replay_s``, the recorded run replayed offline."""
    started = time.perf_counter()
    repo = make_sample_project(root / "calc", graph=graph)
    made = time.perf_counter()
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    opened = time.perf_counter()
    try:
        engine = Engine(repo, cartridge, store)
        workflow_id = engine.start(DEMO_TITLE, DEMO_TICKET)
        row = engine.advance(workflow_id)
        done = time.perf_counter()
        if row["status"] != "completed":
            raise SystemExit(f"demo workflow ended {row['status']}: {row.get('error')}")
        if graph:
            record = store.run(f"{workflow_id}-g1")["record"]
            replay_started = time.perf_counter()
            if not replay_check(record).identical:
                raise SystemExit("the graph run did not replay identically")
            replayed = time.perf_counter() - replay_started
            return {"graph_lifecycle_s": done - opened, "graph_replay_s": replayed}
    finally:
        store.close()
    return {
        "sample_project_s": made - started,
        "open_store_s": opened - made,
        "lifecycle_s": done - opened,
        "total_s": done - started,
    }


def _demo_cli(root: Path) -> float:
    """``phasegate demo --dir`` as a subprocess; wall seconds."""
    exe = Path(sys.executable).parent / "phasegate"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "phasegate.cli"]
    started = time.perf_counter()
    proc = subprocess.run(
        [*command, "demo", "--json", "--dir", str(root / "calc")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0 or json.loads(proc.stdout)["status"] != "completed":
        raise SystemExit(f"`phasegate demo` failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return elapsed


def bench_lifecycle(runs: int, cli: bool) -> dict[str, Any]:
    samples: dict[str, list[float]] = {}
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="phasegate-bench-") as tmp:
            for key, value in _demo_in_process(Path(tmp)).items():
                samples.setdefault(key, []).append(value)
        with tempfile.TemporaryDirectory(prefix="phasegate-bench-") as tmp:
            for key, value in _demo_in_process(Path(tmp), graph=True).items():
                samples.setdefault(key, []).append(value)
        if cli:
            with tempfile.TemporaryDirectory(prefix="phasegate-bench-") as tmp:
                samples.setdefault("cli_demo_s", []).append(_demo_cli(Path(tmp)))
    return {key: _stats(values) for key, values in samples.items()}


# -- (b) the commit path ------------------------------------------------------------


def _new_workflow(store: Store) -> str:
    return store.create_workflow(
        title="bench",
        ticket="benchmark the commit path",
        repo_path="/nonexistent",
        base_branch="main",
        auto_merge=False,
        content_language="en",
    )


class _PhasegateCommits:
    """``commit_phase_result`` through the Store, exactly as the engine calls it."""

    label = "phasegate commit_phase_result"

    def __init__(self, path: Path) -> None:
        self.store = open_store(f"sqlite:///{path}")
        self.ctx: WorkflowContext = self.store.load_context(_new_workflow(self.store))
        self.row: dict[str, Any] | None = None
        self.result: PhaseResult | None = None

    def prepare(self, i: int) -> None:
        """What the caller does before a commit, untimed: the phase's result, and the
        context fenced on the last commit's version (as after a reload)."""
        if self.row is not None:
            self.ctx = dataclasses.replace(
                self.ctx, version=self.row["version"], state=self.row["state"]
            )
        self.result = PhaseResult(
            "retry",
            state={"bench_round": i},
            milestones=(MilestoneWrite("bench", round=i, summary=f"commit {i}", data={"i": i}),),
            events=(EventWrite("bench", {"i": i}),),
        )

    def commit(self, i: int) -> None:
        self.row = self.store.commit_phase_result(self.ctx, self.result)

    def close(self) -> None:
        self.store.close()


class _RawCommits:
    """The same transaction by hand with ``sqlite3``, on the same schema and settings.

    ``full``: the statements phasegate issues, as it issues them (the UPDATE
    returning the row, the milestone's upsert, its ``milestone_updated`` event);
    else the floor: UPDATE + 2 plain INSERTs.
    """

    def __init__(self, path: Path, *, full: bool) -> None:
        self.full = full
        self.label = (
            "raw sqlite3, phasegate's statements (4)" if full else "raw sqlite3: UPDATE + 2 INSERTs"
        )
        store = open_store(f"sqlite:///{path}")  # the schema, from the same migrations
        self.workflow_id = _new_workflow(store)
        store.close()
        self.conn = sqlite3.connect(path, timeout=30, isolation_level=None)
        # The store's own pragmas (store/_sqlite.py): synchronous=FULL, as the store commits.
        for pragma in (
            "journal_mode=WAL",
            "busy_timeout=30000",
            "foreign_keys=ON",
            "synchronous=FULL",
        ):
            self.conn.execute(f"PRAGMA {pragma}")
        self.version = 0
        self.state: dict[str, Any] = {}

    def prepare(self, i: int) -> None:
        return None  # the transaction's parameters are its own work, timed

    def commit(self, i: int) -> None:
        now = datetime.now(UTC).strftime(_TIMESTAMP)
        self.state = {**self.state, "bench_round": i}
        key = f"{self.workflow_id}:preparation:bench:r{i}:a0"
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            update = (
                "UPDATE workflows SET current_phase = ?, status = ?, error = NULL, state = ?, "
                "version = ?, updated_at = ? WHERE id = ? AND version = ?"
            )
            params = (
                "preparation",
                "preparing",
                json.dumps(self.state),
                self.version + 1,
                now,
                self.workflow_id,
                self.version,
            )
            if self.full:
                row = conn.execute(update + " RETURNING *", params).fetchone()
                if row is None:
                    raise RuntimeError("stale version")
            elif conn.execute(update, params).rowcount != 1:
                raise RuntimeError("stale version")
            conn.execute(
                "INSERT INTO milestones (workflow_id, kind, phase, round, attempt, status, "
                "dedupe_key, summary, data, created_at, updated_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                + (
                    " ON CONFLICT (dedupe_key) DO UPDATE SET status = excluded.status, "
                    "summary = excluded.summary, data = excluded.data, "
                    "updated_at = excluded.updated_at"
                    if self.full
                    else ""
                ),
                (
                    self.workflow_id,
                    "bench",
                    "preparation",
                    i,
                    0,
                    "completed",
                    key,
                    f"commit {i}",
                    json.dumps({"i": i}),
                    now,
                    now,
                ),
            )
            events = [("bench", {"i": i})]
            if self.full:
                events.insert(
                    0,
                    (
                        "milestone_updated",
                        {
                            "kind": "bench",
                            "phase": "preparation",
                            "status": "completed",
                            "key": key,
                        },
                    ),
                )
            conn.executemany(
                "INSERT INTO events (workflow_id, type, data, created_at) VALUES (?, ?, ?, ?)",
                [(self.workflow_id, type_, json.dumps(data), now) for type_, data in events],
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self.version += 1

    def close(self) -> None:
        self.conn.close()


def bench_commits(commits: int, warmup: int, directory: Path) -> dict[str, Any]:
    """Interleave the three writers commit by commit; for each, wall seconds per
    commit (``median_s``, …) and CPU seconds per commit (``cpu``: its stats), with
    phasegate's medians over this writer's (``phasegate_ratio``, ``cpu_ratio``)."""
    writers: Sequence[Any] = (
        _PhasegateCommits(directory / "phasegate.db"),
        _RawCommits(directory / "raw.db", full=False),
        _RawCommits(directory / "raw-full.db", full=True),
    )
    walls: list[list[float]] = [[] for _ in writers]
    cpus: list[list[float]] = [[] for _ in writers]
    try:
        for i in range(warmup + commits):
            for writer, wall, cpu in zip(writers, walls, cpus, strict=True):
                writer.prepare(i)
                cpu_started = time.process_time_ns()
                started = time.perf_counter_ns()
                writer.commit(i)
                ended = time.perf_counter_ns()
                cpu_ended = time.process_time_ns()
                if i >= warmup:
                    wall.append((ended - started) / 1e9)
                    cpu.append((cpu_ended - cpu_started) / 1e9)
    finally:
        for writer in writers:
            writer.close()
    out = {
        w.label: {**_stats(wall), "cpu": _stats(cpu)}
        for w, wall, cpu in zip(writers, walls, cpus, strict=True)
    }
    pg = out[writers[0].label]
    for w in writers[1:]:
        out[w.label]["phasegate_ratio"] = pg["median_s"] / out[w.label]["median_s"]
        out[w.label]["cpu_ratio"] = pg["cpu"]["median_s"] / out[w.label]["cpu"]["median_s"]
    return out


# -- (c) git calls --------------------------------------------------------------------

#: Subcommands that only read (``branch --list`` and a one-name ``symbolic-ref`` too):
#: those that never change a checkout or a ref (``phasegate.git.command``), and the reads
#: among those that may (``config``, ``diff`` and ``remote`` as the lifecycle calls them).
_GIT_READS = READ_SUBCOMMANDS | {"config", "diff", "remote"}


def _reads(call: GitCall) -> bool:
    rest = call.args[call.args.index(call.subcommand) + 1 :]
    if call.subcommand == "branch":
        return "--list" in rest
    if call.subcommand == "worktree":
        return rest[:1] == ("list",)
    if call.subcommand == "symbolic-ref":
        return len([a for a in rest if not a.startswith("-")]) == 1
    if call.subcommand == "add":
        return False
    return call.subcommand in _GIT_READS


def git_floor(calls: Sequence[GitCall | None]) -> list[GitCall]:
    """The calls of ``calls`` in the git floor (module docstring, (c)); a None in
    ``calls`` is an agent run, after which every read is asked anew."""
    floor: list[GitCall] = []
    known: set[tuple[tuple[str, ...], str, str | None]] = set()
    for call in calls:
        if call is None:
            known.clear()
        elif call.bookkeeping:
            continue
        elif not _reads(call):
            known.clear()
            floor.append(call)
        elif (key := (call.args, call.cwd, call.input)) not in known:
            known.add(key)
            floor.append(call)
    return floor


def bench_git_calls() -> dict[str, Any]:
    """One demo lifecycle's git calls by subcommand, and its floor (module docstring)."""
    marks: list[int] = []
    watch = guard.watch

    @contextmanager
    def marking_watch(*args: Any, **kwargs: Any) -> Iterator[Any]:
        with watch(*args, **kwargs) as seen:
            try:
                yield seen
            finally:
                marks.append(len(calls))  # the agent ran: what git says may differ now

    with tempfile.TemporaryDirectory(prefix="phasegate-bench-") as tmp:
        repo = make_sample_project(Path(tmp) / "calc")
        cartridge = load_cartridge(repo)
        store = open_store(cartridge.store_url(repo))
        service.guard.watch = marking_watch  # type: ignore[assignment]
        try:
            engine = Engine(repo, cartridge, store)
            with recording() as calls:
                row = engine.advance(engine.start(DEMO_TITLE, DEMO_TICKET))
        finally:
            service.guard.watch = watch  # type: ignore[assignment]
            store.close()
    if row["status"] != "completed":
        raise SystemExit(f"demo workflow ended {row['status']}: {row.get('error')}")
    marked: list[GitCall | None] = list(calls)
    for at in reversed(marks):
        marked.insert(at, None)
    floor = git_floor(marked)
    by_subcommand: dict[str, int] = {}
    for call in calls:
        by_subcommand[call.subcommand] = by_subcommand.get(call.subcommand, 0) + 1
    seconds = sum(c.seconds for c in calls)
    floor_s = sum(c.seconds for c in floor)
    return {
        "calls": len(calls),
        "bookkeeping_calls": sum(c.bookkeeping for c in calls),
        "by_subcommand": dict(sorted(by_subcommand.items(), key=lambda kv: (-kv[1], kv[0]))),
        "floor_calls": len(floor),
        "calls_ratio": len(calls) / len(floor),
        "git_s": seconds,
        "floor_s": floor_s,
        "time_ratio": seconds / floor_s,
        "agent_runs": len(marks),
    }


def _render_git(git_calls: dict[str, Any]) -> str:
    rows = [
        ["git calls (all)", str(git_calls["calls"]), _ms(git_calls["git_s"])],
        ["git floor", str(git_calls["floor_calls"]), _ms(git_calls["floor_s"])],
        [
            "lifecycle / floor",
            f"{git_calls['calls_ratio']:.2f}x",
            f"{git_calls['time_ratio']:.2f}x",
        ],
        ["of them the ledger's and locks' own", str(git_calls["bookkeeping_calls"]), ""],
    ]
    rows += [[f"  {name}", str(n), ""] for name, n in git_calls["by_subcommand"].items()]
    return _table(
        f"(c) git calls of one demo lifecycle ({git_calls['agent_runs']} agent runs)",
        ["", "calls", "git ms"],
        rows,
    )


# -- output -------------------------------------------------------------------------


def _stats(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "median_s": statistics.median(ordered),
        "min_s": ordered[0],
        "p95_s": ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))],
        "max_s": ordered[-1],
        "n": len(ordered),
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:9.3f}"


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "-" * len(line(header))
    return "\n".join([title, rule, line(header), rule, *(line(r) for r in rows), ""])


def render(result: dict[str, Any]) -> str:
    env = result["environment"]
    out = [
        f"phasegate benchmarks · Python {env['python']} · SQLite {env['sqlite']} · "
        f"SQLAlchemy {env['sqlalchemy']} · {env['platform']}",
        "",
    ]
    life = result["lifecycle"]
    names = {
        "sample_project_s": "make the sample project (git init, commit)",
        "open_store_s": "open the store (SQLite file, migrations)",
        "lifecycle_s": "lifecycle: start -> completed (in-process)",
        "total_s": "total in-process",
        "cli_demo_s": "`phasegate demo --dir` (a new process)",
        "graph_lifecycle_s": "lifecycle through the graph (demo --graph, in-process)",
        "graph_replay_s": "replay of that graph run (8 recorded calls, offline)",
    }
    rows = [
        [names[key], _ms(s["median_s"]), _ms(s["min_s"]), _ms(s["max_s"])]
        for key, s in life.items()
    ]
    if "graph_lifecycle_s" in life:
        ratio = life["graph_lifecycle_s"]["median_s"] / life["lifecycle_s"]["median_s"]
        rows.append(["graph lifecycle / classic lifecycle (medians)", f"{ratio:.2f}x", "", ""])
    runs = next(iter(life.values()))["n"]
    out.append(
        _table(
            f"(a) demo lifecycle, {runs} run(s), each in a fresh temp dir (ms)",
            ["step", "median", "min", "max"],
            rows,
        )
    )
    commits = result["commits"]
    first = next(iter(commits.values()))
    rows = [
        [
            label,
            _ms(s["median_s"]),
            _ms(s["p95_s"]),
            f"{1 / s['median_s']:8.0f}",
            f"{s['phasegate_ratio']:.2f}x" if "phasegate_ratio" in s else "",
            _ms(s["cpu"]["median_s"]),
            _ms(s["cpu"]["p95_s"]),
            f"{s['cpu_ratio']:.2f}x" if "cpu_ratio" in s else "",
        ]
        for label, s in commits.items()
    ]
    out.append(
        _table(
            f"(b) one commit = 1 milestone + 1 event; {first['n']} commits after "
            f"{result['settings']['warmup']} warm-up, WAL, synchronous=FULL, "
            "BEGIN IMMEDIATE (ms; cpu = process_time)",
            [
                "writer",
                "wall median",
                "wall p95",
                "commits/s",
                "phasegate / this",
                "cpu median",
                "cpu p95",
                "phasegate / this (cpu)",
            ],
            rows,
        )
    )
    if "git_calls" in result:
        out.append(_render_git(result["git_calls"]))
    out.append(f"SQLite files in {result['settings']['directory']}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="demo lifecycles (default 3)")
    parser.add_argument("--commits", type=int, default=500, help="timed commits (default 500)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed commits first")
    parser.add_argument("--no-cli", action="store_true", help="skip `phasegate demo` timing")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where the commit benchmark's SQLite files go"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.commits < 1 or args.warmup < 0:
        parser.error("--runs and --commits must be at least 1, --warmup at least 0")

    environment = {
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "sqlalchemy": sqlalchemy.__version__,
        "platform": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
    }
    lifecycle = bench_lifecycle(args.runs, cli=not args.no_cli)
    with tempfile.TemporaryDirectory(prefix="phasegate-bench-", dir=args.dir) as tmp:
        commits = bench_commits(args.commits, args.warmup, Path(tmp))
        directory = str(Path(tmp).parent)
    result = {
        "environment": environment,
        "settings": {
            "runs": args.runs,
            "commits": args.commits,
            "warmup": args.warmup,
            "directory": directory,
        },
        "lifecycle": lifecycle,
        "commits": commits,
        "git_calls": bench_git_calls(),
    }
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
