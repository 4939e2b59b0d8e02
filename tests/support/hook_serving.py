"""What every forge's webhook tests share: ``phasegate serve`` on a team repository, waiting.

Each forge's webhook tests (test_webhooks.py for GitHub, test_gitlab_webhooks.py,
test_gitea_webhooks.py) set the webhook's secret, make their forge's team
repository polled only hourly (``SLOW``: only a delivery can move a workflow
within a test), and serve it with ``serving``; ``wait_for`` times how long a
delivery took to show.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.web.auth import Access
from phasegate.web.serve import Dashboard

__all__ = ["SECRET", "SLOW", "Build", "serving", "wait_for"]

Build = Callable[..., tuple[Engine, Store]]

SECRET = "hook-s3cret"
#: No poll within a test: only a delivery wakes a workflow.
SLOW = "poll_s = 3600\nwebhook_poll_s = 3600\n"


def serving(engine_for: Build, repo: Path) -> Iterator[tuple[Engine, Store, Dashboard]]:
    """``repo``'s engine and store, and ``phasegate serve`` (dashboard and worker)
    on them, polling hourly; stopped when resumed (a fixture yields from it)."""
    engine, store = engine_for(repo)
    access = Access(token="a-dashboard-t0ken-of-length", user="alice")
    dashboard = Dashboard(engine, access, port=0, poll_s=3600)
    yield engine, store, dashboard
    dashboard.stop()


def wait_for(check: Callable[[], bool], timeout_s: float = 10.0) -> float:
    """Seconds until ``check()`` held; fails the test past ``timeout_s``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < timeout_s, "timed out"
        time.sleep(0.01)
    return time.monotonic() - start
