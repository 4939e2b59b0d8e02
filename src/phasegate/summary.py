"""What a workflow looks like to a person, read from the store: the one shape
``phasegate status``, ``phasegate show`` and the dashboard all show, so the page
and the terminal never disagree about a workflow.

Reading only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from phasegate.core.contract import AWAITING_APPROVAL, WAITING_ON_OTHERS
from phasegate.core.dependencies import waiting_text
from phasegate.core.priority import priority_name
from phasegate.core.profiles import AutomationProfile, decisions_of
from phasegate.forge.base import shown_number
from phasegate.proc.host import holder_alive
from phasegate.store.values import UsageTotals

if TYPE_CHECKING:  # the Store's module imports SQLAlchemy, which `status` need not
    from phasegate.clock import Clock
    from phasegate.store import Store

__all__ = [
    "FORGE_FAULT_EVENTS",
    "BoardReads",
    "ManyReads",
    "forge_fault_text",
    "iso",
    "lease_holder",
    "merge_tail",
    "workflow_detail",
    "workflow_summaries",
    "workflow_summary",
]

#: The events that tell how a workflow met its forge's faults (docs/github.md: faults):
#: a retry of a forge call (``runtime.outage.FORGE_RETRY``), the worker's resume of a
#: forge pause (``runtime.outage.AUTO_RESUME``), a comment the forge refused
#: (``journal.COMMENT_DROPPED``). Named here, not imported: ``status`` loads no store.
FORGE_FAULT_EVENTS = ("forge_retry", "forge_auto_resume", "comment_dropped")
#: The newest of them ``show`` lists.
FORGE_FAULTS_SHOWN = 20


class BoardReads(Protocol):
    """What a workflow's summary reads: the Store, or a SQLite store's board
    (``phasegate.store.sqlite_board``)."""

    clock: Clock

    def usage_totals(self, workflow_id: str) -> UsageTotals: ...

    def proposals(
        self, status: str | None = None, workflow_id: str | None = None
    ) -> list[dict[str, Any]]: ...

    def child_workflows(self, parent_workflow_id: str) -> list[dict[str, Any]]: ...

    def dependencies(self, workflow_id: str) -> list[dict[str, Any]]: ...


class ManyReads(Protocol):
    """What ``workflow_summaries`` reads, each in one query: the Store, or a SQLite
    store's board."""

    clock: Clock

    def usage_by_workflow(
        self, workflow_ids: Collection[str] | None = None
    ) -> dict[str, UsageTotals]: ...

    def child_rows(self) -> list[dict[str, Any]]: ...

    def dependency_rows(self) -> list[dict[str, Any]]: ...

    def proposals(
        self, status: str | None = None, workflow_id: str | None = None
    ) -> list[dict[str, Any]]: ...


class _Gathered:
    """BoardReads answered from what ``workflow_summaries`` read for all at once."""

    def __init__(self, source: ManyReads, rows: Sequence[Mapping[str, Any]]) -> None:
        self.clock = source.clock
        # Every workflow's usage in one pass when most rows are listed (status --all);
        # a board's few hundred by their ids.
        everyone = len(rows) > 2000
        self._usage = source.usage_by_workflow(None if everyone else [r["id"] for r in rows])
        self._children: dict[str, list[dict[str, Any]]] = {}
        for child in source.child_rows():
            self._children.setdefault(child["parent_workflow_id"], []).append(child)
        self._edges: dict[str, list[dict[str, Any]]] = {}
        for edge in source.dependency_rows():
            self._edges.setdefault(edge["workflow_id"], []).append(edge)
        self._proposed: dict[str, list[dict[str, Any]]] = {}
        if any(r["status"] == AWAITING_APPROVAL for r in rows):
            for p in source.proposals(status="proposed"):
                self._proposed.setdefault(p["workflow_id"], []).append(p)

    def usage_totals(self, workflow_id: str) -> UsageTotals:
        return self._usage.get(workflow_id) or UsageTotals()

    def proposals(
        self, status: str | None = None, workflow_id: str | None = None
    ) -> list[dict[str, Any]]:
        assert status == "proposed" and workflow_id is not None  # what a summary asks
        return self._proposed.get(workflow_id, [])

    def child_workflows(self, parent_workflow_id: str) -> list[dict[str, Any]]:
        return self._children.get(parent_workflow_id, [])

    def dependencies(self, workflow_id: str) -> list[dict[str, Any]]:
        return self._edges.get(workflow_id, [])


