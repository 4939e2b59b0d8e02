"""Workflows, their milestones and events; the single commit path is
``store.commit``, reached as ``Store.commit_phase_result``."""

from __future__ import annotations

import secrets
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from phasegate.core.contract import (
    BLOCKED,
    PHASE_ORDER,
    PHASE_STATUS_MAP,
    PREPARATION,
    ContractViolation,
    EventWrite,
    MilestoneView,
    MilestoneWrite,
    PhasegateError,
    PhaseResult,
    WorkflowContext,
    WorkflowNotFound,
)
from phasegate.core.state import WorkflowState, state_of
from phasegate.store import dependencies
from phasegate.store import tables as t
from phasegate.store._base import INSERT_EVENT, StoreBase
from phasegate.store.commit import (
    UPDATABLE_COLUMNS,
    commit_phase_result,
    dedupe_key,
    milestone_upsert,
    milestone_writes,
    workflow_dict,
)
from phasegate.store.leases import Fence, of_repository

__all__ = ["UPDATABLE_COLUMNS", "IssueTaken", "WorkflowRows", "commit_phase_result"]


class IssueTaken(PhasegateError):
    """A workflow was started for this forge issue already."""

    def __init__(self, repository: str, number: int, workflow_id: str) -> None:
        super().__init__(
            f"{repository}#{number} has workflow {workflow_id} already "
            f"(`phasegate show {workflow_id}`)"
        )
        self.repository = repository
        self.number = number
        self.workflow_id = workflow_id


#: What ``load_context`` and ``workflow_row`` read, built once: every advance reads them.
_SELECT_WORKFLOW = sa.select(t.workflows).where(t.workflows.c.id == sa.bindparam("w_id"))
_SELECT_MILESTONES = (
    sa.select(t.milestones)
    .where(t.milestones.c.workflow_id == sa.bindparam("w_id"))
    .order_by(t.milestones.c.id)
)


