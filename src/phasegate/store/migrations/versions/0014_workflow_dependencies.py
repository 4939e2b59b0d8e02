"""workflow_dependencies: a workflow waits for others (--after, Depends on #N, an epic's pieces);
forge_issues.parent: a local issue filed under another (an epic's piece).

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"


def upgrade() -> None:
    op.create_table(
        "workflow_dependencies",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("workflow_id", sa.String(32), sa.ForeignKey("workflows.id"), nullable=False),
        sa.Column("depends_on", sa.String(32)),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("position", sa.Integer, nullable=False, server_default="0"),
        sa.Column("issue_repository", sa.String(255)),
        sa.Column("issue_number", sa.Integer),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_workflow_dependencies_workflow", "workflow_dependencies", ["workflow_id"])
    op.create_index("ix_workflow_dependencies_on", "workflow_dependencies", ["depends_on"])
    op.create_index(
        "ix_workflow_dependencies_issue",
        "workflow_dependencies",
        ["issue_repository", "issue_number"],
    )

    with op.batch_alter_table("forge_issues") as batch:
        batch.add_column(sa.Column("parent", sa.Integer))


def downgrade() -> None:
    with op.batch_alter_table("forge_issues") as batch:
        batch.drop_column("parent")
    op.drop_table("workflow_dependencies")
