"""Benchmark: many workflows, many workers.

    .venv/bin/python benchmarks/scale.py [--n 10 50 200] [--latency 0 1] [--json]
    .venv/bin/python benchmarks/scale.py --n 10 --quick          # a smoke run
    .venv/bin/python benchmarks/scale.py --n 200 --latency 1 --stores postgresql --configs 1x1 4x1

For every store (SQLite; PostgreSQL: the server ``PHASEGATE_POSTGRES_URL``
names, else a throwaway one started by ``support.postgres``, a schema
of its own per run; ``--no-postgres`` or no server to be had skips it with a
note), every agent
latency (``0``: zero-latency scripted agents; ``1``: every agent call takes 1 s)
and every N, N workflows are filed on one fresh repository (each adds a file of
its own and merges unattended, so merges never conflict), then real
``phasegate worker`` processes take them from filed to settled:

- 1 process, ``--concurrency 1`` (one workflow at a time);
- 1 process, ``--concurrency C`` (``--high``, default 16);
- ``W`` processes (``--workers``, default 4), ``--concurrency 1`` each.

``--stores`` and ``--configs`` (``PROCESSESxCONCURRENCY``) pick a part of that
matrix: a ratio is printed where its ``1x1`` run is in it.

Agents: the build role is a ``command`` runner (``sleep L; echo … >
built-<workflow>.txt``, unconfined: this measures the orchestration, not
bubblewrap), the others the scripted runner with ``sleep = L``. No checks.

Printed per run: wall seconds from the workers' start to the last workflow
settled, throughput (workflows/s), wall and worker CPU seconds per workflow
(the workers' own CPU with their git and agent subprocesses'), failures
(settled other than completed, or not settled by ``--timeout``), duplicates
(forge issues, comments or pull requests sharing a marker or head branch, merge
commits on main beyond one per completed workflow) and the peak RSS of one
worker process. Then the ratios: throughput at concurrency C over 1, W workers
over 1, and per-workflow cost at each N over the smallest N. Figures are
printed, never judged. ``--json`` prints the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the rig: tests/support
from support.postgres import PostgresUnavailable, drop_schema, fresh_schema, server_url  # noqa: E402

ROLES = ("plan", "plan_review", "build", "review", "verification")
ANSWERS = {
    "plan": "1. Write built-<workflow>.txt",
    "plan_review": "VERDICT: approve",
    "review": "VERDICT: approve",
    "verification": "VERDICT: confirmed",
}
#: Statuses a workflow does not leave without a person (or ends in).
SETTLED = frozenset({"completed", "failed", "paused", "cancelled"})
PHASEGATE = Path(sys.executable).parent / "phasegate"
_GIT_ID = ["-c", "user.name=bench", "-c", "user.email=bench@localhost"]


# -- the project ----------------------------------------------------------------------


def make_project(root: Path, latency_s: float, store_url: str | None) -> Path:
    """A git repository on ``main`` whose cartridge binds every role to an agent taking
    ``latency_s`` seconds per call; its workflows each add ``built-<id>.txt`` and merge
    unattended. Each build adds a line, so a feedback round (wakeup.py) changes
    something and is not stopped as feedback_unchanged. ``store_url`` None: the
    embedded SQLite file."""
    repo = root / "repo"
    repo.mkdir(parents=True)
    (repo / "README.md").write_text("# scale sample\n")
    (repo / ".gitignore").write_text(".phasegate/\n")
    sleep = f"sleep = {latency_s}\n" if latency_s > 0 else ""
    (repo / "answers.toml").write_text(
        "".join(f'[[{role}]]\ntext = "{text}"\n{sleep}' for role, text in ANSWERS.items())
    )
    build = (
        f"sleep {latency_s}; " if latency_s > 0 else ""
    ) + 'echo "built $(date +%s%N)" >> "built-$PHASEGATE_WORKFLOW_ID.txt"; echo wrote it'
    roles = []
    for role in ROLES:
        if role == "build":
            body = f'runner = "command"\ncommand = {json.dumps(build)}\nsandbox = "none"\n'
        else:
            body = 'runner = "scripted"\nscript = "answers.toml"\n'
        roles.append(f"[roles.{role}]\n{body}timeout = 60\n")
    store = f"[store]\nurl = {json.dumps(store_url)}\n\n" if store_url else ""
    (repo / "phasegate.toml").write_text(
        '[workflow]\nbase_branch = "main"\nauto_merge = true\n\n'
        "[landing_areas]\nchecks = []\ncheck_timeout = 60\n\n" + store + "\n".join(roles)
    )
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], [*_GIT_ID, "commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)
    return repo


def file_workflows(repo: Path, n: int, *, auto_merge: bool | None = None) -> list[str]:
    """File ``n`` workflows in preparation (nothing runs); their ids."""
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    try:
        engine = Engine(repo, cartridge, store)
        return [
            engine.start(f"feature {i}", f"add feature {i}", auto_merge=auto_merge)
            for i in range(n)
        ]
    finally:
        store.close()


def open_project_store(repo: Path) -> Store:
    return open_store(load_cartridge(repo).store_url(repo))


# -- workers --------------------------------------------------------------------------


def concurrency_supported() -> bool:
    """Whether this phasegate's ``worker`` takes ``--concurrency``."""
    shown = subprocess.run(
        [str(PHASEGATE), "worker", "--help"], capture_output=True, text=True, env=_env()
    )
    return "--concurrency" in shown.stdout


