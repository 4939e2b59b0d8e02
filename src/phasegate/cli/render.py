"""How the CLI shows workflows: live progress, outcomes and exit codes, ``show``'s detail."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from types import FrameType
from typing import Any

import typer
from rich import box
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from phasegate._terminal import visible
from phasegate.cartridge import Cartridge
from phasegate.cli._app import console, err, shown
from phasegate.contract import AWAITING_APPROVAL, RUNNABLE_STATUSES
from phasegate.engine import Engine, LeaseHeld
from phasegate.profiles import MAX_REVERSIONS, AutomationProfile, decisions_of
from phasegate.report import render_report
from phasegate.sandbox import start_confined
from phasegate.store import Store
from phasegate.worker import waits_on_ci


class _Progress:
    """Live progress while agents run: a line per step, and phase/round/elapsed on a bar."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.started = time.monotonic()
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
        )
        self.task = self.progress.add_task("starting", total=None)
        self.phase = "preparation"

    def __enter__(self) -> _Progress:
        if not self.quiet:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def line(self, text: str) -> None:
        if not self.quiet:
            elapsed = time.monotonic() - self.started
            self.progress.console.print(f"[dim]{elapsed:7.1f}s[/dim] {text}", highlight=False)

    def __call__(self, workflow_id: str, type_: str, data: Mapping[str, Any]) -> None:
        if type_ == "phase_change":
            self.phase = str(data.get("phase"))
            self.line(f"[bold]{workflow_id}[/bold] → {self.phase}")
        elif type_ == "agent_started":
            desc = f"{self.phase} · round {data.get('round')} · {data.get('role')} agent running"
            self.progress.update(self.task, description=desc)
            self.line(
                f"  {data.get('role')} agent ({data.get('runner')}), round {data.get('round')}"
            )
        elif type_ == "agent_finished" and data.get("outcome") != "ok":
            self.line(
                f"  [yellow]{data.get('role')} agent: {data.get('outcome')}: "
                f"{shown(str(data.get('error'))[:200])}[/yellow]"
            )
        elif type_ == "committed":
            self.progress.update(
                self.task, description=f"{data.get('phase')} · {data.get('status')}"
            )
            outcome = data.get("outcome")
            if outcome in ("failed", "pause"):
                said = data.get("status") if data.get("status") == "cancelled" else outcome
                self.line(f"  [red]{said}: {shown(str(data.get('reason')))}[/red]")
            elif outcome == "retry":
                self.line(f"  {data.get('phase')}: another round")
            elif outcome == "wait" and data.get("phase") == "pr_review":
                # Committed only at the first look at a head that CI has not finished.
                self.line(f"  waiting for CI (`phasegate show {workflow_id}` lists the checks)")
        elif type_ == "reversion":
            self.line(
                f"  [yellow]reverted to planning ({data.get('reversion_number')} of "
                f"{MAX_REVERSIONS}): "
                f"{shown(str(data.get('reason'))[:200])}[/yellow]"
            )
        elif type_ == "cleanup_retried":
            color = "green" if data.get("status") == "completed" else "yellow"
            note = shown(str(data.get("note"))[:200])
            self.line(f"  [{color}]cleanup retried: {data.get('status')}: {note}[/{color}]")
        elif type_ in ("reconciled", "worktree_healed", "paused_by_shutdown"):
            note = shown(str(data.get("note") or data.get("path")))
            self.line(f"  [cyan]{type_}: {note}[/cyan]")


@contextmanager
def _graceful(engine: Engine, what: str = "the id is printed below") -> Iterator[None]:
    """First Ctrl-C/SIGTERM: stop agents and leave the workflow resumable. Second: quit now.

    ``what`` ends the notice: where the person finds the workflow to resume."""
    hits = {"n": 0}

    def handler(signum: int, _frame: FrameType | None) -> None:
        hits["n"] += 1
        if hits["n"] > 1:
            raise KeyboardInterrupt
        err.print(
            "\n[yellow]stopping: the running agent or check is stopped, nothing half-committed; "
            f"`phasegate resume` continues it ({what})[/yellow]"
        )
        engine.shutdown.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def _engine(repo: Path, cartridge: Cartridge, store: Store, progress: _Progress | None) -> Engine:
    # Before any agent runs: a "bwrap" that cannot work is exit 2; unconfined is loud.
    start_confined(cartridge, lambda text: err.print(f"[bold red]{shown(text)}[/bold red]"))
    return Engine(repo, cartridge, store, on_event=progress)


