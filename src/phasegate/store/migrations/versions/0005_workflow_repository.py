"""workflows.repository: the forge repository a workflow is of, so that a worker
advances only its own repository's workflows (many repositories share one store).

``owner/name`` when the workflow's forge is a team's (GitHub); NULL when it is
the repository at ``repo_path`` (the local forge). Workflows from before this
revision keep NULL: they are claimed by their path, by a worker of the clone
that started them, as before (their cartridge's forge is not known here).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    op.add_column("workflows", sa.Column("repository", sa.String(255), nullable=True))
    op.create_index("ix_workflows_repository", "workflows", ["repository", "repo_path"])


def downgrade() -> None:
    op.drop_index("ix_workflows_repository", table_name="workflows")
    with op.batch_alter_table("workflows") as batch:  # SQLite drops a column by a copy
        batch.drop_column("repository")
