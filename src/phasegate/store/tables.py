"""The schema, as SQLAlchemy Core tables.

Alembic migrations create it; see ``migrations/``.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

Timestamp = sa.DateTime(timezone=True)

workflows = sa.Table(
    "workflows",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("ticket", sa.Text, nullable=False),
    sa.Column("repo_path", sa.Text, nullable=False),
    sa.Column("base_branch", sa.String(255), nullable=False),
    sa.Column("current_phase", sa.String(64), nullable=False),
    sa.Column("status", sa.String(64), nullable=False),
    sa.Column("current_round", sa.Integer, nullable=False, server_default="0"),
    sa.Column("dev_round", sa.Integer, nullable=False, server_default="1"),
    sa.Column("branch_name", sa.String(255)),
    sa.Column("worktree_path", sa.Text),
    sa.Column("issue_number", sa.Integer),
    sa.Column("pr_number", sa.Integer),
    sa.Column("merge_sha", sa.String(64)),
    sa.Column("auto_merge", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("user_feedback", sa.Text),
    sa.Column("content_language", sa.String(16), nullable=False, server_default="en"),
    sa.Column("error", sa.Text),
    sa.Column("state", sa.JSON, nullable=False),
    sa.Column("version", sa.Integer, nullable=False, server_default="0"),
    sa.Column("lease_owner", sa.String(255)),
    sa.Column("lease_expires_at", Timestamp),
    sa.Column("fence", sa.Integer, nullable=False, server_default="0"),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Column("completed_at", Timestamp),
    # The workflow a conflict-resolution child was forked from (phases/conflict.py).
    sa.Column("parent_workflow_id", sa.String(32)),
    sa.Index("ix_workflows_parent", "parent_workflow_id"),
    # The forge repository (owner/name) of a team forge's workflow; NULL: the
    # repository at repo_path. What a worker's pass filters on (migration 0005).
    sa.Column("repository", sa.String(255)),
    sa.Index("ix_workflows_repository", "repository", "repo_path"),
    # When a runnable workflow is next due (UTC); NULL: now. Written by the commit
    # path and by a worker rescheduling a look (migration 0006): what a worker's
    # pass claims by, and sleeps until.
    sa.Column("due_at", Timestamp),
    sa.Index("ix_workflows_due", "status", "due_at"),
    # A board's newest finished workflows, and counts by status (migration 0008).
    sa.Index("ix_workflows_status_created", "status", "created_at"),
    # Larger first, then oldest: the order workers claim in (migration 0013, docs/queues.md).
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
)

milestones = sa.Table(
    "milestones",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("workflow_id", sa.String(32), sa.ForeignKey("workflows.id"), nullable=False),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("phase", sa.String(64), nullable=False),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("status", sa.String(32), nullable=False),
    sa.Column("dedupe_key", sa.String(512), nullable=False, unique=True),
    sa.Column("summary", sa.Text, nullable=False, server_default=""),
    sa.Column("data", sa.JSON, nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.Index("ix_milestones_workflow", "workflow_id", "id"),
)

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("workflow_id", sa.String(32), sa.ForeignKey("workflows.id"), nullable=False),
    sa.Column("type", sa.String(64), nullable=False),
    sa.Column("data", sa.JSON, nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Index("ix_events_workflow", "workflow_id", "id"),
    # A workflow's newest events of some types (its phases, its latest agent run's
    # output, its forge faults) without reading the rest (migration 0008).
    sa.Index("ix_events_workflow_type", "workflow_id", "type", "id"),
    # One type's events across workflows: what /metrics sums (migration 0008).
    sa.Index("ix_events_type", "type", "id"),
)

agent_runs = sa.Table(
    "agent_runs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("workflow_id", sa.String(32), sa.ForeignKey("workflows.id"), nullable=False),
    sa.Column("phase", sa.String(64), nullable=False),
    sa.Column("role", sa.String(64), nullable=False),
    sa.Column("session_line", sa.String(32), nullable=False),
    sa.Column("runner", sa.String(64), nullable=False),
    sa.Column("round", sa.Integer, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("outcome", sa.String(32), nullable=False),
    sa.Column("error_kind", sa.String(64)),
    sa.Column("error", sa.Text),
    sa.Column("input_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("output_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cost_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("duration_s", sa.Float, nullable=False, server_default="0"),
    sa.Column("session_id", sa.String(255)),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("model", sa.String(255), nullable=False, server_default=""),
    sa.Index("ix_agent_runs_workflow", "workflow_id", "role"),
    # The spend of a day or a month, summed over its calls alone (migration 0011).
    sa.Index("ix_agent_runs_created", "created_at"),
    # When the call's process started, once it held its slots (migration 0013);
    # NULL for runs recorded before. Its end is started_at plus duration_s.
    sa.Column("started_at", Timestamp),
)

provider_sessions = sa.Table(
    "provider_sessions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("workflow_id", sa.String(32), sa.ForeignKey("workflows.id"), nullable=False),
    sa.Column("session_line", sa.String(32), nullable=False),
    sa.Column("runner", sa.String(64), nullable=False),
    sa.Column("session_id", sa.String(255), nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
    sa.UniqueConstraint("workflow_id", "session_line", name="uq_provider_sessions_line"),
)

forge_issues = sa.Table(
    "forge_issues",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("repo", sa.Text, nullable=False),
    sa.Column("number", sa.Integer, nullable=False),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("marker", sa.String(255)),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("closed_at", Timestamp),
    # The issue this one is a sub-issue of (an epic's piece: migration 0014).
    sa.Column("parent", sa.Integer),
    sa.UniqueConstraint("repo", "number", name="uq_forge_issues_number"),
)

forge_comments = sa.Table(
    "forge_comments",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("repo", sa.Text, nullable=False),
    sa.Column("issue_number", sa.Integer, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("marker", sa.String(255)),
    sa.Column("created_at", Timestamp, nullable=False),
)

forge_pull_requests = sa.Table(
    "forge_pull_requests",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("repo", sa.Text, nullable=False),
    sa.Column("number", sa.Integer, nullable=False),
    sa.Column("head", sa.String(255), nullable=False),
    sa.Column("base", sa.String(255), nullable=False),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("merge_sha", sa.String(64)),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Column("merged_at", Timestamp),
    sa.UniqueConstraint("repo", "number", name="uq_forge_pull_requests_number"),
)

# -- the development graph: recorded runs and the proposals they emitted --------------------

#: What the autonomy policy decided for a proposal (where it stands then:
#: ``phasegate.store.PROPOSAL_STATUSES``).
PROPOSAL_MODES = ("propose", "auto")

graph_runs = sa.Table(
    "graph_runs",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("workflow_id", sa.String(32), sa.ForeignKey("workflows.id")),
    sa.Column("date", sa.String(32), nullable=False),
    # The whole run record (graph.lifecycle.RUN_RECORD_KEYS), every call and answer included.
    sa.Column("record", sa.JSON, nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
)

# Each answered call of a run a workflow drives (its ``call_row``), written as it is
# answered: a restarted phase replays these answers and only then asks agents again.
graph_calls = sa.Table(
    "graph_calls",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("workflow_id", sa.String(32), sa.ForeignKey("workflows.id")),
    sa.Column("call", sa.JSON, nullable=False),
    sa.Column("created_at", Timestamp, nullable=False),
)

proposals = sa.Table(
    "proposals",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    # The proposal's id in its run record: {run_id}/{kind}/{n}.
    sa.Column("record_id", sa.String(255), nullable=False),
    sa.Column("run_id", sa.String(64), sa.ForeignKey("graph_runs.run_id"), nullable=False),
    # Its place among its run's proposals (1, 2, ...), as the record lists them.
    sa.Column("position", sa.Integer, nullable=False),
    sa.Column("workflow_id", sa.String(32), sa.ForeignKey("workflows.id")),
    sa.Column("kind", sa.String(64), nullable=False),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("payload", sa.JSON, nullable=False),
    sa.Column("evidence", sa.JSON, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("self_modification", sa.Boolean, nullable=False),
    sa.Column("paths", sa.JSON, nullable=False),
    sa.Column("mode", sa.String(16), nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("decided_by", sa.String(255)),
    sa.Column("decided_at", Timestamp),
    # The order decisions were taken in (1, 2, ...): the gate history a streak is counted on.
    sa.Column("decision_seq", sa.Integer),
    sa.Column("reason", sa.Text),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.UniqueConstraint("record_id", name="uq_proposals_record_id"),
    sa.UniqueConstraint("decision_seq", name="uq_proposals_decision_seq"),
    sa.Index("ix_proposals_status", "status", "created_at"),
    sa.Index("ix_proposals_kind", "kind", "decision_seq"),
)

# -- webhooks: the deliveries a forge sent (integrations/webhooks.py) -------------------------

webhook_deliveries = sa.Table(
    "webhook_deliveries",
    metadata,
    # The SHA-256 of the delivery's body: a replay is the same signed body again,
    # whatever delivery id its headers claim (a header is not signed).
    sa.Column("digest", sa.String(64), primary_key=True),
    sa.Column("forge", sa.String(16), nullable=False),
    sa.Column("delivery", sa.String(255)),
    sa.Column("event", sa.String(64), nullable=False),
    sa.Column("repository", sa.String(255), nullable=False),
    sa.Column("received_at", Timestamp, nullable=False),
    sa.Index("ix_webhook_deliveries_repository", "repository", "received_at"),
    sa.Index("ix_webhook_deliveries_received", "received_at"),
)

# -- people: who may use the dashboard, with which role (store/users.py) ---------------------

users = sa.Table(
    "users",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(64), nullable=False),
    # One of values.USER_ROLES: viewer, approver or admin.
    sa.Column("role", sa.String(16), nullable=False),
    # The SHA-256 (hex) of the person's token; the token itself is never stored.
    # NULL: removed, so no token opens anything.
    sa.Column("token_hash", sa.String(64)),
    sa.Column("added_by", sa.String(255), nullable=False),
    sa.Column("added_at", Timestamp, nullable=False),
    # The last change of role or token, and who made it.
    sa.Column("changed_by", sa.String(255)),
    sa.Column("changed_at", Timestamp),
    # Set when removed: the row stays, so who was who stays readable.
    sa.Column("removed_by", sa.String(255)),
    sa.Column("removed_at", Timestamp),
    sa.UniqueConstraint("name", name="uq_users_name"),
    sa.UniqueConstraint("token_hash", name="uq_users_token_hash"),
)

# -- budgets: what may be spent a day and a month (store/budgets.py) -------------------------

budgets = sa.Table(
    "budgets",
    metadata,
    # "*": the whole store; else a repository as workflows name it: the team forge's
    # owner/name, or the clone's path for the local forge.
    sa.Column("scope", sa.String(1024), primary_key=True),
    # USD per UTC day and per UTC month; NULL: no budget of that kind here.
    sa.Column("daily_usd", sa.Float),
    sa.Column("monthly_usd", sa.Float),
    sa.Column("set_by", sa.String(255), nullable=False),
    sa.Column("updated_at", Timestamp, nullable=False),
)

# -- ports: the ranges reserved for workflows' worktrees (store/ports.py) ---------------------

port_reservations = sa.Table(
    "port_reservations",
    metadata,
    # One range per workflow: it is the workflow's, whichever worker made it.
    sa.Column("workflow_id", sa.String(32), primary_key=True),
    # The first port, and how many follow it (base .. base + count - 1).
    sa.Column("base", sa.Integer, nullable=False),
    sa.Column("port_count", sa.Integer, nullable=False),
    # The machine that bind-tested the range free.
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("reserved_at", Timestamp, nullable=False),
    sa.Index("ix_port_reservations_base", "base"),
)

# -- queues: the agent calls running now, by cap, and the caps a person set -----------------

#: What an agent slot is counted against (``agent_slots.scope``, ``queue_caps.scope``).
SLOT_SCOPES = ("provider", "runner", "repository")

# One row per cap a running agent call counts against (agents/slots.py): a call to
# provider p by runner r in repository x holds up to three rows, all with one call_id;
# a call waiting for its slots has its rows here too, marked waiting.
# A row whose expires_at passed, or whose holder is a gone process of this host, holds
# nothing: a killed worker's calls give their slots back within its lease.
agent_slots = sa.Table(
    "agent_slots",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("scope", sa.String(16), nullable=False),
    sa.Column("key", sa.String(255), nullable=False),
    sa.Column("call_id", sa.String(32), nullable=False),
    # The worker (``host:pid:token``: its lease owner) whose call holds the slot.
    sa.Column("holder", sa.String(255), nullable=False),
    sa.Column("workflow_id", sa.String(32), nullable=False),
    sa.Column("role", sa.String(64), nullable=False),
    # When it took the slot; a waiting row: since when it waits.
    sa.Column("acquired_at", Timestamp, nullable=False),
    # Renewed with the workflow's lease (``LeaseRows.renew``).
    sa.Column("expires_at", Timestamp, nullable=False),
    # A call waiting for the slot, not holding it: the free slots go to the waiting
    # calls of the larger priority (the workflow's) first, then the longest waiting.
    sa.Column("waiting", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    # The cap the call counts against under this scope and key, as its worker read it.
    sa.Column("cap", sa.Integer, nullable=False, server_default="1"),
    sa.Index("ix_agent_slots_key", "scope", "key"),
    sa.Index("ix_agent_slots_workflow", "workflow_id", "holder"),
    sa.Index("ix_agent_slots_call", "call_id"),
)

# The caps a person set in the store (``phasegate queue cap``): with a cartridge's own
# cap for the same scope and key, the smaller holds. key "*": each one of the scope.
queue_caps = sa.Table(
    "queue_caps",
    metadata,
    sa.Column("scope", sa.String(16), primary_key=True),
    sa.Column("key", sa.String(255), primary_key=True),
    sa.Column("cap", sa.Integer, nullable=False),
    sa.Column("set_by", sa.String(255), nullable=False),
    sa.Column("set_at", Timestamp, nullable=False),
)

# -- dependencies between workflows (store/dependencies.py, docs/epics.md) ------------------

workflow_dependencies = sa.Table(
    "workflow_dependencies",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    # The workflow that waits.
    sa.Column("workflow_id", sa.String(32), sa.ForeignKey("workflows.id"), nullable=False),
    # The workflow it waits for; NULL while it names a forge issue that has none yet.
    sa.Column("depends_on", sa.String(32)),
    # ``after``: run only after it (--after, Depends on #N, an epic piece's order);
    # ``piece``: an epic's parent waits for its piece.
    sa.Column("kind", sa.String(16), nullable=False),
    # A piece's place in its epic (1, 2, ...); 0 for any other dependency.
    sa.Column("position", sa.Integer, nullable=False, server_default="0"),
    # The forge issue (owner/name, number) a ``Depends on #N`` named.
    sa.Column("issue_repository", sa.String(255)),
    sa.Column("issue_number", sa.Integer),
    sa.Column("created_at", Timestamp, nullable=False),
    sa.Index("ix_workflow_dependencies_workflow", "workflow_id"),
    sa.Index("ix_workflow_dependencies_on", "depends_on"),
    sa.Index("ix_workflow_dependencies_issue", "issue_repository", "issue_number"),
)