#: Statuses a command reports with exit code 1: the workflow stopped short.
_STOPPED = frozenset({"failed", "paused", "planning_timeout"})


def _drive(engine: Engine, workflow_id: str, as_json: bool) -> None:
    """Advance in the foreground with live progress; exit with the workflow's outcome."""
    with _Progress(quiet=as_json) as progress, _graceful(engine):
        engine.on_event = progress
        row = engine.advance(workflow_id)
        # CI runs on the forge: the foreground run waits for it (Ctrl-C leaves the
        # workflow resumable, and a worker would look at it just the same).
        while waits_on_ci(row) and not engine.shutdown.wait(engine.cartridge.forge.poll_s):
            row = engine.advance(workflow_id)
    _finish(engine.store, row, as_json, interrupted=engine.shutdown.is_set())


def _repo_option(row: Mapping[str, Any]) -> str:
    """`` --repo PATH`` for a hint about a workflow whose repository is not the one
    the person is in (``demo --dir``, ``--repo``), else nothing."""
    repo = Path(str(row.get("repo_path") or "."))
    try:
        Path.cwd().resolve().relative_to(repo.resolve())
    except (ValueError, OSError):
        return f" --repo {repo}"
    return ""


def _drive_unless_taken(engine: Engine, workflow_id: str, as_json: bool) -> None:
    """``_drive``, after the workflow was filed or a person's decision recorded: a
    worker that took the workflow on meanwhile is not an error, the workflow goes
    on there (exit 0; the holder named ``host:pid``, in JSON ``worker``; issue 12)."""
    try:
        _drive(engine, workflow_id, as_json)
    except LeaseHeld:
        row = engine.store.workflow_row(workflow_id)
        worker = _holder(engine.store, row).get("worker")
        # An owner is host:pid:token (Engine.owner); a person knows a process by host:pid.
        where = ":".join(str(worker).split(":")[:2]) if worker else None
        if as_json:
            summary = {**_summary(engine.store, row), "taken_by_worker": True}
            summary.setdefault("worker", where)
            console.print_json(json.dumps(summary, default=str))
        else:
            by = f" ({where})" if where else ""
            console.print(
                f"workflow {workflow_id} was taken on by a worker{by} meanwhile and goes on "
                f"there; `phasegate show {workflow_id}`",
                highlight=False,
            )


def _finish(
    store: Store,
    row: Mapping[str, Any],
    as_json: bool,
    interrupted: bool = False,
    driven: bool = True,
) -> None:
    """Print the outcome and exit with its code (module docstring).

    ``driven``: the workflow was just advanced in the foreground, so a runnable
    status other than waiting means it stopped early (another process moved it).
    """
    summary = _summary(store, row)
    approved = row["state"].get("merge_approved")
    at = _repo_option(row)
    stopped_early = (
        driven
        and not interrupted
        and row["status"] in RUNNABLE_STATUSES
        and row["status"] != "waiting"
    )
    if as_json:
        console.print_json(json.dumps(summary, default=str))
    else:
        status = row["status"]
        color = {"completed": "green", "waiting": "cyan", AWAITING_APPROVAL: "cyan"}.get(
            status, "red"
        )
        console.print(
            f"workflow [bold]{row['id']}[/bold]: {row['current_phase']} · "
            f"[{color}]{status}[/{color}]",
            highlight=False,
        )
        if row.get("error"):
            console.print(f"  reason: {shown(row['error'])}", highlight=False)
        if status == "waiting" and not approved:
            console.print(
                f"  next: `phasegate approve-merge {row['id']}{at}` or "
                f'`phasegate feedback {row["id"]} "..."{at}`',
                highlight=False,
            )
        elif status == AWAITING_APPROVAL:
            awaited = summary["awaiting_proposal"]
            if awaited:
                console.print(
                    f"  next: `phasegate proposals{at}` shows its evidence; `phasegate approve "
                    f"{awaited}{at}` or `phasegate reject {awaited} --reason TEXT{at}`",
                    highlight=False,
                )
            else:  # decided, and the process died before the workflow moved on
                console.print(f"  next: `phasegate resume {row['id']}{at}`", highlight=False)
        elif stopped_early:
            console.print(
                "  stopped before finishing: another process changed the workflow; "
                f"`phasegate show {row['id']}`",
                highlight=False,
            )
        elif status in _STOPPED or interrupted:
            console.print(
                f"  next: `phasegate show {row['id']}{at}`, "
                f"then `phasegate resume {row['id']}{at}`",
                highlight=False,
            )
    if interrupted:
        raise typer.Exit(130)
    if row["status"] in _STOPPED or stopped_early:
        raise typer.Exit(1)


