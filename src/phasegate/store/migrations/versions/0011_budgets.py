"""budgets: the daily and monthly spend budgets a person set in the store, one row
per repository and one for the whole store; and an index on agent_runs by time,
so the spend of a day or a month is summed without reading every call.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("scope", sa.String(1024), primary_key=True),
        sa.Column("daily_usd", sa.Float),
        sa.Column("monthly_usd", sa.Float),
        sa.Column("set_by", sa.String(255), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_agent_runs_created", "agent_runs", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_agent_runs_created", table_name="agent_runs")
    op.drop_table("budgets")
