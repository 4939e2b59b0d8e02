"""Persistence: the schema, its migrations, the Store and the single commit path."""

from phasegate.store.store import (
    APPLY_ARM,
    AgentRunRecord,
    Store,
    UsageTotals,
    commit_phase_result,
    open_store,
)

__all__ = [
    "APPLY_ARM",
    "AgentRunRecord",
    "Store",
    "UsageTotals",
    "commit_phase_result",
    "open_store",
]
