"""Leases: which worker advances a workflow, until when, under which fence.

A worker claims a workflow's lease (owner, expiry, fencing counter) before it
advances it and renews it from a heartbeat (docs/contracts/lifecycle.md: leases and
fencing). Another worker may
take the lease only once it has expired, or when its holder is a process of
this host that is gone; every claim moves the fence on, so the previous
holder's fence is stale from then on. A ``Fence`` is that holder's view:
``check()`` before every agent start and journaled side effect, and the fence
in the commit's WHERE, so a worker whose lease was taken over writes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from phasegate.core.contract import WorkflowNotFound
from phasegate.proc.host import holder_alive
from phasegate.store import tables as t
from phasegate.store._base import FenceLost, StoreBase, StoreUnavailable, utc, utc_row
from phasegate.store.values import WOKEN_AT

_c = t.workflows.c

#: ``claim_free``'s statements, built once (a pass runs them whenever a thread of a
#: busy worker ends): the other owners of the given workflows' leases, and the claim.
_HOLDERS = (
    sa.select(_c.lease_owner)
    .distinct()
    .where(
        _c.id.in_(sa.bindparam("ids", expanding=True)),
        _c.lease_owner.is_not(None),
        _c.lease_owner != sa.bindparam("owner"),
    )
)
_FREE = sa.or_(
    _c.lease_owner.is_(None),
    _c.lease_expires_at.is_(None),
    _c.lease_expires_at <= sa.bindparam("now"),
    _c.lease_owner.in_(sa.bindparam("gone", expanding=True)),
)
#: The order workers claim in: larger priority first, then oldest (docs/queues.md).
CLAIM_ORDER = (_c.priority.desc(), _c.created_at, _c.id)
#: Due now (``workflows.due_at``): never scheduled, or its time has come.
_DUE = sa.or_(_c.due_at.is_(None), _c.due_at <= sa.bindparam("now"))


def _claim_free(*where: sa.ColumnElement[bool]) -> Any:
    return (
        t.workflows.update()
        .where(
            _c.id.in_(
                sa.select(_c.id)
                .where(_c.id.in_(sa.bindparam("ids", expanding=True)), *where)
                .order_by(*CLAIM_ORDER)
                .with_for_update(skip_locked=True)
                .limit(sa.bindparam("limit"))
                .scalar_subquery()
            ),
            *where,
        )
        .values(
            lease_owner=sa.bindparam("owner"),
            lease_expires_at=sa.bindparam("expires"),
            fence=_c.fence + 1,
        )
        .returning(_c.id, _c.fence)
    )


# SKIP LOCKED (PostgreSQL; SQLite serializes writers already): workers filling
# their threads at once each take other workflows, none waits on another's
# batch only to find it taken. The UPDATE's own ``_FREE`` (and ``_DUE``) still
# judges each row: a workflow another worker rescheduled meanwhile is left alone.
_CLAIM_FREE = _claim_free(_FREE, _DUE)
#: The same, workflows scheduled for later taken too (``run_worker(once=True)``).
_CLAIM_FREE_ANY = _claim_free(_FREE)

#: ``schedule``'s write: the row's due time, only while its version is the one looked
#: at, and not for a workflow a webhook woke meanwhile (it stays due now).
_SCHEDULE = (
    t.workflows.update()
    .where(_c.id == sa.bindparam("w_id"), _c.version == sa.bindparam("w_version"))
    .values(
        due_at=sa.case((_c.due_at == WOKEN_AT, None), else_=sa.bindparam("due", type_=t.Timestamp))
    )
    .returning(_c.due_at)
)

#: ``renew``'s extension of the agent slots the lease's owner holds for the workflow.
_RENEW_SLOTS = (
    t.agent_slots.update()
    .where(
        t.agent_slots.c.workflow_id == sa.bindparam("w_id"),
        t.agent_slots.c.holder == sa.bindparam("owner"),
    )
    .values(expires_at=sa.bindparam("expires", type_=t.Timestamp))
)

#: ``check_fence``'s read, built once: it runs before every side effect and agent.
_FENCE = sa.select(_c.lease_owner, _c.lease_expires_at, _c.fence).where(
    _c.id == sa.bindparam("w_id")
)


@dataclass
class Fence:
    """One worker's hold on one workflow's lease: ``owner`` and the fence ``value``
    its claim returned. ``lost`` is set once the lease is known to be gone (the
    heartbeat could not renew it, or a check found it taken over) and stays set.
    """

    store: LeaseRows
    workflow_id: str
    owner: str
    value: int
    lost: threading.Event = field(default_factory=threading.Event)
    #: Why the heartbeat gave the lease up, when it was the store's fault rather than a
    #: takeover: the last renewal's StoreUnavailable (a stopped worker tells the truth).
    unrenewed: StoreUnavailable | None = None

    def check(self) -> None:
        """Raise FenceLost unless this worker still holds the lease, unexpired.

        Reads the store (one query); raises StoreUnavailable when it cannot.
        """
        if not self.lost.is_set() and self.store.check_fence(
            self.workflow_id, self.owner, self.value
        ):
            return
        self.lost.set()
        raise FenceLost(
            f"workflow {self.workflow_id}: the lease of {self.owner} (fence {self.value}) "
            "was taken over or expired; this worker stops without another write"
        )


class LeaseRows(StoreBase):
    """A workflow's lease: owner, expiry and fencing counter."""

    def claim(self, workflow_id: str, owner: str, ttl_s: float) -> int | None:
        """Take the workflow's lease for ``ttl_s`` seconds; returns the new fence or None.

        A lease is free when it has no owner, has expired, or belongs to
        ``owner`` already. A holder on this host whose process is gone (a
        SIGKILLed worker) no longer holds it, so a restart need not wait; any
        other holder (on another host, or alive here) loses it only by expiry.
        Two claims racing (threads, processes, machines) never both win: the row
        is read ``FOR UPDATE`` (PostgreSQL; SQLite's writers are serialized
        already), so the second reads the first's lease. Raises
        WorkflowNotFound, StoreUnavailable.
        """
        now = self.clock.now()
        c = t.workflows.c
        with self.transaction() as conn:
            row = conn.execute(
                sa.select(c.lease_owner, c.lease_expires_at, c.fence)
                .where(c.id == workflow_id)
                .with_for_update()
            ).first()
            if row is None:
                raise WorkflowNotFound(workflow_id)
            holder, expires, fence = row[0], utc(row[1]), row[2]
            free = holder is None or holder == owner or expires is None or expires <= now
            if not free and not holder_alive(holder):
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
            return int(fence) + 1

    def claim_free(
        self,
        workflow_ids: Collection[str],
        owner: str,
        ttl_s: float,
        *,
        limit: int | None = None,
        scheduled: bool = False,
    ) -> dict[str, int]:
        """Take, in one statement, the lease of each of ``workflow_ids`` that is free
        (no owner, expired, or a gone process of this host's: as ``claim`` judges it,
        except that ``owner``'s own unexpired lease is not free, since a thread of
        ``owner`` holds it), the oldest ``limit`` of them at most; returns workflow →
        its new fence, for those taken only. Only those due (``workflows.due_at``
        NULL or past), unless ``scheduled``: those scheduled for later too.

        How a worker fills its free threads, and how one starting after a crash
        reclaims a dead worker's workflows: one transaction
        for a batch, not one per workflow. The UPDATE itself judges freeness, so
        a lease another worker took meanwhile is left alone. Raises
        StoreUnavailable.
        """
        if not workflow_ids or (limit is not None and limit <= 0):
            return {}
        now = self.clock.now()
        ids = sorted(workflow_ids)
        with self.reading() as conn:
            holders = set(conn.execute(_HOLDERS, {"ids": ids, "owner": owner}).scalars())
        gone = sorted(h for h in holders if not holder_alive(h))
        with self.transaction() as conn:
            rows = conn.execute(
                _CLAIM_FREE_ANY if scheduled else _CLAIM_FREE,
                {
                    "ids": ids,
                    "gone": gone,
                    "now": now,
                    "limit": len(ids) if limit is None else limit,
                    "owner": owner,
                    "expires": now + timedelta(seconds=ttl_s),
                },
            ).all()
        return {row[0]: row[1] for row in rows}

    def free_gone_leases(self) -> int:
        """Release, in one statement, every lease held by a process of this host that
        is gone (a SIGKILLed worker's), moving each fence on; returns how many.

        What a worker starting after a crash does first: the
        dead worker's workflows are free again at once for every worker, on
        any host (one elsewhere cannot see that the holder is gone and would
        wait out the expiry). Raises StoreUnavailable.
        """
        c = t.workflows.c
        with self.reading() as conn:
            holders = set(
                conn.execute(
                    sa.select(c.lease_owner).distinct().where(c.lease_owner.is_not(None))
                ).scalars()
            )
        gone = sorted(h for h in holders if not holder_alive(h))
        if not gone:
            return 0
        with self.transaction() as conn:
            freed = int(
                conn.execute(
                    t.workflows.update()
                    .where(c.lease_owner.in_(gone))
                    .values(lease_owner=None, lease_expires_at=None, fence=c.fence + 1)
                ).rowcount
            )
            if freed:
                self.dialect.notify(conn)  # other workers may take them now
            return freed

    def lease_rows(
        self,
        statuses: Collection[str],
        *,
        repo_path: str | None = None,
        repository: str | None = None,
        due_by: datetime | None = None,
    ) -> list[dict[str, Any]]:
        """The workflows whose status is in ``statuses``, in ``CLAIM_ORDER`` (larger
        priority first, then oldest), each as
        ``id``, ``version``, ``status``, ``current_phase``, ``lease_owner`` and
        ``lease_expires_at`` (UTC-aware): what a worker's pass decides on, read in
        one query (an idle pass reads, never writes). With
        ``repo_path``, only the workflows of that worker's repository
        (``of_repository``: a store shared by many repositories). With
        ``due_by``, only those due by then (``workflows.due_at`` NULL or not
        later; ``ix_workflows_due``)."""
        c = t.workflows.c
        query = sa.select(
            c.id, c.version, c.status, c.current_phase, c.lease_owner, c.lease_expires_at
        ).where(c.status.in_(sorted(statuses)))
        if repo_path is not None:
            query = query.where(of_repository(repository, repo_path))
        if due_by is not None:
            query = query.where(sa.or_(c.due_at.is_(None), c.due_at <= due_by))
        with self.reading() as conn:
            rows = conn.execute(query.order_by(*CLAIM_ORDER)).mappings()
            return [utc_row(r) for r in rows]

    def next_due_at(
        self,
        statuses: Collection[str],
        after: datetime,
        *,
        repo_path: str | None = None,
        repository: str | None = None,
    ) -> datetime | None:
        """The earliest ``due_at`` later than ``after`` among the workflows whose
        status is in ``statuses`` (of that repository, as ``lease_rows``), UTC-aware;
        None when none is scheduled: what a worker with nothing due sleeps until."""
        c = t.workflows.c
        query = sa.select(sa.func.min(c.due_at)).where(
            c.status.in_(sorted(statuses)), c.due_at > after
        )
        if repo_path is not None:
            query = query.where(of_repository(repository, repo_path))
        with self.reading() as conn:
            return utc(conn.execute(query).scalar())

    def due_pauses(
        self,
        reason_prefix: str,
        now: datetime,
        *,
        repo_path: str | None = None,
        repository: str | None = None,
    ) -> list[tuple[str, int]]:
        """The paused workflows whose ``due_at`` has come by ``now`` and whose reason
        starts with ``reason_prefix`` (of that repository, as ``lease_rows``), oldest
        first, as (id, version): the pauses a worker resumes by itself
        (``phasegate.runtime.outage``). A person's pause has no ``due_at``."""
        c = t.workflows.c
        query = sa.select(c.id, c.version).where(
            c.status == "paused",
            c.due_at.is_not(None),
            c.due_at <= now,
            c.error.startswith(reason_prefix, autoescape=True),
        )
        if repo_path is not None:
            query = query.where(of_repository(repository, repo_path))
        with self.reading() as conn:
            rows = conn.execute(query.order_by(c.created_at, c.id)).all()
        return [(str(row[0]), int(row[1])) for row in rows]

    def schedule(self, workflow_id: str, version: int, due_in_s: float) -> datetime | None:
        """Make the workflow due ``due_in_s`` seconds from now (the store's clock)
        while its row is still at ``version``: a look that found nothing new and
        committed nothing (a wait for the forge's people, a child waiting for its
        parent) sets its next look. A commit since then set its own due time and
        is left alone, and so is one a webhook woke meanwhile (``WOKEN_AT``: due
        now). Returns the due time written (now, for a woken one), None when nothing was.
        Tells no other worker: nothing is due sooner. Raises StoreUnavailable."""
        now = self.clock.now()
        due = now + timedelta(seconds=due_in_s)
        with self.transaction() as conn:
            written = conn.execute(
                _SCHEDULE, {"w_id": workflow_id, "w_version": version, "due": due}
            ).first()
        if written is None:
            return None
        return due if written.due_at is not None else now  # woken: due now

    def local_forge_marker(self) -> tuple[int, int]:
        """How many of the local forge's pull requests are no longer open and how many
        of its issues are closed: what, beside a workflow's own row, can end a wait
        on the local forge (phases/wait.py, forge_feedback.pull_request_settled)."""
        with self.reading() as conn:
            prs = conn.execute(
                sa.select(sa.func.count()).where(t.forge_pull_requests.c.state != "open")
            ).scalar_one()
            issues = conn.execute(
                sa.select(sa.func.count()).where(t.forge_issues.c.state == "closed")
            ).scalar_one()
        return int(prs), int(issues)

    def renew(self, workflow_id: str, owner: str, fence: int, ttl_s: float) -> bool:
        """Extend ``owner``'s lease under ``fence`` to ``ttl_s`` seconds from now.

        The agent slots ``owner`` holds for the workflow (``store.queue``) are
        renewed with it, to the same expiry. False when the lease was taken over
        (another owner, a newer fence). Raises StoreUnavailable when the store
        cannot take the write.
        """
        c = t.workflows.c
        expires = self.clock.now() + timedelta(seconds=ttl_s)
        with self.transaction() as conn:
            held = conn.execute(
                t.workflows.update()
                .where(c.id == workflow_id, c.lease_owner == owner, c.fence == fence)
                .values(lease_expires_at=expires)
            ).rowcount
            if held:
                conn.execute(
                    _RENEW_SLOTS, {"w_id": workflow_id, "owner": owner, "expires": expires}
                )
            return bool(held)

    def check_fence(self, workflow_id: str, owner: str, fence: int) -> bool:
        """Whether ``owner`` still holds the workflow's lease under ``fence``, unexpired.

        False once another claim moved the fence on, or the lease expired
        unrenewed (another worker may claim it at any moment). Raises
        WorkflowNotFound, StoreUnavailable.
        """
        with self.reading() as conn:
            row = conn.execute(_FENCE, {"w_id": workflow_id}).first()
        if row is None:
            raise WorkflowNotFound(workflow_id)
        expires = utc(row[1])
        return (
            row[0] == owner
            and row[2] == fence
            and expires is not None
            and expires > self.clock.now()
        )

    def release(self, workflow_id: str, owner: str) -> None:
        """Give ``owner``'s lease up (the fence stays: the next claim moves it on);
        other workers are told (``Dialect.notify``). Raises StoreUnavailable."""
        c = t.workflows.c
        with self.transaction() as conn:
            released = conn.execute(
                t.workflows.update()
                .where(c.id == workflow_id, c.lease_owner == owner)
                .values(lease_owner=None, lease_expires_at=None)
            ).rowcount
            if released:
                self.dialect.notify(conn)


def of_repository(repository: str | None, repo_path: str) -> sa.ColumnElement[bool]:
    """The workflows a worker in the clone at ``repo_path`` may advance: those of
    its team forge's ``repository`` (``owner/name``; None with the local forge),
    started in any clone of it, and those identified by their path alone
    (``workflows.repository`` NULL: the local forge's, or from before migration
    0005) that are this clone's. Served by ``ix_workflows_repository``."""
    c = t.workflows.c
    by_path = sa.and_(c.repository.is_(None), c.repo_path == repo_path)
    return by_path if repository is None else sa.or_(c.repository == repository, by_path)

    return True
