"""Persistence: the schema, its migrations, the Store and the single commit path."""

from phasegate.store.store import (
    APPLY_ARM,
    DEFAULT_BUSY_TIMEOUT_S,
    AgentRunRecord,
    Fence,
    FenceLost,
    Store,
    StoreUnavailable,
    StoreUrlUnsupported,
    UsageTotals,
    commit_phase_result,
    open_store,
    store_server_problem,
    store_url_problem,
)

__all__ = [
    "APPLY_ARM",
    "DEFAULT_BUSY_TIMEOUT_S",
    "AgentRunRecord",
    "Fence",
    "FenceLost",
    "Store",
    "StoreUnavailable",
    "StoreUrlUnsupported",
    "UsageTotals",
    "commit_phase_result",
    "open_store",
    "store_server_problem",
    "store_url_problem",
]