def workflow_summaries(
    source: ManyReads, rows: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """``workflow_summary`` of each of ``rows``, in their order, read in four
    queries whatever their number (not four a workflow)."""
    gathered = _Gathered(source, rows)
    return [workflow_summary(gathered, row) for row in rows]


def workflow_summary(store: BoardReads, row: Mapping[str, Any]) -> dict[str, Any]:
    """What ``status`` lists and a board's card shows of the workflow ``row``: its
    id, title, phase, status, priority, error, round, profile, issue and PR numbers, branch,
    usage (``tokens``, ``cost_usd`` in USD, ``agent_runs``), ISO 8601 times, its
    parent and children (conflict forks), what it waits for (``waits_for``: the
    workflows or forge issues it runs after) and an epic's ``pieces`` and
    ``epic_parent`` (docs/epics.md), the proposal it awaits, when a forge
    pause is resumed by itself (``resumes_at``), and the worker holding its lease
    (``worker``, ``lease_expires_at``; None when nobody does)."""
    usage = store.usage_totals(row["id"])
    edges = store.dependencies(row["id"])
    error = row.get("error")
    left = [e for e in edges if e["status"] != "completed"]
    if row["status"] in WAITING_ON_OTHERS and left:
        # The stored reason names the statuses of when it was written: said again from now.
        error = waiting_text(row["status"], left, len(edges))
    awaited = None
    if row["status"] == AWAITING_APPROVAL:
        waiting = [
            p
            for p in store.proposals(status="proposed", workflow_id=row["id"])
            if p["kind"] in ("draft_pr_create", "item_create")  # the last: what it awaits
        ]
        awaited = waiting[-1]["id"] if waiting else None
    return {
        "id": row["id"],
        "title": row["title"],
        "current_phase": row["current_phase"],
        "status": row["status"],
        # what workers claim by, larger first (core/priority.py; docs/queues.md)
        "priority": int(row.get("priority") or 0),
        "priority_name": priority_name(int(row.get("priority") or 0)),
        "error": error,
        # the proposal a person's approve/reject moves the workflow on with, if any
        "awaiting_proposal": awaited,
        "dev_round": row["dev_round"],
        "profile": AutomationProfile.from_state(row["state"]).name,
        "reversion_count": int(row["state"].get("reversion_count") or 0),
        "issue_number": row["issue_number"],
        "pr_number": row["pr_number"],
        # as its forge shows it: #12, or GitLab's !3
        "pr_ref": shown_number(row["pr_number"]) if row["pr_number"] else None,
        "branch_name": row["branch_name"],
        # A store shared by several repositories (PostgreSQL) lists them all: whose it is.
        "repository": row.get("repository"),
        "repo_path": row["repo_path"],
        "merge_sha": row["merge_sha"],
        # who approved the merge (approve-merge, or an approving review on the forge)
        # while that approval stands, merged or not; "a person" when none was named
        "merge_approved_by": (
            (row["state"].get("merge_approved_by") or "a person")
            if row["state"].get("merge_approved")
            else None
        ),
        # the git blob of the committed phasegate.toml it started under (None: made in code)
        "cartridge_sha": row["state"].get("cartridge_sha"),
        "verification_status": row["state"].get("verification_status"),
        "verified_by": row["state"].get("verified_by"),
        "tokens": usage.tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cost_usd": round(usage.cost_usd, 6),
        "agent_runs": usage.runs,
        "created_at": iso(row["created_at"]),
        "updated_at": iso(row["updated_at"]),
        "completed_at": iso(row.get("completed_at")),
        # a forge pause's automatic resume (runtime/outage.py); None for any other pause
        "resumes_at": iso(row.get("due_at")) if row["status"] == "paused" else None,
        # the conflict fork (phases/conflict.py): whose child this is, and its own children
        "parent_workflow_id": row.get("parent_workflow_id"),
        "children": [
            {"id": c["id"], "status": c["status"]} for c in store.child_workflows(row["id"])
        ],
        **_dependencies(edges),
        "epic_parent": row["state"].get("epic_parent"),
        # how an epic's pieces branch (ticket, epic), as preparation set it; None before
        "branch_strategy": row["state"].get("branch_strategy"),
        **lease_holder(store, row),
    }


def _dependencies(edges: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``waits_for`` and ``pieces`` of a workflow's edges (``values.edge_row``)."""
    return {
        "waits_for": [
            # the forge issue it was declared by, else the one its workflow has
            {"id": e["depends_on"], "issue": e["issue"] or _number(e), "status": e["status"]}
            for e in edges
            if e["kind"] == "after"
        ],
        "pieces": [
            {
                "id": e["depends_on"],
                "position": e["position"],
                "title": e["title"],
                "status": e["status"],
                "issue_number": e["issue_number"],
            }
            for e in edges
            if e["kind"] == "piece"
        ],
    }


def _number(edge: Mapping[str, Any]) -> str | None:
    return f"#{edge['issue_number']}" if edge["issue_number"] else None


def lease_holder(store: BoardReads, row: Mapping[str, Any]) -> dict[str, Any]:
    """Which worker holds the workflow's lease (``host:pid:token``) and until when, while
    it is unexpired and its holder may be running; both None when nobody does. A
    holder of this host that is gone (a killed worker) holds nothing: the next
    worker or ``resume`` takes the workflow at once."""
    expires = row.get("lease_expires_at")
    owner = row.get("lease_owner")
    if not owner or expires is None or expires <= store.clock.now() or not holder_alive(owner):
        return {"worker": None, "lease_expires_at": None}
    return {"worker": row["lease_owner"], "lease_expires_at": iso(expires)}


def iso(value: datetime | None) -> str | None:
    """``value`` in ISO 8601 (with its offset), or None."""
    return value.isoformat() if value else None


def workflow_detail(store: Store, workflow_id: str) -> dict[str, Any]:
    """What ``show`` prints and a workflow's page shows: ``workflow``
    (``workflow_summary``), ``timeline`` (each phase entered, ``{"phase", "at"}``),
    ``milestones``, ``agent_runs``, ``report`` (the report payload, or None),
    ``violations``, ``decisions`` (the reversion records), ``cleanup`` and
    ``merge_hold`` (``MergeHold.as_state``: reason, protected, violations, diff,
    head; None unless a waiting merge is held) and ``scratch_checkouts`` (each
    ``{"path", "branch", "note"}``: a scratch checkout a killed merge left in the
    workflow's repository, holding a branch the person cannot check out
    meanwhile) and ``forge_faults`` (the newest FORGE_FAULTS_SHOWN of
    ``FORGE_FAULT_EVENTS``, each its data with ``type`` and ``at``) and ``pruned``
    (``Store.pruned_of``: the events a prune deleted, counted; None). Raises
    WorkflowNotFound."""
    row = store.workflow_row(workflow_id)
    milestones = store.milestone_rows(workflow_id)
    # By type (``ix_events_workflow_type``): an agent's output lines, most of a
    # workflow's events, are not read.
    phases = store.events(workflow_id, types=("phase_change",))
    tail = merge_tail(phases)
    phases = [e for e in phases if e["id"] not in tail]
    runs = store.agent_runs(workflow_id)
    summary = workflow_summary(store, row)
    if summary["issue_number"] is None:
        # filed, then the phase failed before it recorded the number (a fetch refused)
        summary["issue_number"] = _filed_issue(milestones)
    return {
        "workflow": summary,
        "timeline": [{"phase": e["data"].get("phase"), "at": iso(e["created_at"])} for e in phases],
        "milestones": [
            {k: (iso(v) if isinstance(v, datetime) else v) for k, v in m.items()}
            for m in milestones
        ],
        "agent_runs": [
            {k: (iso(v) if isinstance(v, datetime) else v) for k, v in r.items()} for r in runs
        ],
        # what was asked: an epic's piece's ticket is its forge issue's text
        "ticket": row["ticket"],
        "report": row["state"].get("report"),
        "violations": [
            {**e["data"], "at": iso(e["created_at"])}
            for e in store.events(workflow_id, types=("violation",))
        ],
        "decisions": decisions_of(row["state"]),
        "cleanup": _cleanup_of(milestones),
        # what keeps the merge from going unattended (phases/merge_gate.py), while it waits
        "merge_hold": row["state"].get("merge_hold") if row["current_phase"] == "wait" else None,
        "scratch_checkouts": _scratch_checkouts(row.get("repo_path")),
        # what `phasegate prune` deleted of its events (store.prune), None if never pruned
        "pruned": store.pruned_of(workflow_id),
        "forge_faults": [
            {**e["data"], "type": e["type"], "at": iso(e["created_at"])}
            for e in store.newest_events(workflow_id, FORGE_FAULTS_SHOWN, types=FORGE_FAULT_EVENTS)
        ],
    }


def merge_tail(events: Sequence[Mapping[str, Any]]) -> set[int]:
    """The ids of the ``phase_change {"phase": "completed"}`` rows that a merge's
    success emits for UI consumers before acceptance verification
    (docs/contracts/lifecycle.md): each one a later ``phase_change`` follows, since
    a workflow truly completed enters no phase after. ``events``: a workflow's rows
    in id order."""
    changes = [e for e in events if e["type"] == "phase_change"]
    return {e["id"] for e in changes[:-1] if (e.get("data") or {}).get("phase") == "completed"}


def forge_fault_text(event: Mapping[str, Any]) -> str:
    """One line for a ``FORGE_FAULT_EVENTS`` event's data with its ``type``:
    ``GET /x answered 502: try 2 after 0.5 s``, ``resumed by itself (automatic resume 1 of 5)``,
    ``comment review:r1 on #3 dropped: …``."""
    kind = event.get("type")
    if kind == "forge_retry":
        status = event.get("status")
        said = f"answered {status}" if isinstance(status, int) else str(status)
        why = "rate limit, " if event.get("why") == "rate_limit" else ""
        return (
            f"{event.get('call')} {said}: {why}try {event.get('attempt')} "
            f"after {event.get('wait_s')} s"
        )
    if kind == "forge_auto_resume":
        return f"resumed by itself (automatic resume {event.get('attempt')} of {event.get('of')})"
    if kind == "comment_dropped":
        return f"comment {event.get('key')} on #{event.get('issue')} dropped: {event.get('reason')}"
    return str(kind)


def _scratch_checkouts(repo_path: str | None) -> list[dict[str, str]]:
    """The scratch checkouts a killed merge left holding a branch in ``repo_path``
    (``Workspace.left_scratch_checkouts``); [] when the repository is gone."""
    # The workspace (checks, sandbox) loads for ``show``; ``status`` reads no checkout.
    from phasegate.git.merge import scratch_note
    from phasegate.git.workspace import GitError, Workspace

    if not repo_path or not Path(repo_path).is_dir():
        return []
    try:
        left = Workspace().left_scratch_checkouts(Path(repo_path))
    except (GitError, OSError):  # not a repository (any more), or not ours to read
        return []
    return [
        {"path": str(path), "branch": branch, "note": scratch_note(path, branch)}
        for path, branch in left
    ]


def _filed_issue(milestones: list[dict[str, Any]]) -> int | None:
    """The number of the issue the journal says was filed, if one was."""
    for m in milestones:
        if m["kind"] == "issue_created" and m["status"] == "completed":
            number = ((m.get("data") or {}).get("result") or {}).get("number")
            if isinstance(number, int):
                return number
    return None


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
