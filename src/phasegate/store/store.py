"""The Store: every SQL statement phasegate runs, and the single commit path.

SQLite (the embedded default) runs in WAL mode with a busy timeout, foreign
keys on and ``BEGIN IMMEDIATE`` transactions, so two processes never deadlock
on a read lock upgraded to a write. The schema comes from Alembic migrations
(``migrations/``), applied when the store is opened.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from phasegate.autonomy import AutonomyPolicy, GateDecision, decide, is_self_modification
from phasegate.clock import Clock, SystemClock
from phasegate.contract import (
    COMPLETED,
    PHASE_STATUS_MAP,
    PREPARATION,
    ContractViolation,
    EventWrite,
    MilestoneView,
    MilestoneWrite,
    PhaseResult,
    ProposalDecided,
    ProposalNotFound,
    RunNotFound,
    StaleContext,
    WorkflowContext,
    WorkflowNotFound,
    is_legal_next_phase,
    next_phase,
)
from phasegate.graph.lifecycle import RUN_RECORD_KEYS
from phasegate.graph.proposals import Evidence, Proposal
from phasegate.store import tables as t

__all__ = [
    "APPLY_ARM",
    "AgentRunRecord",
    "Store",
    "UsageTotals",
    "commit_phase_result",
    "open_store",
]

#: ``decided_by`` of a decision the apply arm took (mode ``auto``), not a person.
APPLY_ARM = "auto"
#: A person's verdicts on a proposal (``Store.decide_proposal``).
VERDICTS = ("approved", "rejected")

#: Workflow columns a PhaseResult may set through ``updates``. current_phase and
#: status are deliberately absent: only the outcome decides those.
UPDATABLE_COLUMNS = frozenset(
    {
        "current_round",
        "dev_round",
        "branch_name",
        "worktree_path",
        "issue_number",
        "pr_number",
        "merge_sha",
        "auto_merge",
        "user_feedback",
    }
)

_MIGRATIONS = Path(__file__).parent / "migrations"


@dataclass(frozen=True)
class UsageTotals:
    """Sums over a workflow's agent runs: tokens, cost in USD, runs counted."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    runs: int = 0

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True)
class AgentRunRecord:
    """One finished agent call, as recorded in ``agent_runs``."""

    workflow_id: str
    phase: str
    role: str
    session_line: str
    runner: str
    round: int
    attempt: int
    outcome: str
    error_kind: str | None = None
    error: str | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    duration_s: float = 0.0
    session_id: str | None = None


