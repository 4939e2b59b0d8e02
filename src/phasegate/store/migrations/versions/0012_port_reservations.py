"""port_reservations: the range of ports each workflow's worktree holds.

A range is reserved when a workflow first needs it (its setup, a check, an
agent) and released when the workflow ends or its worktree is removed; no two
live ranges overlap, across every worker sharing the store.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"


def upgrade() -> None:
    op.create_table(
        "port_reservations",
        sa.Column("workflow_id", sa.String(32), primary_key=True),
        sa.Column("base", sa.Integer, nullable=False),
        sa.Column("port_count", sa.Integer, nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("reserved_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_port_reservations_base", "port_reservations", ["base"])


def downgrade() -> None:
    op.drop_table("port_reservations")