def _env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}


def spawn_worker(
    repo: Path, log: Path, *, concurrency: int | None = None, poll_s: float | None = None
) -> subprocess.Popen[bytes]:
    """One ``phasegate worker`` process in a session of its own, its output in ``log``;
    ``concurrency`` None: the worker's default (and a phasegate without the flag)."""
    command = [str(PHASEGATE), "worker", "--repo", str(repo)]
    if concurrency is not None:
        command += ["--concurrency", str(concurrency)]
    if poll_s is not None:
        command += ["--poll", str(poll_s)]
    with log.open("ab") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=_env(),
        )


def stop_worker(proc: subprocess.Popen[bytes], grace_s: float = 30.0) -> dict[str, float]:
    """SIGTERM the worker's session, SIGKILL it after ``grace_s``; its rusage:
    ``cpu_s`` (user + system, its waited-for subprocesses included) and
    ``maxrss_mib`` (the largest resident set of the process or one of those)."""
    with _quiet():
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            with _quiet():
                os.killpg(proc.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "maxrss_mib": usage.ru_maxrss / 1024}


@contextmanager
def _quiet() -> Iterator[None]:
    try:
        yield
    except ProcessLookupError:
        return  # the worker ended already: there is nothing left to signal


# -- one run --------------------------------------------------------------------------


def status_counts(store: Store) -> dict[str, int]:
    w = sa.table("workflows", sa.column("status"))
    with store.reading() as conn:
        rows = conn.execute(sa.select(w.c.status, sa.func.count()).group_by(w.c.status))
        return {status: count for status, count in rows}


