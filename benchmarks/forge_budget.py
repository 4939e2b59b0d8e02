"""The GitHub REST calls a token pays: a workflow's, an idle hour's, and the workflows an hour.

Against the fake GitHub of the test rig (tests/support), no network, real git.
Each workflow goes from a maintainer's trusted label to its closed issue, with a
required check (``ci/tests``, which this script plays: it reports a minute
after each push) and an unattended merge. Two ways of running them, side by side:

- **webhooks**: phasegate as configured for a team with webhooks: the fake
  delivers each event to ``phasegate serve``, whose webhook starts the workflow
  a label asks for; a wait ends at the delivery that wakes it, so a pending
  check costs no look; each GET is asked again with its ETag (a 304 costs no
  rate limit).
- **polling**: as the trial team ran it: no webhooks, a look every
  ``--poll-s`` (2 s) while CI runs, no conditional requests.

Printed per workflow: the requests, the ones that count against the rate limit
(GitHub does not count a 304), the costliest endpoints; the idle hour (a watch
look on a repository with no work, times the looks an hour: ``forge.webhook_poll_s``
with webhooks, ``--poll-s`` without); and the workflows an hour one token's
5,000 requests sustain. The bars (docs/benchmarks.md): ≤ 25 counted calls a
workflow, ≤ 60 an idle hour with webhooks.

    .venv/bin/python benchmarks/forge_budget.py --workflows 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the rig
from phasegate.config.cartridge import load_cartridge  # noqa: E402
from phasegate.integrations.triggers import Started, Watcher  # noqa: E402
from phasegate.runtime.engine import Engine  # noqa: E402
from phasegate.runtime.pace import ForgePace  # noqa: E402
from phasegate.store import open_store  # noqa: E402
from phasegate.web.auth import Access  # noqa: E402
from phasegate.web.serve import Dashboard  # noqa: E402

from conftest import ANSWERS_BUT_BUILD, make_repo, scripted_cartridge  # noqa: E402
from support.github_server import GitHubServer, Recorded  # noqa: E402

REPOSITORY = "octo/widgets"
RATE_LIMIT = 5000
SECRET = "forge-budget-webhook-secret"
BUILD = 'runner = "command"\ncommand = "echo feature $(date +%N) > feature.txt; echo built"\n'


@dataclass
class Run:
    """What one way of running cost: ``per_workflow`` requests and counted calls,
    by endpoint, and the idle hour's."""

    requests: float
    counted: float
    endpoints: Counter[str]
    idle_requests: float
    idle_counted: float


def _endpoint(r: Recorded) -> str:
    path = re.sub(r"/[0-9a-f]{40}", "/SHA", r.path)
    path = re.sub(r"/\d+", "/N", path.replace(f"/repos/{REPOSITORY}", ""))
    return f"{r.method} {re.sub(r'/heads/.*', '/heads/BRANCH', path)}"


def _rest(requests: list[Recorded]) -> list[Recorded]:
    return [r for r in requests if not r.path.startswith("/git/")]


@contextmanager
def _no_conditional_requests(off: bool) -> Iterator[None]:
    """The polling peer asks every GET whole, as before conditional requests."""
    if not off:
        yield
        return
    with mock.patch("phasegate.forge.github.auth.ConditionalTransport", lambda inner: inner):
        yield


def run(workflows: int, *, webhooks: bool, poll_s: float, ci_s: float, root: Path) -> Run:
    """Run ``workflows`` workflows on a fresh fake GitHub; what they cost."""
    with GitHubServer(root=root / "github") as gh, _no_conditional_requests(not webhooks):
        bot, _ = gh.add_user("phasegate-bot"), gh.add_user("maya")
        os.environ["GITHUB_TOKEN"] = bot.token
        forge = (
            f'[forge]\nkind = "github"\nrepository = "{REPOSITORY}"\nbase_url = "{gh.url}"\n'
            f'poll_s = {poll_s}\nwebhook_poll_s = 300\nrequired_checks = ["ci/tests"]\n'
        )
        text = scripted_cartridge(role_overrides={"build": BUILD}, auto_merge=True) + forge
        files = {
            "README.md": "# widgets\n",
            ".gitignore": ".phasegate/\n",
            "answers.toml": ANSWERS_BUT_BUILD,
            "phasegate.toml": text,
        }
        repo = make_repo(root / "repo", files)
        gh.create_repo("octo", "widgets", from_path=repo)
        gh.grant(REPOSITORY, "phasegate-bot", "write")
        gh.grant(REPOSITORY, "maya", "maintain")
        cartridge = load_cartridge(repo)
        store = open_store(cartridge.store_url(repo))
        try:
            engine = Engine(repo, cartridge, store)
            watcher = Watcher(engine, REPOSITORY, max_ticket_bytes=1_000_000)
            looks = 1 if webhooks else round(ci_s / poll_s)
            with _served(engine, gh, webhooks):
                # A first workflow, not counted: what a repository pays once (its
                # status labels made, the base's protection read) is no workflow's.
                for workflow_id in _start(gh, watcher, 1, "Warm-up", webhooks):
                    _drive(engine, gh, workflow_id, looks)
                watcher.watch_once()  # the first look after the work: its answers changed
                idle_from = len(gh.requests)
                watcher.watch_once()
                idle = _rest(gh.requests[idle_from:])
                start = len(gh.requests)
                ids = _start(gh, watcher, workflows, "Feature", webhooks)
                for workflow_id in ids:
                    _drive(engine, gh, workflow_id, looks)
                gh.hooks.wait_all()
                spent = _rest(gh.requests[start:])
            if webhooks:
                store.record_delivery(
                    "0" * 64, forge="github", delivery=None, event="ping",
                    repository=REPOSITORY, keep_s=3600,
                )  # fmt: skip
            looks = 3600 / ForgePace(cartridge, store, REPOSITORY).wait_s()
        finally:
            store.close()
    counted = [r for r in spent if r.status != 304]
    return Run(
        len(spent) / len(ids),
        len(counted) / len(ids),
        Counter(_endpoint(r) for r in counted),
        len(idle) * looks,
        sum(1 for r in idle if r.status != 304) * looks,
    )


