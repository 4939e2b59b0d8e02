"""The development graph's rows: recorded runs, their calls, proposals and the gate."""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import sqlalchemy as sa

from phasegate.core.autonomy import AutonomyPolicy, GateDecision, decide, is_self_modification
from phasegate.core.contract import (
    ProposalDecided,
    ProposalNotFound,
    RunNotFound,
)
from phasegate.graph.lifecycle import RUN_RECORD_KEYS
from phasegate.graph.proposals import Evidence, Proposal
from phasegate.store import tables as t
from phasegate.store._base import StoreBase, utc, utc_row

#: ``decided_by`` of a decision the apply arm took (mode ``auto``), not a person.
APPLY_ARM = "auto"
#: A person's verdicts on a proposal (``Store.decide_proposal``).
VERDICTS = ("approved", "rejected")


class GraphRows(StoreBase):
    """Recorded runs, their calls, proposals and the gate's decisions."""

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
            # Modes are decided on a settled gate history: no decision lands meanwhile.
            _hold_decisions(self, conn)
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
        with self.reading() as conn:
            row = (
                conn.execute(sa.select(t.graph_runs).where(t.graph_runs.c.run_id == run_id))
                .mappings()
                .first()
            )
        if row is None:
            raise RunNotFound(run_id)
        return utc_row(row)

    def runs_of(self, workflow_id: str) -> list[dict[str, Any]]:
        """The recorded runs a workflow drove (graph mode), oldest first: each
        run_id, workflow_id, date, record, created_at."""
        with self.reading() as conn:
            rows = (
                conn.execute(
                    sa.select(t.graph_runs)
                    .where(t.graph_runs.c.workflow_id == workflow_id)
                    .order_by(t.graph_runs.c.created_at, t.graph_runs.c.run_id)
                )
                .mappings()
                .all()
            )
        return [utc_row(row) for row in rows]

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
        with self.reading() as conn:
            rows = conn.execute(query.order_by(c.created_at, c.run_id, c.position)).mappings().all()
        return [utc_row(r) for r in rows]

    def proposal(self, proposal_id: str) -> dict[str, Any]:
        """One proposal row. Raises ProposalNotFound."""
        with self.reading() as conn:
            row = (
                conn.execute(sa.select(t.proposals).where(t.proposals.c.id == proposal_id))
                .mappings()
                .first()
            )
        if row is None:
            raise ProposalNotFound(proposal_id)
        return utc_row(row)

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
            # Before the read: two people deciding at once, the second reads the
            # first's verdict (ProposalDecided), never a stale "proposed".
            _hold_decisions(self, conn)
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
                when = utc(row.decided_at)
                at = f" at {when.isoformat()}" if when else ""
                raise ProposalDecided(
                    f"proposal {proposal_id} was {row.status} already{who}{at}; "
                    "a decision is not changed"
                )
            seq = _last_decision_seq(conn)
            self.dialect.notify(conn)  # the workflow waiting on this gate may go on
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
        """Mark a proposal ``applied``: the apply arm landed it (docs/contracts/graph.md:
        the harness).

        An ``approved`` one keeps the person's decision; a ``proposed`` one of
        mode ``auto`` is the apply arm's own decision (``decided_by`` APPLY_ARM,
        the next ``decision_seq``). An ``applied`` one is returned as it is (a
        restarted phase applies nothing twice). Raises ProposalNotFound, and
        ProposalDecided for a rejected proposal or a ``propose`` one nobody
        approved.
        """
        c = t.proposals.c
        with self.transaction() as conn:
            _hold_decisions(self, conn)
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
        with self.reading() as conn:
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
        with self.reading() as conn:
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


def _hold_decisions(store: StoreBase, conn: sa.Connection) -> None:
    """Serialize the transactions that decide proposals or read the gate history to
    decide modes (``Dialect.serialize``): numbering a decision reads the highest
    decision_seq, and a verdict reads the proposal's status, both then written."""
    store.dialect.serialize(conn, "proposals:decisions")


def _last_decision_seq(conn: sa.Connection) -> int | None:
    """The highest decision_seq; the caller holds ``_hold_decisions``, so no other
    transaction numbers a decision before this one commits (the unique constraint
    on decision_seq stays the backstop)."""
    return conn.execute(sa.select(sa.func.max(t.proposals.c.decision_seq))).scalar()
