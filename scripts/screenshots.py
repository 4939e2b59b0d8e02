#!/usr/bin/env python3
"""Take the README's screenshots of the dashboard.

    .venv/bin/python scripts/screenshots.py [--out docs/screenshots]

Builds the demo's sample project in a temporary directory, runs ``phasegate
serve``'s machinery on it (the dashboard and its worker, scripted agents),
files two tickets, approves one merge, and photographs in Debian's Chromium
(``support.browser``: ``PHASEGATE_CHROMIUM`` or /usr/bin/chromium)
the board, the waiting workflow's page, its diff and the people page:
``board.png``, ``workflow.png``, ``diff.png``, ``people.png`` in ``--out``.
Nothing outside the temporary directory and ``--out`` is touched.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from pathlib import Path

from phasegate import operations
from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store
from phasegate.tools.demo import make_sample_project
from phasegate.web import Access
from phasegate.web.serve import Dashboard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the rig: tests/support
from support.browser import chromium  # noqa: E402

#: Seconds a workflow may take to reach the state photographed.
SETTLE_S = 120
VIEWPORT = {"width": 1280, "height": 900}


def _until(store: Store, workflow_id: str, status: str) -> None:
    deadline = time.monotonic() + SETTLE_S
    while (now := store.workflow_row(workflow_id))["status"] != status:
        if now["status"] in ("failed", "paused") or time.monotonic() > deadline:
            raise SystemExit(f"{workflow_id} is {now['status']} ({now.get('error')}), not {status}")
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/screenshots"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="phasegate-shots-") as tmp:
        repo = make_sample_project(Path(tmp) / "calc")
        cartridge = load_cartridge(repo)
        store = open_store(cartridge.store_url(repo))
        engine = Engine(repo, cartridge, store)
        token = secrets.token_urlsafe(32)
        for name, role in (("bob", "approver"), ("carol", "approver"), ("vera", "viewer")):
            store.add_user(name, role, by="alice")
        access = Access(token=token, user="alice", store=store)
        dashboard = Dashboard(engine, access, port=0, poll_s=0.2)
        url = dashboard.start()
        try:
            merged = operations.start(
                engine, "Add calc.multiply(a, b), with tests.", by="alice", auto_merge=False,
                title="Add multiply()",
            )["id"]  # fmt: skip
            waiting = operations.start(
                engine, "Add calc.multiply(a, b) and document it in the README.", by="bob",
                auto_merge=False, title="Document multiply() in the README",
            )["id"]  # fmt: skip
            _until(store, merged, "waiting")
            operations.approve_merge(engine, merged, by="alice")
            _until(store, merged, "completed")
            _until(store, waiting, "waiting")
            operations.comment(
                engine, waiting, "calc/__init__.py", 11, "Say in the docstring that it "
                "accepts floats too.", by="alice",
            )  # fmt: skip
            with chromium() as browser:
                page = browser.new_context(viewport=VIEWPORT).new_page()
                page.goto(f"{url}/login?token={token}")
                page.screenshot(path=str(args.out / "board.png"), full_page=True)
                page.goto(f"{url}/workflows/{waiting}")
                page.screenshot(path=str(args.out / "workflow.png"), full_page=True)
                page.goto(f"{url}/workflows/{waiting}/diff")
                page.screenshot(path=str(args.out / "diff.png"), full_page=True)
                page.goto(f"{url}/people")
                page.screenshot(path=str(args.out / "people.png"), full_page=True)
        finally:
            dashboard.stop()
            store.close()
    for name in ("board.png", "workflow.png", "diff.png", "people.png"):
        print(args.out / name)
    return 1 if dashboard.errors else 0


if __name__ == "__main__":
    sys.exit(main())
