"""Queues: a workflow's priority, the slots of agent calls held now, and the store's caps.

``workflows.priority`` orders claims (larger first, then oldest).
``agent_slots`` holds one row per cap a running agent call counts against
(its scope, key, holder worker, workflow and expiry), and those of the calls
waiting for one (by priority, then since when); ``queue_caps`` the caps a
person set in the shared store. ``agent_runs.started_at`` is when a call's
process was started, after it got its slots.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"


def upgrade() -> None:
    # In place (SQLite's ALTER TABLE ADD COLUMN): a copy of the table, as batch mode
    # makes one, is refused by the foreign keys of every other table that holds a row.
    op.add_column(
        "workflows", sa.Column("priority", sa.Integer, nullable=False, server_default="0")
    )
    op.add_column("agent_runs", sa.Column("started_at", sa.DateTime(timezone=True)))
    op.create_table(
        "agent_slots",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("call_id", sa.String(32), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("workflow_id", sa.String(32), nullable=False),
        sa.Column("role", sa.String(64), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("waiting", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
        sa.Column("cap", sa.Integer, nullable=False, server_default="1"),
    )
    op.create_index("ix_agent_slots_key", "agent_slots", ["scope", "key"])
    op.create_index("ix_agent_slots_workflow", "agent_slots", ["workflow_id", "holder"])
    op.create_index("ix_agent_slots_call", "agent_slots", ["call_id"])
    op.create_table(
        "queue_caps",
        sa.Column("scope", sa.String(16), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("cap", sa.Integer, nullable=False),
        sa.Column("set_by", sa.String(255), nullable=False),
        sa.Column("set_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("queue_caps")
    op.drop_table("agent_slots")
    op.drop_column("agent_runs", "started_at")
    op.drop_column("workflows", "priority")