def _utc(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; everything we write is UTC.
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


def _workflow_dict(row: Mapping[str, Any]) -> dict[str, Any]:
    """A workflow row as a dict, its timestamps UTC-aware."""
    out = dict(row)
    for key in ("created_at", "updated_at", "completed_at", "lease_expires_at"):
        out[key] = _utc(out[key])
    return out


def _sqlite_engine(url: str) -> sa.Engine:
    engine = sa.create_engine(url, connect_args={"timeout": 30})

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Autocommit at the driver level so SQLAlchemy's begin() below owns
        # the transaction and can make it IMMEDIATE.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def open_store(url: str, clock: Clock | None = None) -> Store:
    """Open (and migrate) the store at ``url``: ``sqlite:///path`` or a PostgreSQL URL.

    A SQLite file's parent directory is created when missing.
    """
    if url.startswith("sqlite"):
        db_path = sa.engine.make_url(url).database
        if db_path and db_path != ":memory:":
            Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        engine = _sqlite_engine(url)
    else:
        engine = sa.create_engine(url, pool_pre_ping=True)
    store = Store(engine, clock or SystemClock())
    store.migrate()
    return store


class Store:
    """All SQL behind one class. Methods are small transactions of their own."""

    def __init__(self, engine: sa.Engine, clock: Clock) -> None:
        self.engine = engine
        self.clock = clock

    # -- schema -----------------------------------------------------------------

    def migrate(self, revision: str = "head") -> None:
        """Bring the schema to ``revision`` (default: the newest; migrations are append-only)."""
        config = Config()
        config.set_main_option("script_location", str(_MIGRATIONS))
        with self.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)

    @contextmanager
    def transaction(self) -> Iterator[sa.Connection]:
        with self.engine.begin() as conn:
            yield conn

    def close(self) -> None:
        self.engine.dispose()

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
    ) -> str:
        """Insert a workflow in ``preparation``; returns its id (8 hex digits)."""
        now = self.clock.now()
        workflow_id = secrets.token_hex(4)
        with self.transaction() as conn:
            conn.execute(
                t.workflows.insert().values(
                    id=workflow_id,
                    title=title,
                    ticket=ticket,
                    repo_path=repo_path,
                    base_branch=base_branch,
                    current_phase=PREPARATION,
                    status=PHASE_STATUS_MAP[PREPARATION],
                    auto_merge=auto_merge,
                    content_language=content_language,
                    state=dict(state or {}),
                    created_at=now,
                    updated_at=now,
                )
            )
            self._add_event(conn, workflow_id, EventWrite("phase_change", {"phase": PREPARATION}))
        return workflow_id

    def workflow_row(self, workflow_id: str) -> dict[str, Any]:
        """The workflow's row as a dict. Raises WorkflowNotFound."""
        with self.engine.connect() as conn:
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
        with self.engine.connect() as conn:
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
        with self.engine.connect() as conn:
            return list(
                conn.execute(
                    sa.select(t.workflows.c.id)
                    .where(t.workflows.c.status.in_(sorted(statuses)))
                    .order_by(t.workflows.c.created_at, t.workflows.c.id)
                ).scalars()
            )

    def load_context(self, workflow_id: str) -> WorkflowContext:
        """The frozen snapshot a phase receives. Raises WorkflowNotFound."""
        row = self.workflow_row(workflow_id)
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
            state=dict(row["state"] or {}),
            milestones=tuple(self.milestones(workflow_id)),
        )

    # -- the single commit path (spec 000) -----------------------------------------

    def commit_phase_result(self, ctx: WorkflowContext, result: PhaseResult) -> dict[str, Any]:
        """Commit ``result`` for the phase ``ctx`` was loaded in; see ``commit_phase_result``."""
        return commit_phase_result(self, ctx, result)

    # -- milestones -------------------------------------------------------------

    @staticmethod
    def dedupe_key(workflow_id: str, phase: str, write: MilestoneWrite) -> str:
        key = f"{workflow_id}:{phase}:{write.kind}:r{write.round}:a{write.attempt}"
        return f"{key}:{write.key}" if write.key else key

    def _workflow_rows(
        self, table: sa.Table, workflow_id: str, *where: sa.ColumnElement[bool]
    ) -> list[dict[str, Any]]:
        """``table``'s rows of one workflow, oldest first, timestamps UTC-aware."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(table)
                .where(table.c.workflow_id == workflow_id, *where)
                .order_by(table.c.id)
            ).mappings()
            return [
                {k: _utc(v) if isinstance(v, datetime) else v for k, v in r.items()} for r in rows
            ]

    def milestones(self, workflow_id: str) -> list[MilestoneView]:
        """The workflow's milestones, oldest first."""
        return [_milestone_view(r) for r in self._workflow_rows(t.milestones, workflow_id)]

    def milestone_rows(self, workflow_id: str) -> list[dict[str, Any]]:
        """The workflow's milestones as rows (with timestamps), oldest first."""
        return self._workflow_rows(t.milestones, workflow_id)

    def milestone_by_key(self, dedupe_key: str) -> MilestoneView | None:
        with self.engine.connect() as conn:
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

    def _add_event(self, conn: sa.Connection, workflow_id: str, event: EventWrite) -> None:
        conn.execute(
            t.events.insert().values(
                workflow_id=workflow_id,
                type=event.type,
                data=dict(event.data),
                created_at=self.clock.now(),
            )
        )

    def events(self, workflow_id: str, after_id: int = 0) -> list[dict[str, Any]]:
        """The workflow's events with id > ``after_id``, oldest first."""
        return self._workflow_rows(t.events, workflow_id, t.events.c.id > after_id)

    def add_event(self, workflow_id: str, event: EventWrite) -> None:
        with self.transaction() as conn:
            self._add_event(conn, workflow_id, event)

    # -- agent runs and sessions ------------------------------------------------

    def record_agent_run(self, run: AgentRunRecord) -> None:
        """Append one agent call; usage is summed per workflow, never overwritten."""
        with self.transaction() as conn:
            conn.execute(
                t.agent_runs.insert().values(
                    **{k: getattr(run, k) for k in AgentRunRecord.__dataclass_fields__},
                    created_at=self.clock.now(),
                )
            )

    def agent_runs(self, workflow_id: str) -> list[dict[str, Any]]:
        """The workflow's agent calls, oldest first."""
        return self._workflow_rows(t.agent_runs, workflow_id)

    def count_agent_runs(self, workflow_id: str, role: str) -> int:
        """How many calls of ``role`` this workflow has finished."""
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count())
                    .select_from(t.agent_runs)
                    .where(t.agent_runs.c.workflow_id == workflow_id, t.agent_runs.c.role == role)
                ).scalar_one()
            )

    def usage_totals(self, workflow_id: str, role: str | None = None) -> UsageTotals:
        """Sums of tokens and cost over the workflow's agent runs (of ``role`` only, if given)."""
        c = t.agent_runs.c
        query = sa.select(
            sa.func.coalesce(sa.func.sum(c.input_tokens), 0),
            sa.func.coalesce(sa.func.sum(c.output_tokens), 0),
            sa.func.coalesce(sa.func.sum(c.cost_usd), 0.0),
            sa.func.count(),
        ).where(c.workflow_id == workflow_id)
        if role is not None:
            query = query.where(c.role == role)
        with self.engine.connect() as conn:
            row = conn.execute(query).one()
        return UsageTotals(int(row[0]), int(row[1]), float(row[2]), int(row[3]))

    def provider_session(self, workflow_id: str, session_line: str) -> str | None:
        """The provider session id bound to a session line, if any."""
        c = t.provider_sessions.c
        with self.engine.connect() as conn:
            return conn.execute(
                sa.select(c.session_id).where(
                    c.workflow_id == workflow_id, c.session_line == session_line
                )
            ).scalar()

    def bind_provider_session(
        self, workflow_id: str, session_line: str, runner: str, session_id: str
    ) -> None:
        """Bind (or rebind) the one provider session of a session line."""
        c = t.provider_sessions.c
        now = self.clock.now()
        with self.transaction() as conn:
            updated = conn.execute(
                t.provider_sessions.update()
                .where(c.workflow_id == workflow_id, c.session_line == session_line)
                .values(runner=runner, session_id=session_id, updated_at=now)
            ).rowcount
            if not updated:
                conn.execute(
                    t.provider_sessions.insert().values(
                        workflow_id=workflow_id,
                        session_line=session_line,
                        runner=runner,
                        session_id=session_id,
                        created_at=now,
                        updated_at=now,
                    )
                )

    # -- leases -----------------------------------------------------------------

    def claim(self, workflow_id: str, owner: str, ttl_s: float) -> int | None:
        """Take the workflow's lease for ``ttl_s`` seconds; returns the new fence or None.

        A lease is free when it has no owner, has expired, or belongs to
        ``owner`` already. A holder on this host whose process is gone (a
        SIGKILLed worker) no longer holds it, so a restart need not wait.
        """
        now = self.clock.now()
        c = t.workflows.c
        with self.transaction() as conn:
            row = conn.execute(
                sa.select(c.lease_owner, c.lease_expires_at, c.fence).where(c.id == workflow_id)
            ).first()
            if row is None:
                raise WorkflowNotFound(workflow_id)
            holder, expires, fence = row[0], _utc(row[1]), row[2]
            free = holder is None or holder == owner or expires is None or expires <= now
            if not free and not _holder_alive(holder):
                free = True
            if not free:
                return None
            conn.execute(
                t.workflows.update()
                .where(c.id == workflow_id)
                .values(
                    lease_owner=owner,
                    lease_expires_at=now + timedelta(seconds=ttl_s),
                    fence=fence + 1,
                )
            )
            return fence + 1

    def renew(self, workflow_id: str, owner: str, fence: int, ttl_s: float) -> bool:
        c = t.workflows.c
        with self.transaction() as conn:
            return bool(
                conn.execute(
                    t.workflows.update()
                    .where(c.id == workflow_id, c.lease_owner == owner, c.fence == fence)
                    .values(lease_expires_at=self.clock.now() + timedelta(seconds=ttl_s))
                ).rowcount
            )

    def release(self, workflow_id: str, owner: str) -> None:
        c = t.workflows.c
        with self.transaction() as conn:
            conn.execute(
                t.workflows.update()
                .where(c.id == workflow_id, c.lease_owner == owner)
                .values(lease_owner=None, lease_expires_at=None)
            )

    # -- local forge rows -------------------------------------------------------

    def forge_next_number(self, conn: sa.Connection, repo: str) -> int:
        # Issues and pull requests share one number space, as on GitHub.
        highest = 0
        for table in (t.forge_issues, t.forge_pull_requests):
            value = conn.execute(
                sa.select(sa.func.max(table.c.number)).where(table.c.repo == repo)
            ).scalar()
            highest = max(highest, value or 0)
        return highest + 1

    def forge_insert(self, table: sa.Table, repo: str, **values: Any) -> int:
        """Insert an issue or pull request with the repo's next number; returns it."""
        with self.transaction() as conn:
            number = self.forge_next_number(conn, repo)
            conn.execute(
                table.insert().values(
                    repo=repo, number=number, created_at=self.clock.now(), **values
                )
            )
        return number

    def forge_rows(self, table: sa.Table, repo: str, **where: Any) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            query = sa.select(table).where(table.c.repo == repo)
            for key, value in where.items():
                query = query.where(table.c[key] == value)
            return [dict(r) for r in conn.execute(query.order_by(table.c.id)).mappings()]

    def forge_update(self, table: sa.Table, repo: str, number: int, **values: Any) -> None:
        with self.transaction() as conn:
            conn.execute(
                table.update()
                .where(table.c.repo == repo, table.c.number == number)
                .values(**values)
            )

    def forge_add_comment(self, repo: str, issue_number: int, body: str, marker: str | None) -> int:
        with self.transaction() as conn:
            return int(
                conn.execute(
                    t.forge_comments.insert().values(
                        repo=repo,
                        issue_number=issue_number,
                        body=body,
                        marker=marker,
                        created_at=self.clock.now(),
                    )
                ).inserted_primary_key[0]
            )

    # -- the development graph: runs, proposals, the gate (spec 002) ----------------

    def record_run(
        self,
        record: Mapping[str, Any],
        *,
        policy: AutonomyPolicy | None = None,
        workflow_id: str | None = None,
        extra_evidence: Mapping[str, Sequence[Evidence]] | None = None,
    ) -> list[dict[str, Any]]:
        """Store a run record and its proposals in one transaction; return the proposal rows.

        ``record`` is what ``graph.lifecycle_propose`` returned (RUN_RECORD_KEYS;
        JSON values), kept whole, every agent call and answer included. Each
        proposal gets a short hex id, status ``proposed`` and the mode
        ``autonomy.decide`` gives it under ``policy`` (default: every kind
        ``propose``, graduation after 3) with the gate history as it stands in
        this transaction. A workflow's earlier proposals still ``proposed`` become
        ``superseded``. ``self_modification`` is stored as the policy sees it
        (the proposal says so, or it touches a governance path). Raises
        ValueError for a record without the run record's keys, and
        sqlalchemy's IntegrityError (nothing written) for a run id recorded before.

        ``extra_evidence`` maps a proposal's record id to evidence the shell
        adds (the harness's ``checks``): appended to the stored row's evidence,
        never to the record's ``proposals``, which stay the graph's own.
        """
        missing = [k for k in RUN_RECORD_KEYS if k not in record]
        if missing:
            raise ValueError(f"not a run record: it lacks {', '.join(missing)}")
        policy = policy or AutonomyPolicy()
        now = self.clock.now()
        run_id = str(record["run_id"])
        with self.transaction() as conn:
            conn.execute(
                t.graph_runs.insert().values(
                    run_id=run_id,
                    workflow_id=workflow_id,
                    date=str(record["date"]),
                    record=dict(record),
                    created_at=now,
                )
            )
            if workflow_id is not None:
                c = t.proposals.c
                conn.execute(
                    t.proposals.update()
                    .where(c.workflow_id == workflow_id, c.status == "proposed")
                    .values(status="superseded", reason=f"superseded by run {run_id}")
                )
            history = self._gate_history(conn)
            for position, row in enumerate(record["proposals"], 1):
                proposal = Proposal.from_dict(row)
                added = tuple((extra_evidence or {}).get(proposal.id, ()))
                if added:
                    proposal = replace(proposal, evidence=(*proposal.evidence, *added))
                conn.execute(
                    t.proposals.insert().values(
                        id=self._new_proposal_id(conn),
                        record_id=proposal.id,
                        run_id=run_id,
                        position=position,
                        workflow_id=workflow_id,
                        kind=proposal.kind,
                        title=proposal.title,
                        payload=dict(proposal.payload),
                        evidence=[e.as_dict() for e in proposal.evidence],
                        attempts=proposal.attempts,
                        self_modification=is_self_modification(proposal, policy),
                        paths=list(proposal.paths),
                        mode=decide(proposal, history, policy).mode,
                        status="proposed",
                        created_at=now,
                    )
                )
        return self.proposals(run_id=run_id)

    @staticmethod
    def _new_proposal_id(conn: sa.Connection) -> str:
        while True:
            candidate = secrets.token_hex(4)
            taken = conn.execute(
                sa.select(t.proposals.c.id).where(t.proposals.c.id == candidate)
            ).first()
            if taken is None:
                return candidate

    def run(self, run_id: str) -> dict[str, Any]:
        """A recorded run: run_id, workflow_id, date, record, created_at. Raises RunNotFound."""
        with self.engine.connect() as conn:
            row = (
                conn.execute(sa.select(t.graph_runs).where(t.graph_runs.c.run_id == run_id))
                .mappings()
                .first()
            )
        if row is None:
            raise RunNotFound(run_id)
        return _utc_row(row)

    def proposals(
        self,
        status: str | None = None,
        workflow_id: str | None = None,
        run_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """Proposal rows, oldest first; of ``status``, ``workflow_id``, ``run_id`` when given."""
        c = t.proposals.c
        query = sa.select(t.proposals)
        if status is not None:
            query = query.where(c.status == status)
        if workflow_id is not None:
            query = query.where(c.workflow_id == workflow_id)
        if run_id is not None:
            query = query.where(c.run_id == run_id)
        with self.engine.connect() as conn:
            rows = conn.execute(query.order_by(c.created_at, c.run_id, c.position)).mappings().all()
        return [_utc_row(r) for r in rows]

    def proposal(self, proposal_id: str) -> dict[str, Any]:
        """One proposal row. Raises ProposalNotFound."""
        with self.engine.connect() as conn:
            row = (
                conn.execute(sa.select(t.proposals).where(t.proposals.c.id == proposal_id))
                .mappings()
                .first()
            )
        if row is None:
            raise ProposalNotFound(proposal_id)
        return _utc_row(row)

    def decide_proposal(
        self, proposal_id: str, verdict: str, by: str, reason: str | None = None
    ) -> dict[str, Any]:
        """Record a decision on a ``proposed`` proposal: ``verdict`` (approved or
        rejected), who (``by``), when (the store's clock), why (``reason``).

        Returns the updated row. Raises ProposalNotFound, ProposalDecided (it
        was decided already; a decision is never overwritten), ValueError for
        another verdict or an empty ``by``.
        """
        if verdict not in VERDICTS:
            raise ValueError(f"a verdict is approved or rejected, not {verdict!r}")
        if not by.strip():
            raise ValueError("a decision needs who took it")
        c = t.proposals.c
        with self.transaction() as conn:
            row = conn.execute(
                sa.select(c.status, c.decided_by, c.decided_at).where(c.id == proposal_id)
            ).first()
            if row is None:
                raise ProposalNotFound(proposal_id)
            if row.status == "superseded":
                raise ProposalDecided(
                    f"proposal {proposal_id} was superseded by a later run of its workflow; "
                    "there is nothing to decide"
                )
            if row.status != "proposed":
                who = f" by {row.decided_by}" if row.decided_by else ""
                when = _utc(row.decided_at)
                at = f" at {when.isoformat()}" if when else ""
                raise ProposalDecided(
                    f"proposal {proposal_id} was {row.status} already{who}{at}; "
                    "a decision is not changed"
                )
            seq = _last_decision_seq(conn)
            conn.execute(
                t.proposals.update()
                .where(c.id == proposal_id, c.status == "proposed")
                .values(
                    status=verdict,
                    decided_by=by,
                    decided_at=self.clock.now(),
                    decision_seq=(seq or 0) + 1,
                    reason=reason,
                )
            )
        return self.proposal(proposal_id)

    def apply_proposal(self, proposal_id: str) -> dict[str, Any]:
        """Mark a proposal ``applied``: the apply arm landed it (spec 002, apply arm).

        An ``approved`` one keeps the person's decision; a ``proposed`` one of
        mode ``auto`` is the apply arm's own decision (``decided_by`` APPLY_ARM,
        the next ``decision_seq``). An ``applied`` one is returned as it is (a
        restarted phase applies nothing twice). Raises ProposalNotFound, and
        ProposalDecided for a rejected proposal or a ``propose`` one nobody
        approved.
        """
        c = t.proposals.c
        with self.transaction() as conn:
            row = conn.execute(sa.select(c.status, c.mode).where(c.id == proposal_id)).first()
            if row is None:
                raise ProposalNotFound(proposal_id)
            if row.status == "approved":
                conn.execute(
                    t.proposals.update().where(c.id == proposal_id).values(status="applied")
                )
            elif row.status == "proposed" and row.mode == "auto":
                seq = _last_decision_seq(conn)
                conn.execute(
                    t.proposals.update()
                    .where(c.id == proposal_id)
                    .values(
                        status="applied",
                        decided_by=APPLY_ARM,
                        decided_at=self.clock.now(),
                        decision_seq=(seq or 0) + 1,
                    )
                )
            elif row.status != "applied":
                raise ProposalDecided(
                    f"proposal {proposal_id} is {row.status} (mode {row.mode}); "
                    "only an approved or an auto proposal is applied"
                )
        return self.proposal(proposal_id)

    def add_graph_call(
        self, run_id: str, seq: int, call: Mapping[str, Any], workflow_id: str | None = None
    ) -> None:
        """Keep call ``seq`` (0, 1, ...) of a run as it is answered; a row already
        at ``seq`` or after it (a stale tail, asked differently) is replaced."""
        c = t.graph_calls.c
        with self.transaction() as conn:
            conn.execute(t.graph_calls.delete().where(c.run_id == run_id, c.seq >= seq))
            conn.execute(
                t.graph_calls.insert().values(
                    run_id=run_id,
                    seq=seq,
                    workflow_id=workflow_id,
                    call=dict(call),
                    created_at=self.clock.now(),
                )
            )

    def graph_calls(self, run_id: str) -> list[dict[str, Any]]:
        """The calls kept for ``run_id`` (``graph.calls.call_row`` dicts), in order."""
        c = t.graph_calls.c
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(c.call).where(c.run_id == run_id).order_by(c.seq)).all()
        return [dict(row.call) for row in rows]

    def find_run(self, run_id: str) -> dict[str, Any] | None:
        """``run(run_id)``, or None when the run is not recorded."""
        try:
            return self.run(run_id)
        except RunNotFound:
            return None

    def gate_history(self, kind: str | None = None) -> list[GateDecision]:
        """Every decision on proposals (of ``kind`` only, if given), in the order
        taken: what ``autonomy.streak``/``autonomy.decide`` read. An applied
        proposal counts as the approval it had; ``decided_by == APPLY_ARM`` is
        the apply arm's decision, any other name a person's."""
        with self.engine.connect() as conn:
            return self._gate_history(conn, kind)

    @staticmethod
    def _gate_history(conn: sa.Connection, kind: str | None = None) -> list[GateDecision]:
        c = t.proposals.c
        query = sa.select(
            c.id, c.kind, c.status, c.attempts, c.self_modification, c.decided_by
        ).where(c.decision_seq.is_not(None))
        if kind is not None:
            query = query.where(c.kind == kind)
        return [
            GateDecision(
                kind=row.kind,
                outcome="rejected" if row.status == "rejected" else "approved",
                attempts=row.attempts,
                self_modification=bool(row.self_modification),
                by="auto" if row.decided_by == APPLY_ARM else "person",
                proposal_id=row.id,
            )
            for row in conn.execute(query.order_by(c.decision_seq))
        ]


