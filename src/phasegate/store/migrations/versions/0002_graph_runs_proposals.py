"""The development graph's records: graph_runs (whole run records) and proposals (the gate).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "graph_runs",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("workflow_id", sa.String(32), sa.ForeignKey("workflows.id")),
        sa.Column("date", sa.String(32), nullable=False),
        sa.Column("record", sa.JSON, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
    )
    op.create_table(
        "proposals",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("record_id", sa.String(255), nullable=False),
        sa.Column("run_id", sa.String(64), sa.ForeignKey("graph_runs.run_id"), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("workflow_id", sa.String(32), sa.ForeignKey("workflows.id")),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("title", sa.Text, nullable=False),
        sa.Column("payload", sa.JSON, nullable=False),
        sa.Column("evidence", sa.JSON, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("self_modification", sa.Boolean, nullable=False),
        sa.Column("paths", sa.JSON, nullable=False),
        sa.Column("mode", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("decided_by", sa.String(255)),
        sa.Column("decided_at", Timestamp),
        sa.Column("decision_seq", sa.Integer),
        sa.Column("reason", sa.Text),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.UniqueConstraint("record_id", name="uq_proposals_record_id"),
        sa.UniqueConstraint("decision_seq", name="uq_proposals_decision_seq"),
    )
    op.create_index("ix_proposals_status", "proposals", ["status", "created_at"])
    op.create_index("ix_proposals_kind", "proposals", ["kind", "decision_seq"])