def _summary(store: Store, row: Mapping[str, Any]) -> dict[str, Any]:
    usage = store.usage_totals(row["id"])
    awaited = None
    if row["status"] == AWAITING_APPROVAL:
        waiting = [
            p
            for p in store.proposals(status="proposed", workflow_id=row["id"])
            if p["kind"] == "draft_pr_create"
        ]
        awaited = waiting[-1]["id"] if waiting else None
    return {
        "id": row["id"],
        "title": row["title"],
        "current_phase": row["current_phase"],
        "status": row["status"],
        "error": row.get("error"),
        # the proposal a person's approve/reject moves the workflow on with, if any
        "awaiting_proposal": awaited,
        "dev_round": row["dev_round"],
        "profile": AutomationProfile.from_state(row["state"]).name,
        "reversion_count": int(row["state"].get("reversion_count") or 0),
        "issue_number": row["issue_number"],
        "pr_number": row["pr_number"],
        "branch_name": row["branch_name"],
        "merge_sha": row["merge_sha"],
        "verification_status": row["state"].get("verification_status"),
        "verified_by": row["state"].get("verified_by"),
        "tokens": usage.tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cost_usd": round(usage.cost_usd, 6),
        "agent_runs": usage.runs,
        "created_at": _iso(row["created_at"]),
        "updated_at": _iso(row["updated_at"]),
        "completed_at": _iso(row.get("completed_at")),
        # the conflict fork (phases/conflict.py): whose child this is, and its own children
        "parent_workflow_id": row.get("parent_workflow_id"),
        "children": [
            {"id": c["id"], "status": c["status"]} for c in store.child_workflows(row["id"])
        ],
        **_holder(store, row),
    }


def _holder(store: Store, row: Mapping[str, Any]) -> dict[str, Any]:
    """Which worker holds the workflow's lease (``host:pid:token``) and until when, while
    it is unexpired (issue 12, item 1); both None when nobody does."""
    expires = row.get("lease_expires_at")
    if not row.get("lease_owner") or expires is None or expires <= store.clock.now():
        return {"worker": None, "lease_expires_at": None}
    return {"worker": row["lease_owner"], "lease_expires_at": _iso(expires)}


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def _detail(store: Store, workflow_id: str) -> dict[str, Any]:
    """What ``show`` prints: summary, phase timeline, milestones, agent runs, report."""
    row = store.workflow_row(workflow_id)
    milestones = store.milestone_rows(workflow_id)
    phases = [e for e in store.events(workflow_id) if e["type"] == "phase_change"]
    runs = store.agent_runs(workflow_id)
    return {
        "workflow": _summary(store, row),
        "timeline": [
            {"phase": e["data"].get("phase"), "at": _iso(e["created_at"])} for e in phases
        ],
        "milestones": [
            {k: (_iso(v) if isinstance(v, datetime) else v) for k, v in m.items()}
            for m in milestones
        ],
        "agent_runs": [
            {k: (_iso(v) if isinstance(v, datetime) else v) for k, v in r.items()} for r in runs
        ],
        "report": row["state"].get("report"),
        "violations": [
            {**e["data"], "at": _iso(e["created_at"])}
            for e in store.events(workflow_id)
            if e["type"] == "violation"
        ],
        "decisions": decisions_of(row["state"]),
        "cleanup": _cleanup_of(milestones),
    }