def _last_decision_seq(conn: sa.Connection) -> int | None:
    """The highest decision_seq, read so that no other transaction numbers a
    decision before this one commits: SQLite's IMMEDIATE transactions already
    serialize writers; PostgreSQL takes a lock that only conflicts with itself
    and writers (readers go on)."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("LOCK TABLE proposals IN SHARE ROW EXCLUSIVE MODE")
    return conn.execute(sa.select(sa.func.max(t.proposals.c.decision_seq))).scalar()


def _utc_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _utc(v) if isinstance(v, datetime) else v for k, v in row.items()}


def _holder_alive(holder: str) -> bool:
    """Whether the lease holder ``host:pid:...`` may still be running.

    Only a holder on this host can be checked; any other is assumed alive
    until its lease expires.
    """
    parts = holder.split(":")
    if len(parts) < 2 or parts[0] != os.uname().nodename or not parts[1].isdigit():
        return True
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def commit_phase_result(store: Store, ctx: WorkflowContext, result: PhaseResult) -> dict[str, Any]:
    """The single commit path (spec 000, ``_commit_phase_result``).

    In one transaction: validates ``result``, updates the workflow row (phase,
    status, error, ``updates``, merged ``state``), upserts the milestones and
    appends the events it carries. Only ``outcome == "completed"`` changes
    ``current_phase``; ``failed``/``pause`` set status ``failed``/``paused``
    (or ``result.status``) with ``result.reason`` as the error; ``retry`` and
    ``wait`` keep the phase and its status.

    Returns the workflow's new row. Raises ContractViolation (an illegal
    ``next_phase`` or update; nothing written) or StaleContext (the row moved
    past ``ctx.version``; nothing written).
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
    with store.transaction() as conn:
        updated = conn.execute(
            t.workflows.update().where(c.id == ctx.id, c.version == ctx.version).values(**values)
        ).rowcount
        if updated != 1:
            raise StaleContext(
                f"workflow {ctx.id} changed since version {ctx.version}; result not committed"
            )
        for write in result.milestones:
            store._upsert_milestone(conn, ctx.id, ctx.current_phase, write)
        for event in result.events:
            store._add_event(conn, ctx.id, event)
    return store.workflow_row(ctx.id)
