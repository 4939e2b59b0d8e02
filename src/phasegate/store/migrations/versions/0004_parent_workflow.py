"""workflows.parent_workflow_id: a conflict-resolution child names the workflow it forked from.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.add_column("workflows", sa.Column("parent_workflow_id", sa.String(32), nullable=True))
    op.create_index("ix_workflows_parent", "workflows", ["parent_workflow_id"])


def downgrade() -> None:
    op.drop_index("ix_workflows_parent", table_name="workflows")
    with op.batch_alter_table("workflows") as batch:  # SQLite drops a column by a copy
        batch.drop_column("parent_workflow_id")
