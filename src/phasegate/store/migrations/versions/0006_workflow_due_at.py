"""workflows.due_at: when a runnable workflow is next due, a fact of the store
rather than of a worker's memory, so a restarted worker (or another one) honours it.

UTC; NULL: due now (every workflow from before this revision is). The commit
path writes it with the phase result (a wait for the forge's CI or its people:
after ``forge.poll_s``), a worker when a look found nothing new. A worker's pass
claims the runnable workflows whose ``due_at`` is NULL or past, and sleeps until
the earliest one ahead: ``ix_workflows_due`` serves both.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    op.add_column("workflows", sa.Column("due_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_workflows_due", "workflows", ["status", "due_at"])


def downgrade() -> None:
    op.drop_index("ix_workflows_due", table_name="workflows")
    # In place (SQLite 3.35 and later can): a copy of the table, as batch mode makes
    # one, is refused by the foreign keys of every other table that holds a row.
    op.drop_column("workflows", "due_at")
