"""Persistence: the schema, its migrations, the Store and the single commit path."""

from phasegate.store.store import (
    AgentRunRecord,
    Store,
    UsageTotals,
    commit_phase_result,
    open_store,
)

__all__ = ["AgentRunRecord", "Store", "UsageTotals", "commit_phase_result", "open_store"]