def duplicates(store: Store, repo: Path) -> dict[str, int]:
    """Forge rows made twice (issues or comments with one marker, pull requests with one
    head) and merge commits on main beyond one per completed workflow."""
    counts: dict[str, int] = {}
    with store.reading() as conn:
        for kind, table, column in (
            ("issues", "forge_issues", "marker"),
            ("comments", "forge_comments", "marker"),
            ("pull_requests", "forge_pull_requests", "head"),
        ):
            counts[kind] = int(
                conn.execute(
                    sa.text(
                        f"SELECT COALESCE(SUM(c - 1), 0) FROM (SELECT COUNT(*) AS c FROM {table} "
                        f"WHERE {column} IS NOT NULL GROUP BY {column}) AS per_key"
                    )
                ).scalar_one()
            )
        merged = conn.execute(
            sa.text("SELECT COUNT(*) FROM workflows WHERE status = 'completed'")
        ).scalar_one()
    merges = subprocess.run(
        ["git", "rev-list", "--merges", "--first-parent", "main"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    counts["merges"] = max(0, len(merges) - int(merged))
    return counts


def run_once(
    root: Path,
    *,
    n: int,
    latency_s: float,
    processes: int,
    concurrency: int,
    store_url: str | None,
    timeout_s: float,
    flag: bool = True,
) -> dict[str, Any]:
    """N workflows from filed to settled by ``processes`` workers × ``concurrency``
    (``flag`` False: a phasegate without ``--concurrency``, whose worker does one at
    a time)."""
    repo = make_project(root, latency_s, store_url)
    file_workflows(repo, n)
    store = open_project_store(repo)
    logs = [root / f"worker-{i}.log" for i in range(processes)]
    workers: list[subprocess.Popen[bytes]] = []
    usage: list[dict[str, float]] = []
    try:
        started = time.perf_counter()
        given = concurrency if flag else None
        workers = [spawn_worker(repo, log, concurrency=given, poll_s=0.1) for log in logs]
        deadline = time.monotonic() + timeout_s
        while True:
            counts = status_counts(store)
            if sum(c for s, c in counts.items() if s in SETTLED) >= n:
                break
            if time.monotonic() > deadline or all(w.poll() is not None for w in workers):
                break
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
    finally:
        usage = [stop_worker(w) for w in workers]
    try:
        counts = status_counts(store)
        dupes = duplicates(store, repo)
    finally:
        store.close()
    completed = counts.get("completed", 0)
    cpu = sum(u["cpu_s"] for u in usage)
    tracebacks = sum(log.read_text(errors="replace").count("Traceback") for log in logs)
    return {
        "n": n,
        "latency_s": latency_s,
        "processes": processes,
        "concurrency": concurrency,
        "elapsed_s": elapsed,
        "throughput_per_s": completed / elapsed if elapsed > 0 else 0.0,
        "wall_per_workflow_s": elapsed / n,
        "cpu_per_workflow_s": cpu / n,
        "completed": completed,
        "failed": n - completed,
        "statuses": counts,
        "duplicates": dupes,
        "tracebacks": tracebacks,
        "peak_rss_mib": max((u["maxrss_mib"] for u in usage), default=0.0),
    }


# -- PostgreSQL -----------------------------------------------------------------------


@contextmanager
def postgres_server(wanted: bool, notes: list[str]) -> Iterator[str | None]:
    """The PostgreSQL server to run on: ``PHASEGATE_POSTGRES_URL``, else a throwaway one
    (``support.postgres``, stopped after); None, with a note saying why, when
    not ``wanted`` or none can be had."""
    if not wanted:
        notes.append("PostgreSQL skipped: not in --stores (or --no-postgres)")
        yield None
        return
    try:
        url, server = server_url()
    except PostgresUnavailable as exc:
        notes.append(f"PostgreSQL skipped: {' '.join(str(exc).split())}")
        yield None
        return
    try:
        yield url
    finally:
        if server is not None:
            server.stop()


@contextmanager
def fresh_store_url(server: str | None) -> Iterator[str | None]:
    """A ``store.url`` for one run: None (the embedded SQLite file) without a server,
    else an empty schema of its own on it (dropped after)."""
    if server is None:
        yield None
        return
    name, url = fresh_schema(server)
    try:
        yield url
    finally:
        drop_schema(server, name)


# -- the matrix -----------------------------------------------------------------------


def bench(args: argparse.Namespace) -> dict[str, Any]:
    notes: list[str] = []
    configs = args.configs or [(1, 1), (1, args.high), (args.workers, 1)]
    flag = concurrency_supported()
    if not flag:
        notes.append(
            f"`phasegate worker --concurrency` is not in this phasegate: "
            f"concurrency {args.high} skipped"
        )
        configs = [c for c in configs if c[1] == 1]
    runs: list[dict[str, Any]] = []
    with postgres_server("postgresql" in args.stores, notes) as pg:
        stores = [("sqlite", None)] if "sqlite" in args.stores else []
        stores += [("postgresql", pg)] if pg else []
        for store_name, server in stores:
            for latency in args.latency:
                for n in args.n:
                    for processes, concurrency in configs:
                        label = f"{store_name} L={latency:g}s N={n} {processes}x{concurrency}"
                        print(f"running {label} ...", file=sys.stderr, flush=True)
                        with (
                            tempfile.TemporaryDirectory(prefix="phasegate-scale-") as tmp,
                            fresh_store_url(server) as url,
                        ):
                            run = run_once(
                                Path(tmp),
                                n=n,
                                latency_s=latency,
                                processes=processes,
                                concurrency=concurrency,
                                store_url=url,
                                timeout_s=args.timeout,
                                flag=flag,
                            )
                        runs.append({"store": store_name, **run})
    return {"notes": notes, "runs": runs, "ratios": ratios(runs)}


def ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Throughput of every configuration over one worker at concurrency 1, per (store,
    latency, N); per-workflow wall and CPU cost at each N over the smallest N, per
    (store, latency, processes, concurrency)."""
    out: list[dict[str, Any]] = []
    by = {(r["store"], r["latency_s"], r["n"], r["processes"], r["concurrency"]): r for r in runs}
    for (store, latency, n, processes, concurrency), run in by.items():
        base = by.get((store, latency, n, 1, 1))
        if base is None or (processes, concurrency) == (1, 1) or not base["throughput_per_s"]:
            continue
        what = f"{processes} workers x concurrency {concurrency} / 1x1"
        if processes == 1:
            what = f"concurrency {concurrency} / 1"
        elif concurrency == 1:
            what = f"{processes} workers / 1"
        out.append(
            {
                "store": store,
                "latency_s": latency,
                "n": n,
                "ratio": what,
                "value": run["throughput_per_s"] / base["throughput_per_s"],
            }
        )
    smallest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for run in sorted(runs, key=lambda r: r["n"]):
        key = (run["store"], run["latency_s"], run["processes"], run["concurrency"])
        first = smallest.setdefault(key, run)
        if run is not first:
            out.append(
                {
                    "store": key[0],
                    "latency_s": key[1],
                    "n": run["n"],
                    "ratio": f"per-workflow wall, N={run['n']} / N={first['n']} "
                    f"({key[2]}x{key[3]})",
                    "value": run["wall_per_workflow_s"] / first["wall_per_workflow_s"],
                }
            )
            out.append(
                {
                    "store": key[0],
                    "latency_s": key[1],
                    "n": run["n"],
                    "ratio": f"per-workflow CPU, N={run['n']} / N={first['n']} ({key[2]}x{key[3]})",
                    "value": run["cpu_per_workflow_s"] / first["cpu_per_workflow_s"],
                }
            )
    return out


def render(result: dict[str, Any]) -> str:
    header = [
        "store",
        "agent s",
        "N",
        "procs x conc",
        "wall s",
        "wf/s",
        "wall s/wf",
        "cpu s/wf",
        "failed",
        "dupes",
        "peak RSS MiB",
    ]
    rows = [
        [
            r["store"],
            f"{r['latency_s']:g}",
            str(r["n"]),
            f"{r['processes']}x{r['concurrency']}",
            f"{r['elapsed_s']:.1f}",
            f"{r['throughput_per_s']:.2f}",
            f"{r['wall_per_workflow_s']:.3f}",
            f"{r['cpu_per_workflow_s']:.3f}",
            str(r["failed"]),
            str(sum(r["duplicates"].values())),
            f"{r['peak_rss_mib']:.0f}",
        ]
        for r in result["runs"]
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs)

    out = ["phasegate scale: N workflows from filed to settled", line(header)]
    out += [line(r) for r in rows]
    if result["ratios"]:
        out.append("")
        out.append("ratios (measured in this run)")
        for r in result["ratios"]:
            out.append(
                f"  {r['store']:10s} agent {r['latency_s']:g} s  N={r['n']:<4d} "
                f"{r['ratio']}: {r['value']:.2f}x"
            )
    failed = [r for r in result["runs"] if r["failed"] or r["tracebacks"]]
    for r in failed:
        out.append(
            f"note: {r['store']} N={r['n']} {r['processes']}x{r['concurrency']}: "
            f"statuses {r['statuses']}, {r['tracebacks']} traceback(s) in the worker logs"
        )
    out += [f"note: {note}" for note in result["notes"]]
    return "\n".join(out)


def _config(text: str) -> tuple[int, int]:
    """``PxC`` (``4x1``) as (processes, concurrency), each at least 1."""
    try:
        processes, concurrency = (int(part) for part in text.lower().split("x"))
    except ValueError:
        shape = "is not PROCESSESxCONCURRENCY, e.g. 4x1"
        raise argparse.ArgumentTypeError(f"{text!r} {shape}") from None
    if processes < 1 or concurrency < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: processes and concurrency at least 1")
    return processes, concurrency


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[10, 50, 200], help="workflows")
    parser.add_argument(
        "--latency", type=float, nargs="+", default=[0.0, 1.0], help="seconds per agent call"
    )
    parser.add_argument("--high", type=int, default=16, help="the high --concurrency")
    parser.add_argument("--workers", type=int, default=4, help="worker processes")
    parser.add_argument(
        "--no-postgres", action="store_true", help="SQLite only (no PostgreSQL column)"
    )
    parser.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds a run may take to settle"
    )
    parser.add_argument(
        "--stores",
        nargs="+",
        choices=["sqlite", "postgresql"],
        default=["sqlite", "postgresql"],
        help="the stores measured",
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        type=_config,
        default=None,
        metavar="PxC",
        help="worker processes x concurrency, e.g. 1x1 1x16 4x1 (default: those three)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: zero-latency only")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.quick:
        args.latency = [0.0]
    if args.no_postgres:
        args.stores = [name for name in args.stores if name != "postgresql"]
    if min(args.n) < 1 or args.high < 2 or args.workers < 2:
        parser.error("--n at least 1, --high and --workers at least 2")
    result = bench(args)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
