"""Workflows, their milestones and events, and the single commit path (spec 000)."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any, NoReturn

import sqlalchemy as sa

from phasegate.contract import (
    COMPLETED,
    PHASE_ORDER,
    PHASE_STATUS_MAP,
    PREPARATION,
    ContractViolation,
    EventWrite,
    MilestoneView,
    MilestoneWrite,
    PhasegateError,
    PhaseResult,
    StaleContext,
    WorkflowContext,
    WorkflowNotFound,
    is_legal_next_phase,
    next_phase,
)
from phasegate.store import tables as t
from phasegate.store._base import FenceLost, StoreBase, _utc
from phasegate.store.leases import Fence, of_repository

#: Workflow columns a PhaseResult may set through ``updates``. current_phase and
#: status are deliberately absent: only the outcome decides those.
UPDATABLE_COLUMNS = frozenset(
    {
        "current_round",
        "dev_round",
        # A workflow taken over by another clone of its forge repository (takeover.py)
        "repo_path",
        "branch_name",
        "worktree_path",
        "issue_number",
        "pr_number",
        "merge_sha",
        "auto_merge",
        "user_feedback",
    }
)


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


def _workflow_dict(row: Mapping[str, Any]) -> dict[str, Any]:
    """A workflow row as a dict, its timestamps UTC-aware."""
    out = dict(row)
    for key in ("created_at", "updated_at", "completed_at", "lease_expires_at"):
        out[key] = _utc(out[key])
    return out


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
        state: Mapping[str, Any] | None = None,
        issue: tuple[str, int] | None = None,
        parent_workflow_id: str | None = None,
        phase: str = PREPARATION,
        branch_name: str | None = None,
        repository: str | None = None,
    ) -> str:
        """Insert a workflow in ``phase`` (default ``preparation``); returns its id
        (8 hex digits).

        ``issue`` (forge repository ``owner/name``, issue number): the workflow is
        for that existing issue (a trigger, issue 11): ``issue_number`` is set and
        ``state["forge_repository"]`` records the repository. Raises IssueTaken when
        a workflow has that issue already: the lookup and the insert are one
        writing transaction serialized on the issue (``Dialect.serialize``), so
        two watchers racing, on one machine or on two, never both start one.

        A conflict-resolution child (phases/conflict.py) names the workflow it was
        forked from in ``parent_workflow_id``, starts in ``merge`` and works on its
        parent's ``branch_name``. Raises ContractViolation for a phase outside
        PHASE_ORDER.

        ``repository``: the team forge's repository (``owner/name``) the workflow
        is of, what a worker in any clone of it claims it by (``workflows.repository``,
        issue 12 item 2); None: the repository at ``repo_path`` (the local forge).
        A child is of its parent's repository.
        """
        if phase not in PHASE_ORDER:
            raise ContractViolation(f"a workflow cannot start in phase {phase!r}")
        now = self.clock.now()
        workflow_id = secrets.token_hex(4)
        state = dict(state or {})
        if issue is not None:
            state["forge_repository"] = issue[0]
        # Only what is given: a store still at an older revision (its migration
        # test) has no parent_workflow_id column to insert a NULL into.
        with self.transaction() as conn:
            if repository is None and parent_workflow_id is not None:
                repository = conn.execute(
                    sa.select(t.workflows.c.repository).where(
                        t.workflows.c.id == parent_workflow_id
                    )
                ).scalar()
            optional = {
                key: value
                for key, value in (
                    ("parent_workflow_id", parent_workflow_id),
                    ("branch_name", branch_name),
                    ("repository", repository),
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
            self._add_event(conn, workflow_id, EventWrite("phase_change", {"phase": phase}))
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
        return [_workflow_dict(r) for r in rows]

    def workflow_row(self, workflow_id: str) -> dict[str, Any]:
        """The workflow's row as a dict. Raises WorkflowNotFound."""
        with self.reading() as conn:
            return self._workflow_row(conn, workflow_id)

    @staticmethod
    def _workflow_row(conn: sa.Connection, workflow_id: str) -> dict[str, Any]:
        row = (
            conn.execute(sa.select(t.workflows).where(t.workflows.c.id == workflow_id))
            .mappings()
            .first()
        )
        if row is None:
            raise WorkflowNotFound(workflow_id)
        return _workflow_dict(row)

    def list_workflows(self) -> list[dict[str, Any]]:
        """Every workflow row, oldest first."""
        with self.reading() as conn:
            rows = (
                conn.execute(
                    sa.select(t.workflows).order_by(t.workflows.c.created_at, t.workflows.c.id)
                )
                .mappings()
                .all()
            )
        # Through the same conversion as workflow_row, so `status` and `show`
        # report the same (UTC-aware) timestamps.
        return [_workflow_dict(r) for r in rows]

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
            milestones = self._workflow_rows(t.milestones, workflow_id, conn=conn)
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
            state=dict(row["state"] or {}),
            milestones=tuple(_milestone_view(r) for r in milestones),
        )

    # -- the single commit path (spec 000) -----------------------------------------

    def commit_phase_result(
        self, ctx: WorkflowContext, result: PhaseResult, *, fence: Fence | None = None
    ) -> dict[str, Any]:
        """Commit ``result`` for the phase ``ctx`` was loaded in; see ``commit_phase_result``."""
        return commit_phase_result(self, ctx, result, fence=fence)

    # -- milestones -------------------------------------------------------------

    @staticmethod
    def dedupe_key(workflow_id: str, phase: str, write: MilestoneWrite) -> str:
        key = f"{workflow_id}:{phase}:{write.kind}:r{write.round}:a{write.attempt}"
        return f"{key}:{write.key}" if write.key else key

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
        """Upsert one milestone in its own transaction (the side-effect journal's write)."""
        with self.transaction() as conn:
            key = self._upsert_milestone(conn, workflow_id, phase, write)
        found = self.milestone_by_key(key)
        assert found is not None
        return found

    def _upsert_milestone(
        self, conn: sa.Connection, workflow_id: str, phase: str, write: MilestoneWrite
    ) -> str:
        now = self.clock.now()
        phase = write.phase or phase
        key = self.dedupe_key(workflow_id, phase, write)
        existing = conn.execute(
            sa.select(t.milestones.c.id).where(t.milestones.c.dedupe_key == key)
        ).scalar()
        values = {
            "status": write.status,
            "summary": write.summary,
            "data": dict(write.data),
            "updated_at": now,
        }
        if existing is None:
            conn.execute(
                t.milestones.insert().values(
                    workflow_id=workflow_id,
                    kind=write.kind,
                    phase=phase,
                    round=write.round,
                    attempt=write.attempt,
                    dedupe_key=key,
                    created_at=now,
                    **values,
                )
            )
        else:
            conn.execute(
                t.milestones.update().where(t.milestones.c.id == existing).values(**values)
            )
        self._add_event(
            conn,
            workflow_id,
            EventWrite(
                "milestone_updated",
                {"kind": write.kind, "phase": phase, "status": write.status, "key": key},
            ),
        )
        return key

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
            self._add_event(
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
        return [m for m in self.milestones(workflow_id) if m.status == "in_progress"]

    # -- events -----------------------------------------------------------------

    def events(self, workflow_id: str, after_id: int = 0) -> list[dict[str, Any]]:
        """The workflow's events with id > ``after_id``, oldest first."""
        return self._workflow_rows(t.events, workflow_id, t.events.c.id > after_id)

    def add_event(self, workflow_id: str, event: EventWrite) -> None:
        with self.transaction() as conn:
            self._add_event(conn, workflow_id, event)


def _milestone_view(row: Mapping[str, Any]) -> MilestoneView:
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


def _validate(ctx: WorkflowContext, result: PhaseResult) -> None:
    if result.next_phase is not None:
        if result.outcome != "completed":
            raise ContractViolation(
                f"next_phase {result.next_phase!r} given with outcome {result.outcome!r}; "
                "only a completed outcome moves the phase"
            )
        if not is_legal_next_phase(result.next_phase):
            raise ContractViolation(
                f"illegal next_phase {result.next_phase!r} from {ctx.current_phase!r}; "
                "expected a phase in PHASE_ORDER or one of wait, completed"
            )
    unknown = set(result.updates) - UPDATABLE_COLUMNS
    if unknown:
        raise ContractViolation(f"a PhaseResult may not set {sorted(unknown)}")


def commit_phase_result(
    store: WorkflowRows, ctx: WorkflowContext, result: PhaseResult, *, fence: Fence | None = None
) -> dict[str, Any]:
    """The single commit path (spec 000, ``_commit_phase_result``).

    In one transaction: validates ``result``, updates the workflow row (phase,
    status, error, ``updates``, merged ``state``), upserts the milestones and
    appends the events it carries. Only ``outcome == "completed"`` changes
    ``current_phase``; ``failed``/``pause`` set status ``failed``/``paused``
    (or ``result.status``) with ``result.reason`` as the error; ``retry`` and
    ``wait`` keep the phase and its status.

    With ``fence`` (the lease the engine advances under) the row is updated
    only while that lease is still this worker's: a worker whose lease was
    taken over commits nothing.

    A child's end (completed or failed) wakes its parent in the same
    transaction (``_wake_parent``): a parent paused for that child
    (``state["conflict_child"]``, phases/conflict.py) gets its phase's status
    back, so the next advance resumes its merge.

    Returns the workflow's new row. Raises ContractViolation (an illegal
    ``next_phase`` or update; nothing written), StaleContext (the row moved
    past ``ctx.version``; nothing written), FenceLost (another claim moved the
    fence on; nothing written, ``fence.lost`` set), StoreUnavailable (locked
    past the busy timeout, full; rolled back, nothing written).
    """
    _validate(ctx, result)
    phase = ctx.current_phase
    if result.outcome == "completed":
        phase = result.next_phase or next_phase(ctx.current_phase)
        status = result.status or PHASE_STATUS_MAP[phase]
        error = None
    elif result.outcome == "failed":
        status, error = result.status or "failed", result.reason
    elif result.outcome == "pause":
        status, error = result.status or "paused", result.reason
    else:
        status = result.status or PHASE_STATUS_MAP.get(phase, ctx.status)
        error = None

    now = store.clock.now()
    values: dict[str, Any] = {
        **result.updates,
        "current_phase": phase,
        "status": status,
        "error": error,
        "state": {**ctx.state, **result.state},
        "version": ctx.version + 1,
        "updated_at": now,
    }
    if phase == COMPLETED and ctx.current_phase != COMPLETED:
        values["completed_at"] = now

    c = t.workflows.c
    where = [c.id == ctx.id, c.version == ctx.version]
    if fence is not None:
        where += [c.lease_owner == fence.owner, c.fence == fence.value]
    with store.transaction() as conn:
        updated = conn.execute(t.workflows.update().where(*where).values(**values)).rowcount
        if updated != 1:
            _refuse(conn, ctx, fence)
        for write in result.milestones:
            store._upsert_milestone(conn, ctx.id, ctx.current_phase, write)
        for event in result.events:
            store._add_event(conn, ctx.id, event)
        if ctx.parent_workflow_id and status in ("completed", "failed"):
            _wake_parent(store, conn, ctx.parent_workflow_id, ctx.id, status, now)
        store.dialect.notify(conn)  # a person's decision, a settled phase: workers look
        # Read in the same transaction: once it commits, nothing is left to fail.
        return store._workflow_row(conn, ctx.id)


def _wake_parent(
    store: WorkflowRows, conn: sa.Connection, parent_id: str, child_id: str, how: str, now: Any
) -> None:
    """Give the parent paused for ``child_id`` its phase's status back: it is
    runnable again and decides on the child's outcome (``how``) itself."""
    c = t.workflows.c
    parent = conn.execute(
        sa.select(c.status, c.current_phase, c.version, c.state).where(c.id == parent_id)
    ).first()
    if (
        parent is None
        or parent.status != "paused"
        or (parent.state or {}).get("conflict_child") != child_id
    ):
        return  # a person moved it on meanwhile, or it waits for something else
    conn.execute(
        t.workflows.update()
        .where(c.id == parent_id, c.version == parent.version)
        .values(
            status=PHASE_STATUS_MAP[parent.current_phase],
            error=None,
            version=parent.version + 1,
            updated_at=now,
        )
    )
    store._add_event(conn, parent_id, EventWrite("child_ended", {"child": child_id, "status": how}))


def _refuse(conn: sa.Connection, ctx: WorkflowContext, fence: Fence | None) -> NoReturn:
    """Why the commit's UPDATE matched no row: the version moved, or the fence."""
    c = t.workflows.c
    row = conn.execute(sa.select(c.version, c.lease_owner, c.fence).where(c.id == ctx.id)).first()
    if row is None:
        raise WorkflowNotFound(ctx.id)
    if row.version != ctx.version:
        raise StaleContext(
            f"workflow {ctx.id} changed since version {ctx.version}; result not committed"
        )
    if fence is not None:
        fence.lost.set()
    raise FenceLost(
        f"workflow {ctx.id}: the lease is held by {row.lease_owner} (fence {row.fence}), "
        f"not {fence.owner if fence else '?'} (fence {fence.value if fence else '?'}); "
        "result not committed"
    )
