"""graph_calls: each answered call of a graph run inside a workflow, kept as it happens.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "graph_calls",
        sa.Column("run_id", sa.String(64), primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("workflow_id", sa.String(32), sa.ForeignKey("workflows.id")),
        sa.Column("call", sa.JSON, nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("graph_calls")