def _cleanup_of(milestones: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The merge's cleanup (phases/cleanup.py): its status and, when failed, why."""
    found = [m for m in milestones if m["kind"] == "cleanup"]
    if not found:
        return None
    last = found[-1]
    return {
        "status": last["status"],
        "reason": ((last["data"] or {}).get("reason") or last["summary"])
        if last["status"] == "failed"
        else None,
        "attempts": int((last["data"] or {}).get("attempts") or 1),
    }


#: status's columns, in the order shown; the ones a narrow terminal drops first
#: come last in _OPTIONAL (id, phase and status are always whole).
_STATUS_COLUMNS = (
    "id",
    "title",
    "phase",
    "status",
    "worker",
    "profile",
    "tokens",
    "cost (USD)",
    "updated",
)
_OPTIONAL = ("worker", "tokens", "cost (USD)", "profile", "updated")
_MIN_TITLE = 12  # the least a title gets, even in the worst case at 80 columns
_TITLE_FIRST = 20  # what a title gets before an optional column does


def _status_cells(r: Mapping[str, Any], wide: bool) -> dict[str, str]:
    updated = r["updated_at"] or ""
    title = visible(r["title"], one_line=True)
    if r.get("parent_workflow_id"):
        title = f"child of {r['parent_workflow_id']}: {title}"
    return {
        "id": r["id"],
        "title": title if len(title) <= 40 else title[:39] + "…",
        "phase": r["current_phase"],
        "status": r["status"],
        # host:pid, enough to find the process (--json has the whole owner)
        "worker": ":".join(str(r.get("worker") or "").split(":")[:2]),
        "profile": r["profile"],
        "tokens": str(r["tokens"]),
        "cost (USD)": f"{r['cost_usd']:.4f}",
        # UTC; the date goes first when space is short (today's rows matter most)
        "updated": updated[:19].replace("T", " ") if wide else updated[11:16],
    }


def _status_table(rows: list[dict[str, Any]], width: int) -> Table:
    """``status``'s table, fitted to ``width`` columns: id, phase and status are
    never cut; the title is cut with an ellipsis, and what does not fit
    (updated, then profile, cost, tokens, then the worker holding it: shown only
    while a worker holds one) is left out, for ``--json`` to give.
    Wide (100 columns or more): boxed; narrower: no rules, to leave the text room."""
    wide = width >= 100
    cells = [_status_cells(r, wide) for r in rows]

    def table_of(columns: list[str], title: int | None) -> Table:
        table = (
            Table(box=box.HEAVY_HEAD)
            if wide
            else Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
        )
        for c in columns:
            header = "updated (UTC)" if c == "updated" and wide else c
            if c == "title":
                table.add_column(header, overflow="ellipsis", no_wrap=True, max_width=title)
            else:
                table.add_column(header, no_wrap=True)
        for row in cells:
            table.add_row(*(shown(row[c]) if c == "title" else row[c] for c in columns))
        return table

    def needs(columns: list[str]) -> int:
        """The width the table takes with ``columns`` and a title of _TITLE_FIRST."""
        return Console(width=10_000).measure(table_of(columns, _TITLE_FIRST)).maximum

    fits = ["id", "title", "phase", "status"]
    held = any(r.get("worker") for r in rows)  # the column only while a worker holds one
    for column in (c for c in _OPTIONAL if held or c != "worker"):
        if needs([*fits, column]) <= width:
            fits.append(column)
    fits = [c for c in _STATUS_COLUMNS if c in fits]
    # the title gets what the other columns leave, so rich cuts nothing else
    return table_of(fits, max(_MIN_TITLE, _TITLE_FIRST + width - needs(fits)))


def _print_detail(detail: Mapping[str, Any]) -> None:
    s = detail["workflow"]
    console.print(f"[bold]{s['id']}[/bold] {shown(s['title'])}", highlight=False)
    # two short lines rather than one folded anywhere at 80 columns
    console.print(
        f"  {s['current_phase']} · {s['status']} · dev round {s['dev_round']} · "
        f"profile {s['profile']}",
        highlight=False,
    )
    console.print(
        f"  issue #{s['issue_number']} · "
        + (f"PR #{s['pr_number']} · " if s["pr_number"] else "no PR yet · ")
        + f"{s['tokens']} tokens · ${s['cost_usd']:.4f}",
        highlight=False,
    )
    if s.get("parent_workflow_id"):
        console.print(f"  conflict-resolution child of {s['parent_workflow_id']}", highlight=False)
    for child in s.get("children", ()):
        console.print(
            f"  conflict-resolution child {child['id']}: {child['status']}", highlight=False
        )
    if s["error"]:
        console.print(f"  [red]reason: {shown(s['error'])}[/red]", highlight=False)
    _print_timeline(detail["milestones"])
    cleaned = detail.get("cleanup")
    if cleaned and cleaned["status"] == "failed":
        console.print(
            f"  [red]cleanup failed ({cleaned['attempts']} attempt(s)): "
            f"{shown(cleaned['reason'])}[/red]\n"
            f"  the merge landed; fix that, then `phasegate cleanup {s['id']}`",
            highlight=False,
        )
    _print_decisions(detail["decisions"])
    _print_violations(detail["violations"])
    runs = detail["agent_runs"]
    if runs:
        agents = Table(
            "role",
            "runner",
            "round",
            "outcome",
            "tokens",
            "USD",
            "s",
            "error",
            box=None,
            pad_edge=False,
        )
        for r in runs:
            agents.add_row(
                r["role"],
                r["runner"],
                str(r["round"]),
                r["outcome"],
                str(r["input_tokens"] + r["output_tokens"]),
                f"{r['cost_usd']:.4f}",
                f"{r['duration_s']:.1f}",
                shown((r["error"] or "")[:60]),
            )
        console.print()
        console.print(agents)
    if detail["report"] and s["status"] == "waiting":  # what a person approves or answers
        console.print()
        console.print(
            visible(
                render_report(detail["report"], detail["report"].get("content_language", "en"))
            ),
            highlight=False,
            markup=False,
        )


def _print_decisions(records: list[dict[str, Any]]) -> None:
    """The decision records (reversions, spec 003), oldest first."""
    if not records:
        return
    console.print("[bold]decisions[/bold]")
    for d in records:
        how = "automatic" if d.get("automatic") else "by a person"
        console.print(
            f"  {d['type']} {d['reversion_number']}: {d['source_phase']} → {d['target_phase']}"
            f" · {d['timestamp']} · {how}",
            highlight=False,
        )
        reason = " ".join(str(d["reason"]).split())
        console.print(f"    [dim]{shown(reason[:300])}[/dim]", highlight=False)


def _print_violations(violations: list[dict[str, Any]]) -> None:
    """What agents overstepped (``phasegate.agents.VIOLATIONS``), oldest first."""
    if not violations:
        return
    console.print(f"[bold red]violations ({len(violations)})[/bold red]")
    for v in violations:
        paths = ", ".join(v.get("paths") or [])
        console.print(
            f"  [red]{v['name']}[/red] · {v.get('role')} in {v.get('phase')} · "
            f"{shown(v.get('detail') or '')}"
            + (f" [dim]({shown(paths[:200])})[/dim]" if paths else ""),
            highlight=False,
        )


_MARKS = {
    "completed": "[green]✓[/green]",
    "failed": "[red]✗[/red]",
    "in_progress": "[yellow]…[/yellow]",
    "cancelled": "[dim]−[/dim]",
}


def _print_timeline(milestones: list[dict[str, Any]]) -> None:
    """Milestones grouped under the phase they belong to, in the order they happened."""
    phase = None
    for m in milestones:
        if m["kind"] in ("agent_process", "check_process"):  # process bookkeeping
            continue
        if m["phase"] != phase:
            phase = m["phase"]
            console.print(f"[bold]{phase}[/bold]  [dim]{(m['created_at'] or '')[11:19]}[/dim]")
        where = "".join(
            f" {label}{value}" for label, value in (("r", m["round"]), ("a", m["attempt"])) if value
        )
        head = f"  {_MARKS.get(m['status'], m['status'])} {m['kind']}{where}  "
        # one line per milestone: the summary is cut to what the terminal has left
        room = max(console.width - len(Text.from_markup(head)), 20)
        summary = (m["summary"] or "").splitlines()[0] if m["summary"] else ""
        if len(summary) > min(room, 80):
            summary = summary[: min(room, 80) - 1] + "…"
        console.print(f"{head}[dim]{shown(summary)}[/dim]", highlight=False)