class WorkflowRows(StoreBase):
    """Workflow rows, milestones and events; ``commit_phase_result``'s home."""

    # -- workflows --------------------------------------------------------------

    def create_workflow(
        self,
        *,
        title: str,
        ticket: str,
        repo_path: str,
        base_branch: str,
        auto_merge: bool,
        content_language: str,
        state: WorkflowState | None = None,
        issue: tuple[str, int] | None = None,
        parent_workflow_id: str | None = None,
        phase: str = PREPARATION,
        branch_name: str | None = None,
        repository: str | None = None,
        priority: int = 0,
        after: Sequence[str] = (),
        after_issues: Sequence[tuple[str, int]] = (),
    ) -> str:
        """Insert a workflow in ``phase`` (default ``preparation``); returns its id
        (8 hex digits).

        ``issue`` (forge repository ``owner/name``, issue number): the workflow is
        for that existing issue (a trigger): ``issue_number`` is set and
        ``state["forge_repository"]`` records the repository. Raises IssueTaken when
        a workflow has that issue already: the lookup and the insert are one
        writing transaction serialized on the issue (``Dialect.serialize``), so
        two watchers racing, on one machine or on two, never both start one.

        A conflict-resolution child (phases/conflict.py) names the workflow it was
        forked from in ``parent_workflow_id``, starts in ``merge`` and works on its
        parent's ``branch_name``. Raises ContractViolation for a phase outside
        PHASE_ORDER.

        ``repository``: the team forge's repository (``owner/name``) the workflow
        is of, what a worker in any clone of it claims it by (``workflows.repository``);
        None: the repository at ``repo_path`` (the local forge).
        A child is of its parent's repository. ``priority``: the order workers claim
        it in (``phasegate.core.priority``; larger first); a child's is its parent's.

        ``after`` (workflow ids) and ``after_issues`` (forge issues ``(owner/name, N)``,
        from ``Depends on #N``): the workflow waits for them, ``blocked`` until each
        has completed (``store.dependencies``); in the same transaction, so no worker
        sees it unblocked first. Raises WorkflowNotFound for an unknown id of
        ``after``, DependencyCycle (nothing recorded) when its dependencies, or the
        issue it is for, close a cycle.
        """
        if phase not in PHASE_ORDER:
            raise ContractViolation(f"a workflow cannot start in phase {phase!r}")
        now = self.clock.now()
        workflow_id = secrets.token_hex(4)
        state = state_of(state)
        if issue is not None:
            state["forge_repository"] = issue[0]
        # Only what is given: a store still at an older revision (its migration
        # test) has no parent_workflow_id column to insert a NULL into.
        with self.transaction() as conn:
            if parent_workflow_id is not None:
                parent = conn.execute(
                    sa.select(t.workflows.c.repository, t.workflows.c.priority).where(
                        t.workflows.c.id == parent_workflow_id
                    )
                ).first()
                if parent is not None:
                    repository = repository if repository is not None else parent[0]
                    priority = priority or int(parent[1] or 0)
            optional = {
                key: value
                for key, value in (
                    ("parent_workflow_id", parent_workflow_id),
                    ("branch_name", branch_name),
                    ("repository", repository),
                    ("priority", priority or None),
                )
                if value is not None
            }
            if issue is not None:
                # READ COMMITTED (PostgreSQL) lets two lookups both find nothing:
                # the second waits here until the first committed its insert.
                self.dialect.serialize(conn, f"issue:{issue[0]}#{issue[1]}")
                taken = self._workflow_for_issue(conn, *issue)
                if taken is not None:
                    raise IssueTaken(issue[0], issue[1], taken)
            conn.execute(
                t.workflows.insert().values(
                    id=workflow_id,
                    title=title,
                    ticket=ticket,
                    repo_path=repo_path,
                    base_branch=base_branch,
                    current_phase=phase,
                    status=PHASE_STATUS_MAP[phase],
                    auto_merge=auto_merge,
                    content_language=content_language,
                    issue_number=issue[1] if issue is not None else None,
                    state=state,
                    created_at=now,
                    updated_at=now,
                    **optional,
                )
            )
            self.write_event(conn, workflow_id, EventWrite("phase_change", {"phase": phase}))
            if issue is not None:
                dependencies.resolve_issue(conn, workflow_id, *issue)
            if after or after_issues:
                waits = dependencies.link(conn, workflow_id, after, after_issues, now)
                if waits:
                    left = dependencies.edges_of(conn, workflow_id)
                    conn.execute(
                        t.workflows.update()
                        .where(t.workflows.c.id == workflow_id)
                        .values(
                            status=BLOCKED,
                            error=dependencies.waiting_text(BLOCKED, left, len(left)),
                        )
                    )
                    self.write_event(conn, workflow_id, EventWrite(BLOCKED, {"after": waits}))
            self.dialect.notify(conn)  # a new workflow for a waiting worker
        return workflow_id

    def workflow_for_issue(self, repository: str, number: int) -> str | None:
        """The id of the workflow started for issue ``number`` of forge repository
        ``repository`` (``create_workflow(issue=...)``), else None."""
        with self.reading() as conn:
            return self._workflow_for_issue(conn, repository, number)

    @staticmethod
    def _workflow_for_issue(conn: sa.Connection, repository: str, number: int) -> str | None:
        # The repository is in the JSON state, read the same way on every dialect:
        # few workflows share an issue number, so the filter in Python is cheap.
        rows = conn.execute(
            sa.select(t.workflows.c.id, t.workflows.c.state)
            .where(t.workflows.c.issue_number == number)
            .order_by(t.workflows.c.created_at, t.workflows.c.id)
        )
        return next(
            (r.id for r in rows if (r.state or {}).get("forge_repository") == repository), None
        )

    def child_workflows(self, parent_workflow_id: str) -> list[dict[str, Any]]:
        """The rows of the workflows forked from ``parent_workflow_id``, oldest first."""
        c = t.workflows.c
        with self.reading() as conn:
            rows = (
                conn.execute(
                    sa.select(t.workflows)
                    .where(c.parent_workflow_id == parent_workflow_id)
                    .order_by(c.created_at, c.id)
                )
                .mappings()
                .all()
            )
        return [workflow_dict(r) for r in rows]

    def workflow_row(self, workflow_id: str) -> dict[str, Any]:
        """The workflow's row as a dict. Raises WorkflowNotFound."""
        with self.reading() as conn:
            return self._workflow_row(conn, workflow_id)

    @staticmethod
    def _workflow_row(conn: sa.Connection, workflow_id: str) -> dict[str, Any]:
        row = conn.execute(_SELECT_WORKFLOW, {"w_id": workflow_id}).mappings().first()
        if row is None:
            raise WorkflowNotFound(workflow_id)
        return workflow_dict(row)

    def list_workflows(self, statuses: Collection[str] | None = None) -> list[dict[str, Any]]:
        """Every workflow row (only those in ``statuses`` when given), oldest first."""
        query = sa.select(t.workflows).order_by(t.workflows.c.created_at, t.workflows.c.id)
        if statuses is not None:
            query = query.where(t.workflows.c.status.in_(sorted(statuses)))
        with self.reading() as conn:
            rows = conn.execute(query).mappings().all()
        # Through the same conversion as workflow_row, so `status` and `show`
        # report the same (UTC-aware) timestamps.
        return [workflow_dict(r) for r in rows]

    def runnable_workflow_ids(self, statuses: frozenset[str]) -> list[str]:
        """Ids of workflows whose status is in ``statuses``, oldest first."""
        with self.reading() as conn:
            return list(
                conn.execute(
                    sa.select(t.workflows.c.id)
                    .where(t.workflows.c.status.in_(sorted(statuses)))
                    .order_by(t.workflows.c.created_at, t.workflows.c.id)
                ).scalars()
            )

    def workflow_ids_with_milestone(
        self, kind: str, status: str, *, repo_path: str | None = None, repository: str | None = None
    ) -> list[str]:
        """Ids of workflows holding a ``kind`` milestone in ``status``, oldest first
        (a failed ``cleanup`` waiting for its retry, whatever the workflow's status);
        with ``repo_path``, only that repository's (``of_repository``)."""
        m = t.milestones
        query = sa.select(m.c.workflow_id).where(m.c.kind == kind, m.c.status == status)
        if repo_path is not None:
            mine = sa.select(t.workflows.c.id).where(of_repository(repository, repo_path))
            query = query.where(m.c.workflow_id.in_(mine.scalar_subquery()))
        with self.reading() as conn:
            return list(
                conn.execute(
                    query.group_by(m.c.workflow_id).order_by(sa.func.min(m.c.id))
                ).scalars()
            )

    def load_context(self, workflow_id: str) -> WorkflowContext:
        """The frozen snapshot a phase receives, the row and its milestones read in one
        transaction. Raises WorkflowNotFound, StoreUnavailable."""
        with self.reading() as conn:
            row = self._workflow_row(conn, workflow_id)
            milestones = conn.execute(_SELECT_MILESTONES, {"w_id": workflow_id}).mappings().all()
        return WorkflowContext(
            id=row["id"],
            title=row["title"],
            ticket=row["ticket"],
            repo_path=row["repo_path"],
            base_branch=row["base_branch"],
            current_phase=row["current_phase"],
            status=row["status"],
            version=row["version"],
            current_round=row["current_round"],
            dev_round=row["dev_round"],
            branch_name=row["branch_name"],
            worktree_path=row["worktree_path"],
            issue_number=row["issue_number"],
            pr_number=row["pr_number"],
            merge_sha=row["merge_sha"],
            auto_merge=bool(row["auto_merge"]),
            user_feedback=row["user_feedback"],
            content_language=row["content_language"],
            error=row["error"],
            parent_workflow_id=row["parent_workflow_id"],
            state=state_of(row["state"]),
            milestones=tuple(_milestone_view(r) for r in milestones),
        )

    # -- the single commit path (docs/contracts/lifecycle.md) ----------------------

    def commit_phase_result(
        self,
        ctx: WorkflowContext,
        result: PhaseResult,
        *,
        fence: Fence | None = None,
        due_in_s: float | None = None,
    ) -> dict[str, Any]:
        """Commit ``result`` for the phase ``ctx`` was loaded in; see
        ``store.commit.commit_phase_result``."""
        return commit_phase_result(self, ctx, result, fence=fence, due_in_s=due_in_s)

    # -- milestones -------------------------------------------------------------

    @staticmethod
    def dedupe_key(workflow_id: str, phase: str, write: MilestoneWrite) -> str:
        """The milestone's unique key (``store.commit.dedupe_key``)."""
        return dedupe_key(workflow_id, phase, write)

    def milestones(self, workflow_id: str) -> list[MilestoneView]:
        """The workflow's milestones, oldest first."""
        return [_milestone_view(r) for r in self._workflow_rows(t.milestones, workflow_id)]

    def milestone_rows(self, workflow_id: str) -> list[dict[str, Any]]:
        """The workflow's milestones as rows (with timestamps), oldest first."""
        return self._workflow_rows(t.milestones, workflow_id)

    def milestone_by_key(self, dedupe_key: str) -> MilestoneView | None:
        with self.reading() as conn:
            row = (
                conn.execute(sa.select(t.milestones).where(t.milestones.c.dedupe_key == dedupe_key))
                .mappings()
                .first()
            )
        return _milestone_view(row) if row else None

    def write_milestone(self, workflow_id: str, phase: str, write: MilestoneWrite) -> MilestoneView:
        """Upsert one milestone in its own transaction (the side-effect journal's
        write); returns it as written."""
        milestones, events = milestone_writes(workflow_id, phase, (write,), self.clock.now())
        with self.transaction() as conn:
            row = (
                conn.execute(milestone_upsert(self.dialect, returning=True), milestones)
                .mappings()
                .one()
            )
            conn.execute(INSERT_EVENT, events)
        return _milestone_view(row)

    def _upsert_milestone(
        self, conn: sa.Connection, workflow_id: str, phase: str, write: MilestoneWrite
    ) -> str:
        """Upsert ``write`` and its ``milestone_updated`` event in ``conn``'s
        transaction; returns its dedupe key."""
        milestones, events = milestone_writes(workflow_id, phase, (write,), self.clock.now())
        conn.execute(milestone_upsert(self.dialect), milestones)
        conn.execute(INSERT_EVENT, events)
        return str(milestones[0]["dedupe_key"])

    def settle_milestone(
        self,
        milestone: MilestoneView,
        status: str,
        *,
        summary: str | None = None,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        """Settle an existing milestone in place (``in_progress`` → a final status)."""
        with self.transaction() as conn:
            row = conn.execute(
                sa.select(t.milestones.c.workflow_id).where(t.milestones.c.id == milestone.id)
            ).scalar_one()
            conn.execute(
                t.milestones.update()
                .where(t.milestones.c.id == milestone.id)
                .values(
                    status=status,
                    summary=milestone.summary if summary is None else summary,
                    data={**milestone.data, **(data or {})},
                    updated_at=self.clock.now(),
                )
            )
            self.write_event(
                conn,
                row,
                EventWrite(
                    "milestone_updated",
                    {
                        "kind": milestone.kind,
                        "phase": milestone.phase,
                        "status": status,
                        "key": milestone.dedupe_key,
                    },
                ),
            )

    def in_progress_milestones(self, workflow_id: str) -> list[MilestoneView]:
        """The workflow's milestones still ``in_progress``, oldest first."""
        # Read on every claim (SideEffects.reconcile): filtered by the database, not
        # by decoding a history that grows with every round.
        rows = self._workflow_rows(
            t.milestones, workflow_id, t.milestones.c.status == "in_progress"
        )
        return [_milestone_view(r) for r in rows]

    # -- events -----------------------------------------------------------------

    def events(
        self, workflow_id: str, after_id: int = 0, types: Collection[str] | None = None
    ) -> list[dict[str, Any]]:
        """The workflow's events with id > ``after_id``, oldest first; only those of
        ``types`` when given."""
        where = [t.events.c.id > after_id]
        if types is not None:
            where.append(t.events.c.type.in_(list(types)))
        return self._workflow_rows(t.events, workflow_id, *where)

    def last_event_id(self, workflow_id: str) -> int:
        """The id of the workflow's newest event, 0 when it has none."""
        with self.reading() as conn:
            found = conn.execute(
                sa.select(sa.func.max(t.events.c.id)).where(t.events.c.workflow_id == workflow_id)
            ).scalar()
        return int(found or 0)

    def add_event(self, workflow_id: str, event: EventWrite) -> None:
        with self.transaction() as conn:
            self.write_event(conn, workflow_id, event)


def _milestone_view(row: Mapping[Any, Any]) -> MilestoneView:
    return MilestoneView(
        id=row["id"],
        kind=row["kind"],
        phase=row["phase"],
        round=row["round"],
        attempt=row["attempt"],
        status=row["status"],
        dedupe_key=row["dedupe_key"],
        summary=row["summary"],
        data=dict(row["data"] or {}),
    )
