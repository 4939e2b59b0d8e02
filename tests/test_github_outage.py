"""A forge outage on the fake GitHub behind Prism, each fault caused on purpose:
nothing dropped, nothing silent (docs/github.md: faults).

A comment that fails past its retries pauses the workflow ``forge_unavailable``;
the worker resumes it by itself once its due time comes and the comment is
posted once. A create that timed out is looked up, not repeated, when the worker
resumes it. A rate limit's wait is a log line and a ``forge_retry`` event. Past
``forge.max_auto_resumes`` the pause is a person's. A comment GitHub refuses for
its own sake is dropped with an event, and the workflow goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from test_github_lifecycle import team_repo

from phasegate.cli.detail import print_detail
from phasegate.cli.render import drive
from phasegate.config.cartridge import load_cartridge
from phasegate.core import decisions
from phasegate.forge import ForgeAuth, GitHubForge
from phasegate.git.workspace import Workspace
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.summary import workflow_detail, workflow_summary
from phasegate.web.views import describe_event, group_of

from conftest import GitHubLab
from support.github_server import error_body

Build = Callable[..., tuple[Engine, Store]]

WAIT_S = 90.0  # bound on a wait for the worker; a correctness check, never a timing judgement
#: The worker's longest sleep: a due time must wake it well before (its look ahead).
POLL_S = 60.0
COMMENTS = r"/repos/octo/widgets/issues/\d+/comments$"
#: Automatic resumes come at once: a test waits for the worker, not for a backoff.
QUICK = "auto_resume_s = 0.05\n"


def quick_forge(lab: GitHubLab, repo: Path) -> GitHubForge:
    """The cartridge's GitHub forge with a 10 ms first backoff between tries."""
    settings = load_cartridge(repo).forge
    auth = ForgeAuth.from_token(lab.bot.token, "GITHUB_TOKEN")
    return GitHubForge(lab.repository, auth, repo, Workspace(), settings, retry_backoff_s=0.01)


def events(store: Store, workflow_id: str, kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in store.events(workflow_id, types=(kind,))]


def plan_comments(lab: GitHubLab, number: int) -> list[str]:
    said = lab.server.issue(lab.repository, number).comments
    return [c.body or "" for c in said if "**Plan (round 1)**" in (c.body or "")]


def labels(lab: GitHubLab, number: int) -> set[str]:
    return {x.name for x in lab.server.issue(lab.repository, number).labels}


