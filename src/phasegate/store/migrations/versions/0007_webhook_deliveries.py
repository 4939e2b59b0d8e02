"""webhook_deliveries: each delivery a forge's webhook brought, by its body's digest.

A delivery seen before is a replay and is refused; the newest delivery for a
repository tells its workers that webhooks arrive, so polling slows down.
Rows older than the retention (integrations/webhooks.py) are pruned as new
ones arrive.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.create_table(
        "webhook_deliveries",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("forge", sa.String(16), nullable=False),
        sa.Column("delivery", sa.String(255)),
        sa.Column("event", sa.String(64), nullable=False),
        sa.Column("repository", sa.String(255), nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index(
        "ix_webhook_deliveries_repository", "webhook_deliveries", ["repository", "received_at"]
    )
    op.create_index("ix_webhook_deliveries_received", "webhook_deliveries", ["received_at"])


def downgrade() -> None:
    op.drop_table("webhook_deliveries")
