"""How ``phasegate show`` prints one workflow: its facts, timeline, decisions, holds,
faults, agent runs and, while it waits, its report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from phasegate.cli._app import console, shown
from phasegate.core.priority import priority_name
from phasegate.core.report import render_report
from phasegate.core.terminal import visible


def print_detail(detail: Mapping[str, Any]) -> None:
    """Print ``detail`` (``operations.workflow_detail``'s shape) as ``show`` does."""
    s = detail["workflow"]
    console.print(f"[bold]{s['id']}[/bold] {shown(s['title'])}", highlight=False)
    # two short lines rather than one folded anywhere at 80 columns
    priority = int(s.get("priority") or 0)  # said only when not normal, as status does
    console.print(
        f"  {s['current_phase']} · {s['status']} · dev round {s['dev_round']} · "
        f"profile {s['profile']}" + (f" · priority {priority_name(priority)}" if priority else ""),
        highlight=False,
    )
    console.print(
        (f"  issue #{s['issue_number']} · " if s["issue_number"] else "  no issue yet · ")
        + (f"PR {s['pr_ref']} · " if s["pr_number"] else "no PR yet · ")
        + f"{s['tokens']} tokens · ${s['cost_usd']:.4f}",
        highlight=False,
    )
    if s.get("parent_workflow_id"):
        console.print(f"  conflict-resolution child of {s['parent_workflow_id']}", highlight=False)
    for child in s.get("children", ()):
        console.print(
            f"  conflict-resolution child {child['id']}: {child['status']}", highlight=False
        )
    _print_dependencies(s)
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
    for scratch in detail.get("scratch_checkouts", ()):
        console.print(f"  [yellow]{shown(scratch['note'])}[/yellow]", highlight=False)
    _print_decisions(detail["decisions"])
    _print_violations(detail["violations"])
    _print_forge_faults(detail.get("forge_faults", ()))
    pruned = detail.get("pruned")
    if pruned:
        console.print(
            f"  events pruned ({pruned['at'][:10]}): {pruned['event_count']} deleted, "
            "its trail, milestones and totals kept",
            highlight=False,
        )
    _print_hold(detail.get("merge_hold"), s["id"], s["merge_approved_by"])
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


def _print_dependencies(s: Mapping[str, Any]) -> None:
    """What the workflow waits for, its epic's parent, its pieces' progress (docs/epics.md)."""
    if s.get("epic_parent"):
        console.print(f"  a piece of epic {s['epic_parent']}", highlight=False)
    for edge in s.get("waits_for", ()):
        what = edge["id"] or f"{edge['issue']} (no workflow yet)"
        console.print(f"  after {what}: {edge['status'] or 'waiting'}", highlight=False)
    pieces = s.get("pieces", ())
    if pieces or s.get("branch_strategy") == "epic":
        console.print(f"  branch strategy {s.get('branch_strategy') or 'ticket'}", highlight=False)
    if pieces:
        done = sum(1 for p in pieces if p["status"] == "completed")
        console.print(f"  pieces: {done} of {len(pieces)} completed", highlight=False)
        for p in pieces:
            issue = f" #{p['issue_number']}" if p["issue_number"] else ""
            console.print(
                f"    {p['position']}. {p['id']}{issue} {shown(p['title'] or '')}: {p['status']}",
                highlight=False,
            )


def _print_decisions(records: list[dict[str, Any]]) -> None:
    """The decision records (reversions: docs/contracts/autonomy.md, decision records),
    oldest first."""
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


def _print_hold(hold: Mapping[str, Any] | None, workflow_id: str, approved: str | None) -> None:
    """What holds a waiting merge for a person, and the protected files' diff."""
    if not hold:
        return
    if approved:
        console.print(f"  [cyan]{shown(hold['reason'])}; approved by {approved}[/cyan]")
    else:
        console.print(f"  [bold red]{shown(hold['reason'])}[/bold red]", highlight=False)
        console.print(
            f"  a person decides: `phasegate approve-merge {workflow_id} --by NAME` "
            f'or `phasegate feedback {workflow_id} "..."`',
            highlight=False,
        )
    if hold.get("diff"):
        # Plain lines, never wrapped: a wrapped line would read as a line of context.
        console.print("  the protected paths' diff:", highlight=False)
        console.print(hold["diff"], markup=False, highlight=False, soft_wrap=True)


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


def _print_forge_faults(faults: Sequence[Mapping[str, Any]]) -> None:
    """The newest retries of forge calls, automatic resumes and dropped comments."""
    from phasegate.summary import forge_fault_text

    if not faults:
        return
    console.print(f"[bold yellow]forge faults ({len(faults)} newest)[/bold yellow]")
    for fault in faults:
        console.print(f"  [dim]{fault['at']}[/dim] {shown(forge_fault_text(fault))}")


_MARKS = {
    "completed": "[green]✓[/green]",
    "failed": "[red]✗[/red]",
    "in_progress": "[yellow]…[/yellow]",
    "cancelled": "[dim]−[/dim]",
}


def _print_timeline(milestones: list[dict[str, Any]]) -> None:
    """Milestones grouped under the phase they belong to, in the order they happened."""
    phase = None
    # The newest milestone with a failed check shows why it failed: its output's end.
    failing = next((m for m in reversed(milestones) if _failed_checks(m)), None)
    for m in milestones:
        if m["kind"] in ("agent_process", "check_process"):  # process bookkeeping
            continue
        if m["phase"] != phase:
            phase = m["phase"]
            console.print(f"[bold]{phase}[/bold]  [dim]{(m['created_at'] or '')[11:19]}[/dim]")
        where = "".join(
            f" {label}{value}" for label, value in (("r", m["round"]), ("a", m["attempt"])) if value
        )
        if int((m.get("data") or {}).get("pass") or 1) > 1:  # a later review of that round
            where += f" pass {m['data']['pass']}"
        head = f"  {_MARKS.get(m['status'], m['status'])} {m['kind']}{where}  "
        # one line per milestone: the summary is cut to what the terminal has left
        room = max(console.width - len(Text.from_markup(head)), 20)
        summary = (m["summary"] or "").splitlines()[0] if m["summary"] else ""
        if len(summary) > min(room, 80):
            summary = summary[: min(room, 80) - 1] + "…"
        console.print(f"{head}[dim]{shown(summary)}[/dim]", highlight=False)
        if m is failing:
            _print_failed_checks(m["data"]["checks"])


def _failed_checks(m: dict[str, Any]) -> bool:
    checks = (m.get("data") or {}).get("checks")
    return isinstance(checks, list) and any(not c.get("passed", True) for c in checks)


def _print_failed_checks(checks: list[dict[str, Any]]) -> None:
    """Each failed check's command and the last lines of its output, indented."""
    for check in checks:
        if check.get("passed", True):
            continue
        console.print(f"      [red]✗[/red] {shown(str(check.get('command')))}", highlight=False)
        for line in str(check.get("output") or "(no output)").strip().splitlines()[-5:]:
            console.print(f"        [dim]{shown(line)}[/dim]", highlight=False)
