"""Dependencies between workflows: who waits for whom, and the release of a waiting workflow.

A workflow that depends on others (``phasegate run --after``, ``Depends on #N``,
an epic's piece after the pieces it needs) is ``blocked``; an epic's parent that
filed its pieces is ``pieces`` (docs/epics.md). Neither is runnable, so no worker
claims it. The commit that completes the last workflow it waits for makes it
runnable in the same transaction (``on_status``, called by the single commit
path), so no crash leaves it waiting for good; ``release_ready`` does the same
for any the commit could not (a worker's pass runs it).

Edges live in ``workflow_dependencies``: the waiting workflow, the workflow it
waits for (or the forge issue that has none yet), and the kind (``after`` or
``piece``). A cycle is refused in the transaction that would close it
(``DependencyCycle``, the cycle named), and nothing of it is recorded.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from phasegate.core.contract import (
    BLOCKED,
    ENDED_STATUSES,
    PHASE_STATUS_MAP,
    PIECES,
    PREPARATION,
    WAITING_ON_OTHERS,
    EventWrite,
    WorkflowNotFound,
)
from phasegate.core.dependencies import (
    ENDED_UNCOMPLETED,
    DependencyCycle,
    cycle_path,
    waiting_text,
)
from phasegate.core.state import WorkflowState
from phasegate.store import tables as t
from phasegate.store._base import StoreBase
from phasegate.store.values import EDGES_ORDER, EDGES_SQL, edge_row

__all__ = [
    "AFTER",
    "PIECE",
    "PIECES_DROPPED_EVENT",
    "DependencyRows",
    "Piece",
    "RELEASED_EVENT",
    "edges_of",
    "link",
    "on_status",
    "resolve_issue",
    "waiting_text",
]

#: An edge's kind: the workflow runs only after the other merged and verified.
AFTER = "after"
#: An edge's kind: an epic's parent waits for one of its pieces.
PIECE = "piece"

#: The event of a workflow whose wait ended: ``{"after": [ids]}`` (every one completed)
#: or ``{"dropped": [ids], "by": "resume"}`` (a person started it without them).
RELEASED_EVENT = "dependencies_met"

#: The event of an epic's parent a person told to go on without its pieces that
#: failed or were cancelled: ``{"dropped": [ids]}``.
PIECES_DROPPED_EVENT = "pieces_dropped"

_d = t.workflow_dependencies.c
_w = t.workflows.c


@dataclass(frozen=True)
class Piece:
    """One piece of an epic to start as a workflow: its ``title``, its ``ticket``,
    the forge issue filed for it (``issue_number``) and the earlier pieces it needs
    (``after``: their 1-based places among the epic's pieces)."""

    title: str
    ticket: str
    issue_number: int | None
    after: tuple[int, ...] = ()


def _label(conn: sa.Connection, workflow_id: str) -> str:
    """How a cycle names a workflow: its id, and its issue when it has one."""
    number = conn.execute(sa.select(_w.issue_number).where(_w.id == workflow_id)).scalar()
    return f"{workflow_id} (#{number})" if number else workflow_id


def _check_cycle(conn: sa.Connection, workflow_id: str) -> None:
    def edges(node: str) -> list[str]:
        return list(
            conn.execute(
                sa.select(_d.depends_on)
                .where(_d.workflow_id == node, _d.depends_on.is_not(None))
                .order_by(_d.id)
            ).scalars()
        )

    path = cycle_path(workflow_id, edges)
    if path is not None:
        raise DependencyCycle([_label(conn, node) for node in path])


def link(
    conn: sa.Connection,
    workflow_id: str,
    after: Sequence[str],
    issues: Sequence[tuple[str, int]],
    now: datetime,
    *,
    kind: str = AFTER,
) -> list[str]:
    """Record that ``workflow_id`` waits for each of ``after`` (workflow ids) and for
    the workflow of each forge issue of ``issues`` (``(owner/name, number)``; the issue
    itself while it has none), in ``conn``'s transaction. Returns the ids and issues
    (``owner/name#N``) it waits for that have not completed: it must be ``blocked``
    when there is any. The workflows named are locked first, so a completion
    committing meanwhile either went first (and is seen) or waits for this edge
    (and releases it). Raises WorkflowNotFound for an id of ``after`` no workflow
    has, DependencyCycle (rolled back by the caller's transaction)."""
    waiting: list[str] = []
    targets: dict[str, tuple[str, int] | None] = {wid: None for wid in after}
    pending: list[tuple[str, int]] = []
    for repository, number in issues:
        found = _workflow_of_issue(conn, repository, number)
        if found is None:
            pending.append((repository, number))
        else:
            targets.setdefault(found, (repository, number))
    for target, issue in targets.items():
        row = conn.execute(sa.select(_w.status).where(_w.id == target).with_for_update()).first()
        if row is None:
            raise WorkflowNotFound(target)
        if row.status != "completed":
            waiting.append(target)
        _insert_edge(conn, workflow_id, target, kind, 0, issue, now)
    for repository, number in pending:
        _insert_edge(conn, workflow_id, None, kind, 0, (repository, number), now)
        waiting.append(f"{repository}#{number}")
    if targets:
        _check_cycle(conn, workflow_id)
    return waiting


def _insert_edge(
    conn: sa.Connection,
    workflow_id: str,
    depends_on: str | None,
    kind: str,
    position: int,
    issue: tuple[str, int] | None,
    now: datetime,
) -> None:
    conn.execute(
        t.workflow_dependencies.insert().values(
            workflow_id=workflow_id,
            depends_on=depends_on,
            kind=kind,
            position=position,
            issue_repository=issue[0] if issue else None,
            issue_number=issue[1] if issue else None,
            created_at=now,
        )
    )


def _workflow_of_issue(conn: sa.Connection, repository: str, number: int) -> str | None:
    rows = conn.execute(
        sa.select(_w.id, _w.state).where(_w.issue_number == number).order_by(_w.created_at, _w.id)
    )
    return next((r.id for r in rows if (r.state or {}).get("forge_repository") == repository), None)


def resolve_issue(conn: sa.Connection, workflow_id: str, repository: str, number: int) -> None:
    """The forge issue ``repository#number`` got its workflow ``workflow_id``: every
    edge that waited for the issue now waits for the workflow, in ``conn``'s
    transaction. Raises DependencyCycle when that closes a cycle."""
    resolved = conn.execute(
        t.workflow_dependencies.update()
        .where(
            _d.issue_repository == repository,
            _d.issue_number == number,
            _d.depends_on.is_(None),
        )
        .values(depends_on=workflow_id)
    ).rowcount
    if resolved:
        _check_cycle(conn, workflow_id)


def on_status(
    store: StoreBase, conn: sa.Connection, workflow_id: str, before: str, after: str, now: datetime
) -> None:
    """What a commit moving ``workflow_id`` from status ``before`` to ``after`` does to
    the workflows around it, in its transaction: one that ends (completed, failed,
    cancelled) releases or re-explains those waiting for it; one that starts waiting
    is released at once when nothing it waits for is left; one a person moved out
    of ``blocked`` (resume) stops waiting for what has not completed."""
    if before == BLOCKED and after not in WAITING_ON_OTHERS | ENDED_STATUSES:
        dropped = _drop_unfinished(conn, workflow_id)
        if dropped:
            store.write_event(
                conn, workflow_id, EventWrite(RELEASED_EVENT, {"dropped": dropped, "by": "resume"})
            )
    if after in WAITING_ON_OTHERS:
        _release(store, conn, [workflow_id], now)
    elif after in ENDED_STATUSES:
        waiting = conn.execute(
            sa.select(_d.workflow_id).distinct().where(_d.depends_on == workflow_id)
        ).scalars()
        _release(store, conn, sorted(waiting), now)


def _drop_unfinished(conn: sa.Connection, workflow_id: str) -> list[str]:
    """Delete ``workflow_id``'s ``after`` edges to what has not completed; their targets."""
    rows = conn.execute(
        sa.select(_d.id, _d.depends_on, _d.issue_repository, _d.issue_number, _w.status)
        .select_from(t.workflow_dependencies.outerjoin(t.workflows, _w.id == _d.depends_on))
        .where(_d.workflow_id == workflow_id, _d.kind == AFTER)
    ).all()
    doomed = [r for r in rows if r.status != "completed"]
    if doomed:
        conn.execute(t.workflow_dependencies.delete().where(_d.id.in_([r.id for r in doomed])))
    return [r.depends_on or f"{r.issue_repository}#{r.issue_number}" for r in doomed]


def _release(
    store: StoreBase, conn: sa.Connection, candidates: Sequence[str], now: datetime
) -> list[str]:
    """Make runnable each of ``candidates`` that waits (blocked, pieces) and whose every
    dependency completed; say in the error of each other one what it waits for.
    Each is locked before its dependencies are read, so two completions committing
    at once (PostgreSQL, READ COMMITTED) cannot both see the other unfinished."""
    released = []
    for workflow_id in candidates:
        row = conn.execute(
            sa.select(_w.status, _w.current_phase, _w.version, _w.error)
            .where(_w.id == workflow_id)
            .with_for_update()
        ).first()
        if row is None or row.status not in WAITING_ON_OTHERS:
            continue
        edges = edges_of(conn, workflow_id)
        left = [e for e in edges if e["status"] != "completed"]
        values: dict[str, Any]
        if not left:
            values = {"status": PHASE_STATUS_MAP[row.current_phase], "error": None, "due_at": None}
        else:
            values = {"error": waiting_text(row.status, left, len(edges))}
            if values["error"] == row.error:
                continue
        # Only a release moves the version on: what the error says changes no decision,
        # and the workflow's own commit that made it wait has just returned its row.
        moved = {"version": row.version + 1, "updated_at": now} if not left else {}
        conn.execute(
            t.workflows.update()
            .where(_w.id == workflow_id, _w.version == row.version)
            .values(**moved, **values)
        )
        if not left:
            done = [e["depends_on"] for e in edges]
            store.write_event(conn, workflow_id, EventWrite(RELEASED_EVENT, {"after": done}))
            released.append(workflow_id)
    if released:
        store.dialect.notify(conn)  # runnable now: workers look
    return released


def edges_of(conn: sa.Connection, workflow_id: str | None) -> list[dict[str, Any]]:
    """Edges (of ``workflow_id``, else all) with the status of what each waits for
    (``values.edge_row``)."""
    if workflow_id is None:
        rows = conn.execute(sa.text(EDGES_SQL + EDGES_ORDER))
    else:
        where = " WHERE d.workflow_id = :w"
        rows = conn.execute(sa.text(EDGES_SQL + where + EDGES_ORDER), {"w": workflow_id})
    return [edge_row(dict(r._mapping)) for r in rows]


class DependencyRows(StoreBase):
    """Edges between workflows, their release, and an epic's pieces started as workflows."""

    def dependencies(self, workflow_id: str) -> list[dict[str, Any]]:
        """What ``workflow_id`` waits for (``edge_row``s: ``after`` ones, then its
        pieces by place), each with its status now."""
        with self.reading() as conn:
            return edges_of(conn, workflow_id)

    def dependency_rows(self) -> list[dict[str, Any]]:
        """Every edge (``edge_row``), by waiting workflow: what a board reads at once."""
        with self.reading() as conn:
            return edges_of(conn, None)

    def dependents(self, workflow_id: str) -> list[str]:
        """The ids of the workflows that wait for ``workflow_id`` (``after`` edges)."""
        with self.reading() as conn:
            return list(
                conn.execute(
                    sa.select(_d.workflow_id)
                    .where(_d.depends_on == workflow_id, _d.kind == AFTER)
                    .order_by(_d.id)
                ).scalars()
            )

    def release_ready(self) -> list[str]:
        """Make runnable every waiting workflow whose dependencies all completed (the
        reconciliation a worker's pass runs: what a commit did not release); returns
        their ids. Raises StoreUnavailable."""
        with self.reading() as conn:
            waiting = list(
                conn.execute(
                    sa.select(_w.id).where(_w.status.in_(sorted(WAITING_ON_OTHERS)))
                ).scalars()
            )
        if not waiting:
            return []
        with self.transaction() as conn:
            return _release(self, conn, waiting, self.clock.now())

    def drop_ended_pieces(
        self, parent_id: str, events: Sequence[EventWrite] = ()
    ) -> list[dict[str, Any]]:
        """Make the epic's parent ``parent_id`` (status ``pieces``) stop waiting for its
        pieces that ended without completing (failed, cancelled), in one transaction:
        their ``piece`` edges go, a ``pieces_dropped`` event names them (``{"dropped":
        [ids]}``) with ``events`` beside it, and the parent is released when every piece
        left completed (its planning then completes it), else its error says what is
        left. Returns the dropped edges (``edge_row``s); none: nothing was written.
        Raises WorkflowNotFound."""
        with self.transaction() as conn:
            row = conn.execute(
                sa.select(_w.status).where(_w.id == parent_id).with_for_update()
            ).first()
            if row is None:
                raise WorkflowNotFound(parent_id)
            if row.status != PIECES:
                return []
            ended = [
                e
                for e in edges_of(conn, parent_id)
                if e["kind"] == PIECE and e["status"] in ENDED_UNCOMPLETED
            ]
            if not ended:
                return []
            conn.execute(
                t.workflow_dependencies.delete().where(
                    _d.workflow_id == parent_id,
                    _d.kind == PIECE,
                    _d.depends_on.in_([e["depends_on"] for e in ended]),
                )
            )
            dropped = EventWrite(
                PIECES_DROPPED_EVENT, {"dropped": [e["depends_on"] for e in ended]}
            )
            for event in (dropped, *events):
                self.write_event(conn, parent_id, event)
            _release(self, conn, [parent_id], self.clock.now())
        return ended

    def start_pieces(
        self,
        parent_id: str,
        pieces: Sequence[Piece],
        state: WorkflowState,
        *,
        base_branch: str | None = None,
    ) -> list[str]:
        """Start a workflow for each of ``pieces`` of the epic ``parent_id``, in one
        transaction; returns their ids, in order. Idempotent: a piece started before
        (its ``piece`` edge from the parent) is not started again, so a phase driven
        again after a crash starts none twice.

        Each piece is of its parent's repository, base branch (``base_branch`` when
        given: the epic's own branch), auto-merge and language,
        starts in preparation on its forge issue with ``state`` (plus ``epic_parent``),
        ``blocked`` after the pieces it needs, and the parent waits for each
        (``piece`` edges). Raises WorkflowNotFound (no parent), ValueError for an
        ``after`` that is not an earlier piece.
        """
        now = self.clock.now()
        with self.transaction() as conn:
            parent = (
                conn.execute(sa.select(t.workflows).where(_w.id == parent_id).with_for_update())
                .mappings()
                .first()
            )
            if parent is None:
                raise WorkflowNotFound(parent_id)
            started = dict(
                conn.execute(
                    sa.select(_d.position, _d.depends_on).where(
                        _d.workflow_id == parent_id, _d.kind == PIECE
                    )
                ).all()
            )
            ids: list[str] = []
            for place, piece in enumerate(pieces, 1):
                if any(not 1 <= n < place for n in piece.after):
                    raise ValueError(f"piece {place} can only follow earlier pieces")
                found = started.get(place)
                if found is None:
                    base = base_branch or parent["base_branch"]
                    found = self._start_piece(
                        conn, {**parent, "base_branch": base}, piece, state, now
                    )
                    after = sorted({ids[n - 1] for n in piece.after})
                    for target in after:
                        _insert_edge(conn, found, target, AFTER, 0, None, now)
                    _insert_edge(conn, parent_id, found, PIECE, place, None, now)
                    if after:
                        left = edges_of(conn, found)
                        conn.execute(
                            t.workflows.update()
                            .where(_w.id == found)
                            .values(status=BLOCKED, error=waiting_text(BLOCKED, left, len(left)))
                        )
                        self.write_event(conn, found, EventWrite(BLOCKED, {"after": after}))
                ids.append(found)
            self.dialect.notify(conn)
        return ids

    def _start_piece(
        self,
        conn: sa.Connection,
        parent: Mapping[str, Any],
        piece: Piece,
        state: WorkflowState,
        now: datetime,
    ) -> str:
        while True:
            workflow_id = secrets.token_hex(4)
            if conn.execute(sa.select(_w.id).where(_w.id == workflow_id)).first() is None:
                break
        optional = {"repository": parent["repository"]} if parent["repository"] else {}
        conn.execute(
            t.workflows.insert().values(
                id=workflow_id,
                title=piece.title,
                ticket=piece.ticket,
                repo_path=parent["repo_path"],
                base_branch=parent["base_branch"],
                current_phase=PREPARATION,
                status=PHASE_STATUS_MAP[PREPARATION],
                auto_merge=parent["auto_merge"],
                content_language=parent["content_language"],
                issue_number=piece.issue_number,
                state={**state, "epic_parent": parent["id"]},
                created_at=now,
                updated_at=now,
                **optional,
            )
        )
        self.write_event(conn, workflow_id, EventWrite("phase_change", {"phase": PREPARATION}))
        return workflow_id
