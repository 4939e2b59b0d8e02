"""users: the people who may use the dashboard, each with a role and a hashed token.

A person's token is stored as its SHA-256 only; a removed person's row stays
(who added, changed and removed it) with no token.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64)),
        sa.Column("added_by", sa.String(255), nullable=False),
        sa.Column("added_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("changed_by", sa.String(255)),
        sa.Column("changed_at", sa.DateTime(timezone=True)),
        sa.Column("removed_by", sa.String(255)),
        sa.Column("removed_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("name", name="uq_users_name"),
        sa.UniqueConstraint("token_hash", name="uq_users_token_hash"),
    )


def downgrade() -> None:
    op.drop_table("users")
