"""How often a workflow waiting on a team's forge is looked at: slower while webhooks arrive."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta

from phasegate.config.cartridge import Cartridge
from phasegate.store import Store, StoreUnavailable

__all__ = ["HOOKED_S", "RECHECK_S", "ForgePace"]

log = logging.getLogger(__name__)

#: A delivery within this many seconds means the repository's webhooks arrive.
HOOKED_S = 3600.0
#: Seconds between two questions to the store about the newest delivery.
RECHECK_S = 30.0


class ForgePace:
    """The seconds between two looks at a workflow that waits on the forge (its CI,
    its people): ``forge.poll_s``; ``forge.webhook_poll_s`` (when longer) while a
    webhook delivery for ``repository`` came within HOOKED_S, since a delivery
    wakes the workflow anyway and polling is only the fallback; 0 on the local
    forge, whose waits are watched for changes instead."""

    def __init__(
        self,
        cartridge: Cartridge,
        store: Store,
        repository: str | None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = cartridge.forge
        self.store = store
        self.repository = repository
        self.monotonic = monotonic
        self.asked_at: float | None = None
        self.hooked = False

    def wait_s(self) -> float:
        if self.settings.kind == "local":
            return 0.0
        if self.repository is None:
            return self.settings.poll_s
        now = self.monotonic()
        if self.asked_at is None or now - self.asked_at >= RECHECK_S:
            self.asked_at = now
            try:
                last = self.store.last_delivery_at(self.repository)
            except StoreUnavailable as exc:
                log.debug("the newest webhook delivery is unknown for now: %s", exc)
                last = None
            since = self.store.clock.now() - timedelta(seconds=HOOKED_S)
            self.hooked = last is not None and last > since
        if self.hooked:
            return max(self.settings.poll_s, self.settings.webhook_poll_s)
        return self.settings.poll_s
