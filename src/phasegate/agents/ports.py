"""The ports a workflow's worktree holds, as the environment its agents, checks and setup see.

``landing_areas.ports = N`` reserves a range of N ports per workflow in the
store (``phasegate.store.ports``), bind-tested free on this machine
(``phasegate.proc.ports``), the first time the workflow needs it. Every process
that works in the worktree gets ``PHASEGATE_PORT_BASE`` (the first port) and
``PHASEGATE_PORT_COUNT`` (how many): a dev server or a test suite binds those,
and two workflows' never collide.
"""

from __future__ import annotations

from phasegate.config.cartridge import Cartridge
from phasegate.proc.host import host_name
from phasegate.proc.ports import PORT_RANGE, range_is_free
from phasegate.store import Store

__all__ = ["PORT_BASE", "PORT_COUNT", "port_env"]

#: The variables naming the workflow's range.
PORT_BASE = "PHASEGATE_PORT_BASE"
PORT_COUNT = "PHASEGATE_PORT_COUNT"


def port_env(store: Store, cartridge: Cartridge, workflow_id: str) -> dict[str, str]:
    """``{PORT_BASE, PORT_COUNT}`` of the workflow's range, reserved now when it holds
    none (or one of another size); empty when ``landing_areas.ports`` is 0.
    Raises PortsUnavailable (no free range), StoreUnavailable."""
    count = cartridge.landing_areas.ports
    if not count:
        return {}
    base, count = store.reserve_ports(
        workflow_id, count, host=host_name(), free=range_is_free, span=PORT_RANGE
    )
    return {PORT_BASE: str(base), PORT_COUNT: str(count)}