def _start(gh: GitHubServer, watcher: Watcher, n: int, title: str, hooked: bool) -> list[str]:
    """``n`` issues a maintainer labels, and the workflows that starts: each label's
    webhook delivery starts its own (``hooked``), else a watch look starts them all."""
    seen = len(gh.hooks.delivered)
    for number in range(n):
        issue = gh.open_issue(REPOSITORY, f"{title} {number}", "Write feature.txt.", by="maya")
        gh.label(REPOSITORY, issue.number, "phasegate", by="maya")
    if not hooked:
        return [r.workflow_id for r in watcher.watch_once() if isinstance(r, Started)]
    answers = [json.loads(d.answer) for d in gh.hooks.wait_all()[seen:] if d.event == "issues"]
    return [workflow_id for answer in answers for workflow_id in answer["started"]]


@contextmanager
def _served(engine: Engine, gh: GitHubServer, hooked: bool) -> Iterator[None]:
    """``phasegate serve`` without a worker (this script advances), the fake's
    webhook pointed at it (``hooked``), else nothing."""
    if not hooked:
        yield
        return
    os.environ["PHASEGATE_WEBHOOK_SECRET"] = SECRET
    dashboard = Dashboard(engine, Access(token=SECRET, user="maya"), port=0, worker=False)
    url = dashboard.start()
    gh.hooks.add(REPOSITORY, f"{url}/webhooks/github", SECRET)
    try:
        yield
    finally:
        dashboard.stop()


def _drive(engine: Engine, gh: GitHubServer, workflow_id: str, looks: int) -> None:
    """Advance the workflow to its end: while its head's check is pending it is
    looked at ``looks`` times (CI's minute), then the check passes."""
    for _ in range(20):
        row = engine.advance(workflow_id)
        if row["status"] in ("completed", "failed", "paused", "cancelled"):
            assert row["status"] == "completed", row["error"]
            return
        pr = gh.pull(REPOSITORY, row["pr_number"])
        head = gh.pull_facts(gh.repo(REPOSITORY), pr).head_sha
        assert head is not None
        for _ in range(looks - 1):
            engine.advance(workflow_id)
        gh.check_run(REPOSITORY, head, "ci/tests", conclusion="success")
    raise AssertionError(f"{workflow_id} did not end")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workflows", type=int, default=5)
    parser.add_argument("--poll-s", type=float, default=2.0, help="the polling peer's poll_s")
    parser.add_argument("--ci-s", type=float, default=60.0, help="how long CI takes")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="forge-budget-") as tmp:
        hooked = run(args.workflows, webhooks=True, poll_s=30, ci_s=args.ci_s, root=Path(tmp) / "a")
        polled = run(
            args.workflows, webhooks=False, poll_s=args.poll_s, ci_s=args.ci_s, root=Path(tmp) / "b"
        )
    print(f"{args.workflows} workflows each way, CI {args.ci_s:g} s, the peer polling every "
          f"{args.poll_s:g} s")  # fmt: skip
    print(f"{'':28}{'webhooks':>12}{'polling':>12}{'ratio':>8}")
    # The ratio says how many times better webhooks do: fewer calls, more workflows.
    rows = [
        ("requests a workflow", hooked.requests, polled.requests, 0),
        ("counted calls a workflow", hooked.counted, polled.counted, 0),
        ("requests an idle hour", hooked.idle_requests, polled.idle_requests, 0),
        ("counted calls an idle hour", hooked.idle_counted, polled.idle_counted, 0),
        (
            "workflows an hour a token",
            RATE_LIMIT / hooked.counted,
            RATE_LIMIT / polled.counted,
            True,
        ),
    ]
    for name, mine, peer, more_is_better in rows:
        better, worse = (mine, peer) if more_is_better else (peer, mine)
        ratio = f"{better / worse:.2f}x" if worse else "-"
        print(f"{name:28}{mine:12.1f}{peer:12.1f}{ratio:>8}")
    print("counted calls a workflow by endpoint, with webhooks:")
    for endpoint, n in hooked.endpoints.most_common():
        print(f"  {n / args.workflows:5.1f}  {endpoint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
