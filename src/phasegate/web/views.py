"""What the dashboard's pages show, read from the store.

Reading only: a person's actions go through ``phasegate.operations`` (or the
engine's decide), never through here. The shapes are ``phasegate show``'s and
``phasegate status``'s (``phasegate.summary``), so the page and
the terminal never disagree about a workflow.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from phasegate.core.contract import ENDED_STATUSES, NEEDS_YOU_STATUSES, WAITING_ON_OTHERS
from phasegate.core.report import render_report
from phasegate.store import Store
from phasegate.store.values import FINISHED_GROUPS
from phasegate.summary import (
    FORGE_FAULT_EVENTS,
    forge_fault_text,
    merge_tail,
    workflow_detail,
    workflow_summaries,
)
from phasegate.web import decision, markdown, timeline

__all__ = [
    "ACTIVITY_ROWS",
    "AGENT_OUTPUT_CHARS",
    "BOARD_GROUPS",
    "FINISHED_SHOWN",
    "activity",
    "agent_output",
    "board",
    "board_marker",
    "describe_event",
    "elapsed_s",
    "graph_run",
    "group_of",
    "workflow_page",
]

#: The board's groups, in the order shown: what needs a person first.
BOARD_GROUPS: tuple[tuple[str, str], ...] = (
    ("needs_you", "Needs you"),
    ("running", "Running"),
    ("queued", "Queued"),
    ("waiting", "Waiting"),
    ("done", "Done"),
    ("failed", "Failed"),
)

_DONE = FINISHED_GROUPS["done"]

#: The newest workflows a finished group (done, failed) shows: a year of work
#: holds thousands, and ``phasegate status`` lists them all.
FINISHED_SHOWN = 50

#: The newest event rows a workflow page lists in its activity (the stream has them all).
ACTIVITY_ROWS = 300

#: Event types the activity leaves out: an agent's output lines have a place of their own.
_NOT_ACTIVITY = frozenset({"agent_output"})


def group_of(summary: Mapping[str, Any]) -> str:
    """The board group of a workflow's ``workflow_summary``: needs_you (a status of
    ``contract.NEEDS_YOU_STATUSES``, but a merge approved and not yet done, and a
    forge pause the worker resumes by itself: ``resumes_at``), running
    (a live worker holds its lease), done (completed, cancelled), failed,
    waiting (for a time: the forge pause, or for its conflict children to
    end, or for the workflows it depends on: blocked, pieces), else queued
    (runnable, not held: the next free worker takes it)."""
    status = summary["status"]
    approved = summary.get("current_phase") == "wait" and summary.get("merge_approved_by")
    if status in NEEDS_YOU_STATUSES and not approved and not summary.get("resumes_at"):
        return "needs_you"
    if status in _DONE:
        return "done"
    if status == "failed":
        return "failed"
    if summary.get("worker"):
        return "running"
    children = summary.get("children") or ()
    if status in WAITING_ON_OTHERS:
        return "waiting"
    if summary.get("resumes_at") or any(c.get("status") not in ENDED_STATUSES for c in children):
        return "waiting"
    return "queued"


def board(store: Store, now: datetime) -> list[dict[str, Any]]:
    """The board: one ``{"key", "title", "cards", "total"}`` per group of
    BOARD_GROUPS, in that order; each card a ``_summary`` plus ``elapsed_s``
    (``elapsed_s``), ``started_by`` (the person, or who labelled its issue;
    None), ``labels`` (its issue's) and ``repository_shown`` (the forge
    repository, else the clone's folder name), newest first within a group. A
    finished group (done, failed) has its newest FINISHED_SHOWN cards only;
    ``total`` counts the group's workflows, shown or not."""
    rows, totals = store.board_rows(FINISHED_SHOWN)
    cards: dict[str, list[dict[str, Any]]] = {key: [] for key, _ in BOARD_GROUPS}
    for row, summary in zip(rows, workflow_summaries(store, rows), strict=True):
        summary["elapsed_s"] = elapsed_s(row, now)
        state = row["state"]
        # What the board's filters read: who started it, its issue's labels, its repository.
        summary["started_by"] = state.get("started_by") or state.get("triggered_by")
        summary["labels"] = list(state.get("issue_labels") or ())
        summary["repository_shown"] = summary.get("repository") or Path(row["repo_path"]).name
        cards[group_of(summary)].append(summary)
    return [
        {
            "key": key,
            "title": title,
            "cards": list(reversed(cards[key])),
            "total": totals.get(key, len(cards[key])),
        }
        for key, title in BOARD_GROUPS
    ]


def elapsed_s(row: Mapping[str, Any], now: datetime) -> float:
    """Seconds a workflow ``row`` has taken: from its creation to its completion;
    a cancelled one's to its cancel (its last change: nothing moves it after),
    else to ``now``."""
    end = row.get("completed_at") or (row["updated_at"] if row["status"] == "cancelled" else now)
    return max(0.0, (end - row["created_at"]).total_seconds())


def board_marker(store: Store) -> tuple[tuple[Any, ...], ...]:
    """What changes whenever a card would: each workflow's id, version, status,
    phase and lease holder (one read), so a live board is sent again only then."""
    return tuple(store.workflow_marks())


def workflow_page(store: Store, workflow_id: str, language: str | None = None) -> dict[str, Any]:
    """A workflow's page: ``_detail`` (summary, timeline, milestones, agent runs,
    report, violations, decisions, cleanup) plus its plan text (``state.plan``)
    and as sanitized HTML (``plan_html``), the timeline as cycles (``cycles``:
    ``web.timeline.cycles``), the same milestones grouped under their phase
    (``phases``: a list of ``{"phase", "at", "milestones"}`` in the order the
    phases were entered), and its proposals with their evidence
    (``evidence_text``: indented JSON), the report as text (``report_text``) and
    as sanitized HTML (``report_html``) in ``language`` (else the workflow's
    ``content_language``; ``report_language`` says which, None without a
    report), what deciding it takes (``decision``:
    ``web.decision.decision_panel``), its activity (``activity``), the last event
    row's id (``last_event_id``: where the page's live stream starts) and the latest
    agent run's output (``agent_output``). Raises WorkflowNotFound."""
    detail = workflow_detail(store, workflow_id)
    row = store.workflow_row(workflow_id)
    detail["plan"] = row["state"].get("plan")
    detail["plan_html"] = markdown.to_html(detail["plan"])
    detail["ticket"] = row["ticket"]
    detail["graph_runs"] = [graph_run(run) for run in store.runs_of(workflow_id)]
    report = detail["report"]
    # The payload renders in the viewer's language, whatever the workflow wrote in.
    shown_in = (language or report.get("content_language") or "en") if report else None
    detail["report_language"] = shown_in  # the article's lang: a font for its script
    detail["report_text"] = render_report(report, shown_in) if report and shown_in else None
    detail["report_html"] = markdown.to_html(detail["report_text"])
    detail["cycles"] = timeline.cycles(
        detail["timeline"], detail["milestones"], detail["decisions"]
    )
    detail["decision"] = decision.decision_panel(detail, row["user_feedback"])
    # The page shows everything up to here; its live stream starts after it. Read
    # before the output below: what lands between the two is shown twice at the
    # most, never lost (the page's script skips an output row it has).
    detail["last_event_id"] = store.last_event_id(workflow_id)
    detail["activity"] = activity(
        store.newest_events(
            workflow_id, ACTIVITY_ROWS, without=_NOT_ACTIVITY, before_id=detail["last_event_id"] + 1
        )
    )
    detail["agent_output"] = agent_output(store, workflow_id)
    phases: list[dict[str, Any]] = []
    seen: dict[str, dict[str, Any]] = {}
    for entry in detail["timeline"]:
        name = entry["phase"]
        if name not in seen:
            seen[name] = {"phase": name, "at": entry["at"], "milestones": []}
            phases.append(seen[name])
    for milestone in detail["milestones"]:
        name = milestone["phase"]
        if name not in seen:  # a phase entered before its phase_change was recorded
            seen[name] = {"phase": name, "at": None, "milestones": []}
            phases.append(seen[name])
        seen[name]["milestones"].append(milestone)
    detail["phases"] = phases
    detail["proposals"] = [
        {**p, "evidence_text": json.dumps(p["evidence"], indent=2, default=str)}
        for p in store.proposals(workflow_id=workflow_id)
    ]
    return detail


def activity(events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A workflow page's activity: the newest ACTIVITY_ROWS event rows (oldest
    first) but agent output, each ``{"id", "type", "at", "text"}`` (``text``:
    ``describe_event``; ``at``: the row's ``created_at``)."""
    shown = [e for e in events if e["type"] not in _NOT_ACTIVITY][-ACTIVITY_ROWS:]
    tail = merge_tail(events)
    return [
        {
            "id": e["id"],
            "type": e["type"],
            "at": e.get("created_at"),
            "text": "merged (acceptance verification follows)"
            if e["id"] in tail
            else describe_event(e),
        }
        for e in shown
    ]


def describe_event(event: Mapping[str, Any]) -> str:
    """One line for an event row: who decided what (``decision``), which phase was
    entered (``phase_change``), a milestone's kind and status, an agent started
    or finished, what needs a person (``needs_you``), a forge fault
    (``summary.forge_fault_text``), a worktree's setup and files
    (``worktree_setup``, ``worktree_files``), what a prune deleted (``events_pruned``),
    else the row's data in words (``key value, ...``)."""
    data = event.get("data") or {}
    kind = event["type"]
    if kind == "phase_change" and "phase" in data:
        return f"entered {data['phase']}"
    if kind == "milestone_updated" and "kind" in data:
        return f"{data['kind']}: {data.get('status', '?')}"
    if kind == "agent_started" and "role" in data:
        again = f", pass {data['pass']}" if data.get("pass") else ""
        return f"{data['role']} agent ({data.get('runner')}), round {data.get('round')}{again}"
    if kind == "agent_waiting" and "role" in data:  # agents/slots.py
        cap = f"{data.get('scope')} {data.get('key')}: {data.get('cap')} at once"
        return f"{data['role']} agent waits for a slot ({cap})"
    if kind == "agent_finished" and "role" in data:
        error = f": {data['error']}" if data.get("error") else ""
        return f"{data['role']} agent: {data.get('outcome')}{error}"
    if kind == "decision" and "action" in data:
        extra = {k: v for k, v in data.items() if k not in ("action", "by")}
        said = f" ({_in_words(extra)})" if extra else ""
        return f"{data['action']} by {data.get('by', '?')}{said}"
    if kind == "needs_you" and "status" in data:
        return f"needs you: {data['status']}"
    if kind in FORGE_FAULT_EVENTS:
        return forge_fault_text({**data, "type": kind})
    if kind == "worktree_setup" and "command" in data:
        how = "passed" if data.get("passed") else f"failed (exit {data.get('exit_code')})"
        tail = str(data.get("output") or "").strip().splitlines()[-3:]
        where = f"{data['checkout']} setup" if data.get("checkout") else "worktree setup"
        return f"{where} {how}: {' / '.join(tail) or '(no output)'}"
    if kind == "ports_reserved" and "base" in data:
        last = int(data["base"]) + int(data.get("count") or 1) - 1
        return f"ports {data['base']}-{last} reserved (PHASEGATE_PORT_BASE)"
    if kind == "worktree_files" and "copied" in data:
        skipped = [s.get("path") or s.get("entry") for s in data.get("skipped") or ()]
        where = f"{data['checkout']} files" if data.get("checkout") else "worktree files"
        said = f"{where}: copied {', '.join(data['copied']) or 'none'}"
        said += f"; linked {', '.join(data.get('linked') or ()) or 'none'}"
        return said + (f"; skipped {', '.join(map(str, skipped))}" if skipped else "")
    if kind == "events_pruned" and "events" in data:
        counts = data.get("events") or {}
        calls = int(data.get("graph_calls") or 0)
        each = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        said = f"{sum(int(n) for n in counts.values())} older events pruned"
        said += f" ({each})" if each else ""
        said += f", {calls} graph calls" if calls else ""
        return said + f", before {str(data.get('older_than') or '?')[:10]}"
    return _in_words(data)


def _in_words(data: Mapping[str, Any]) -> str:
    """An event's data as ``key value, key value`` (a nested mapping in
    parentheses): a line a person reads, not JSON."""
    said = []
    for key, value in sorted(data.items()):
        shown = f"({_in_words(value)})" if isinstance(value, Mapping) else value
        if isinstance(value, list | tuple):
            shown = ", ".join(str(v) for v in value)
        said.append(f"{str(key).replace('_', ' ')} {shown}")
    return ", ".join(said)


#: Characters of an agent's output a page shows at the most: its last ones
#: (dashboard.js keeps the same bound as rows come in).
AGENT_OUTPUT_CHARS = 64 * 1024


def agent_output(store: Store, workflow_id: str) -> dict[str, Any]:
    """The latest agent run's output (``agents.output``): ``{"text", "last_id",
    "running"}``. ``text`` is a header naming the run (role, runner, phase,
    round; what dashboard.js writes on an ``agent_started`` event) and the
    text of its ``agent_output`` rows, cut to its last AGENT_OUTPUT_CHARS at a
    line's start; ``last_id`` the id of the newest of those events (the live
    stream appends only rows after it), 0 when no agent ran; ``running``
    whether the run has not finished. Only the rows shown are read: newest first,
    until AGENT_OUTPUT_CHARS are had."""
    started = store.newest_events(workflow_id, 1, types=("agent_started",))
    if not started:
        return {"text": "", "last_id": 0, "running": False}
    start = started[0]
    after = start["id"]
    parts: list[str] = []
    size, before = 0, None
    while size <= AGENT_OUTPUT_CHARS:
        rows = store.newest_events(
            workflow_id, _OUTPUT_BATCH, types=("agent_output",), after_id=after, before_id=before
        )
        parts[:0] = [str(r["data"].get("text", "")) for r in rows]
        size += sum(len(p) for p in parts[: len(rows)])
        if len(rows) < _OUTPUT_BATCH:
            break
        before = rows[0]["id"]
    text = "".join(parts)
    if len(text) > AGENT_OUTPUT_CHARS:
        text = text[-AGENT_OUTPUT_CHARS:]
        text = text[text.find("\n") + 1 :]
    newest = store.newest_events(workflow_id, 1, types=_RUN_ROWS, after_id=after)
    finished = store.newest_events(workflow_id, 1, types=("agent_finished",), after_id=after)
    return {
        "text": output_header(start["data"]) + text,
        "last_id": newest[-1]["id"] if newest else start["id"],
        "running": not finished,
    }


#: Output rows read at a time, newest first, until a page has its fill.
_OUTPUT_BATCH = 1000
#: The rows of an agent run the live stream follows after its start.
_RUN_ROWS = ("agent_output", "agent_finished", "agent_started")


def output_header(data: Mapping[str, Any]) -> str:
    """The line an agent run's output starts with on a page (dashboard.js's too)."""
    return (
        f"── {data.get('role')} agent ({data.get('runner')}), "
        f"{data.get('phase')}, round {data.get('round')} ──\n"
    )


def graph_run(run: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded graph run as a workflow page shows it (docs/contracts/graph.md): its id and
    date, where it stopped, the plan competition and the plan attack (indented
    JSON, ``plan_competition``/``plan_attack``; None when the run had none), and
    each agent call's ``{"index", "role", "thread", "response"}``."""
    record = run["record"]

    def shown(key: str) -> str | None:
        value = record.get(key)
        return json.dumps(value, indent=2, default=str) if value else None

    return {
        "run_id": run["run_id"],
        "date": run["date"],
        "stopped": json.dumps(record.get("stopped"), default=str)
        if record.get("stopped")
        else None,
        "plan_competition": shown("plan_competition"),
        "plan_attack": shown("plan_attack"),
        "calls": [
            {k: c.get(k) for k in ("index", "role", "thread", "response")}
            for c in record.get("calls") or ()
        ],
    }