@contextmanager
def worker(engine: Engine) -> Iterator[None]:
    """``phasegate worker`` on a thread while the block runs; what it raised fails the test."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            engine.run_worker(poll_s=POLL_S, concurrency=1)
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True, name="test-worker")
    thread.start()
    try:
        yield
    finally:
        engine.shutdown.set()
        thread.join(WAIT_S)
        engine.shutdown.clear()
    assert not thread.is_alive() and not raised, raised


def until(store: Store, workflow_id: str, done: Callable[[Mapping[str, Any]], bool]) -> Any:
    """The workflow's row once ``done`` holds for it, woken by the store's changes."""
    feed = store.changes()
    deadline = time.monotonic() + WAIT_S
    try:
        while True:
            row = store.workflow_row(workflow_id)
            if done(row):
                return row
            assert time.monotonic() < deadline, (row["status"], row["error"])
            feed.wait(0.5)
    finally:
        feed.close()


def test_a_comment_failing_past_its_retries_pauses_and_the_worker_posts_it_once(
    github: GitHubLab, tmp_path: Path, engine_for: Build, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="phasegate.forge.retries")
    repo, _ = team_repo(github, tmp_path, auto_merge=False, forge_extra=QUICK)
    engine, store = engine_for(repo, forge=quick_forge(github, repo))
    gh = github.server
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    gh.fail("POST", COMMENTS, 500, times=4)  # the first try and forge.max_retries (3) more

    row = engine.advance(workflow_id)
    assert row["status"] == "paused" and row["current_phase"] == "planning", row["error"]
    assert row["error"].startswith("forge_unavailable: planning: GitHub answered 500")
    assert "resumed by itself in 0.05 s (automatic resume 1 of 5)" in row["error"]
    assert row["due_at"] is not None
    assert events(store, workflow_id, "needs_you") == []  # nobody is asked: the worker acts
    card = workflow_summary(store, row)
    assert card["resumes_at"] == row["due_at"].isoformat() and group_of(card) == "waiting"
    assert labels(github, row["issue_number"]) == {"phasegate:planning"}  # no person's turn
    assert plan_comments(github, row["issue_number"]) == []
    call = f"POST /repos/octo/widgets/issues/{row['issue_number']}/comments"
    retries = events(store, workflow_id, "forge_retry")
    assert [(r["call"], r["status"], r["attempt"]) for r in retries] == [
        (call, 500, 2),
        (call, 500, 3),
        (call, 500, 4),
    ]
    assert f"forge retry: {call} answered 500; trying again in 0.01 s (try 2)" in caplog.text

    started = time.monotonic()
    with worker(engine):
        row = until(store, workflow_id, lambda r: r["status"] == "waiting")
    assert time.monotonic() - started < POLL_S / 2  # woken by the due time, not the poll
    assert len(plan_comments(github, row["issue_number"])) == 1
    resumed = events(store, workflow_id, "forge_auto_resume")
    assert [(e["attempt"], e["of"]) for e in resumed] == [(1, 5)]
    shown = [describe_event(e) for e in store.events(workflow_id, types=("forge_auto_resume",))]
    assert shown == ["resumed by itself (automatic resume 1 of 5)"]
    assert row["state"]["forge_resumes"] == 0  # the forge answered: the count starts again
    posted = [m for m in store.milestones(workflow_id) if m.dedupe_key.endswith(":plan:r1")]
    assert [m.status for m in posted] == ["completed"]


def test_a_foreground_run_waits_for_its_forge_pause_and_goes_on_by_itself(
    github: GitHubLab, tmp_path: Path, engine_for: Build, capsys: pytest.CaptureFixture[str]
) -> None:
    repo, _ = team_repo(github, tmp_path, auto_merge=False, forge_extra=QUICK)
    engine, store = engine_for(repo, forge=quick_forge(github, repo))
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    github.server.fail("POST", COMMENTS, 500, times=4)
    drive(engine, workflow_id, as_json=True)  # phasegate run: returns only once it waits
    row = store.workflow_row(workflow_id)
    assert row["status"] == "waiting", row["error"]
    assert '"status": "waiting"' in capsys.readouterr().out
    assert len(plan_comments(github, row["issue_number"])) == 1
    assert len(events(store, workflow_id, "forge_auto_resume")) == 1


def test_an_issue_create_that_timed_out_is_found_not_repeated_when_the_worker_resumes(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_repo(github, tmp_path, auto_merge=False, forge_extra=QUICK + "timeout_s = 3\n")
    engine, store = engine_for(repo, forge=quick_forge(github, repo))
    gh, name = github.server, github.repository
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    gh.delay("POST", r"/repos/octo/widgets/issues$", 4.5)  # answered after the client gave up

    row = engine.advance(workflow_id)
    assert row["status"] == "paused", row
    assert row["error"].startswith("forge_unavailable: preparation: GitHub did not answer")
    # Its resume looks no sooner than twice the timeout: a request GitHub held past the
    # client's timeout has landed by then, so the look finds it.
    assert "resumed by itself in 6 s" in row["error"]
    # GitHub made the issue after all: the fake's delayed request ends (nothing to await).
    deadline = time.monotonic() + WAIT_S
    while gh.counts(name)["issues"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)

    with worker(engine):
        row = until(store, workflow_id, lambda r: r["status"] == "waiting")
    assert gh.counts(name)["issues"] == 1 and row["issue_number"] == 1
    created = [m for m in store.milestones(workflow_id) if m.kind == "issue_created"]
    assert [m.status for m in created] == ["completed"]
    assert "found after restart" in created[0].summary
    assert len(events(store, workflow_id, "forge_auto_resume")) == 1


def test_a_429_with_retry_after_is_a_log_line_and_a_forge_retry_event_show_lists(
    github: GitHubLab,
    tmp_path: Path,
    engine_for: Build,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.WARNING, logger="phasegate.forge.retries")
    repo, _ = team_repo(github, tmp_path, auto_merge=False)
    seen: list[tuple[str, Mapping[str, Any]]] = []
    engine, store = engine_for(
        repo,
        forge=quick_forge(github, repo),
        on_event=lambda _, kind, data: seen.append((kind, data)),
    )
    github.server.fail(
        "POST", r"/repos/octo/widgets/pulls$", 429, times=1, headers={"Retry-After": "1"}
    )
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]

    said = {"call": "POST /repos/octo/widgets/pulls", "status": 429, "wait_s": 1.0}
    expected = {**said, "attempt": 2, "why": "rate_limit"}
    assert events(store, workflow_id, "forge_retry") == [expected]
    assert ("forge_retry", expected) in seen  # the progress display hears it as it happens
    line = "forge retry: POST /repos/octo/widgets/pulls answered 429; rate limit: waiting 1.00 s"
    assert f"{line} (try 2)" in caplog.text
    assert [r.levelname for r in caplog.records if line in r.getMessage()] == ["WARNING"]

    text = "POST /repos/octo/widgets/pulls answered 429: rate limit, try 2 after 1.0 s"
    detail = workflow_detail(store, workflow_id)
    assert [f["type"] for f in detail["forge_faults"]] == ["forge_retry"]
    (row_event,) = store.events(workflow_id, types=("forge_retry",))
    assert describe_event(row_event) == text  # the dashboard's activity
    print_detail(detail)
    assert text in capsys.readouterr().out  # phasegate show


def test_past_max_auto_resumes_the_pause_is_a_persons_and_resume_posts_the_comment_once(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    extra = QUICK + "max_auto_resumes = 2\nmax_retries = 0\n"
    repo, _ = team_repo(github, tmp_path, auto_merge=False, forge_extra=extra)
    engine, store = engine_for(repo, forge=quick_forge(github, repo))
    gh = github.server
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    gh.fail("POST", COMMENTS, 500, times=1000)  # GitHub stays down

    assert engine.advance(workflow_id)["status"] == "paused"
    with worker(engine):
        row = until(store, workflow_id, lambda r: r["status"] == "paused" and not r["due_at"])
    assert "still unavailable after 2 automatic resumes" in row["error"]
    assert f"`phasegate resume {workflow_id}`" in row["error"]
    assert [e["attempt"] for e in events(store, workflow_id, "forge_auto_resume")] == [1, 2]
    # Only the last pause waits for a person: one needs-you, one notification.
    assert [e["status"] for e in events(store, workflow_id, "needs_you")] == ["paused"]
    card = workflow_summary(store, row)
    assert card["resumes_at"] is None and group_of(card) == "needs_you"
    assert labels(github, row["issue_number"]) == {"phasegate:needs-you"}
    assert store.due_pauses("forge_unavailable: ", store.clock.now()) == []
    assert plan_comments(github, row["issue_number"]) == []

    gh.faults.clear()
    engine.decide(workflow_id, decisions.resume)
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    assert len(plan_comments(github, row["issue_number"])) == 1
    assert row["state"]["forge_resumes"] == 0


def test_a_comment_github_refuses_for_its_own_sake_is_dropped_with_an_event(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_repo(github, tmp_path, auto_merge=False)
    engine, store = engine_for(repo, forge=quick_forge(github, repo))
    refused = error_body(
        422, "Validation Failed", [{"resource": "IssueComment", "code": "custom", "field": "body"}]
    )
    github.server.fail("POST", COMMENTS, 422, times=1, body=refused)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    (dropped,) = events(store, workflow_id, "comment_dropped")
    assert dropped["key"] == "plan:r1" and dropped["phase"] == "planning"
    assert "422" in dropped["reason"]
    (row_event,) = store.events(workflow_id, types=("comment_dropped",))
    assert describe_event(row_event).startswith("comment plan:r1 on #1 dropped: GitHub refused")
    assert plan_comments(github, row["issue_number"]) == []
    # The comments after it are posted: the report's, found by its hidden marker.
    report = f"<!-- phasegate:{workflow_id}:report:d1 -->"
    said = github.server.issue(github.repository, row["issue_number"]).comments
    assert [c for c in said if report in (c.body or "")]


def test_a_verdict_whose_comment_failed_is_said_again_on_resume_never_asked_again(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    asked = tmp_path / "verifier-asked"
    asked.mkdir()
    # The verifier rejects, and leaves one file per time it is asked.
    verify = (
        'runner = "command"\n'
        f'command = "cat > {asked}/ask-$(ls {asked} | wc -l).txt; '
        'echo Feature is missing a test.; echo VERDICT: rejected"\n'
    )
    roles = {"verification": verify}
    repo, _ = team_repo(github, tmp_path, roles, auto_merge=False, forge_extra=QUICK)
    engine, store = engine_for(repo, forge=quick_forge(github, repo))
    gh = github.server
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    issue = row["issue_number"]
    gh.fail("POST", rf"/repos/octo/widgets/issues/{issue}/comments$", 500, times=4)

    engine.decide(workflow_id, lambda ctx: decisions.approve_merge(ctx, "maya"))
    row = engine.advance(workflow_id)
    assert row["status"] == "paused", row["error"]
    assert row["error"].startswith("forge_unavailable: acceptance_verification: "), row["error"]
    assert len(list(asked.iterdir())) == 1

    engine.decide(workflow_id, decisions.resume)
    row = engine.advance(workflow_id)
    assert row["status"] == "paused" and "acceptance verification rejected" in row["error"]
    assert len(list(asked.iterdir())) == 1, "the verifier was asked again"
    said = [c.body or "" for c in gh.issue(github.repository, issue).comments]
    rejected = [b for b in said if b.startswith("Acceptance verification: **rejected**")]
    assert len(rejected) == 1 and "Feature is missing a test." in rejected[0]
    verdicts = [m for m in store.milestones(workflow_id) if m.kind == "acceptance_verification"]
    assert [(m.status, m.data.get("verdict")) for m in verdicts] == [("completed", "rejected")]
