"""Indexes for a store after a year of work: boards, pages and metrics read what
they show, not every workflow's every event.

``ix_workflows_status_created``: a board's newest finished workflows and the
counts by status. ``ix_events_workflow_type``: a workflow's events of some
types (its phases, its latest agent run's output, its forge faults) without the
rest of its events. ``ix_events_type``: the events of one type across workflows
(phase changes, forge faults), what ``/metrics`` sums.

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    op.create_index("ix_workflows_status_created", "workflows", ["status", "created_at"])
    op.create_index("ix_events_workflow_type", "events", ["workflow_id", "type", "id"])
    op.create_index("ix_events_type", "events", ["type", "id"])


def downgrade() -> None:
    op.drop_index("ix_events_type", table_name="events")
    op.drop_index("ix_events_workflow_type", table_name="events")
    op.drop_index("ix_workflows_status_created", table_name="workflows")
