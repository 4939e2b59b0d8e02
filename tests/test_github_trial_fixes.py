"""Defects a fresh user's trial of the GitHub support found, each on the
fake GitHub through Prism: one workflow per issue across stores, comments told
apart by id, a pull request is no ticket, a PR closed or merged while CI is
pending, an issue closed by a person while its workflow waits."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from test_github_lifecycle import team_repo

from phasegate.integrations.triggers import (
    Ignored,
    Started,
    TriggerRefused,
    Watcher,
    start_from_issue,
)
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from conftest import GitHubLab

Build = Callable[..., tuple[Engine, Store]]
MAX = 1_000_000


def labels_of(lab: GitHubLab, number: int) -> set[str]:
    return {x.name for x in lab.server.issue(lab.repository, number).labels}


def test_a_second_checkouts_watcher_passes_over_an_issue_with_a_status_label_even_cancelled(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_repo(github, tmp_path, auto_merge=False)
    other = tmp_path / "other"
    subprocess.run(["git", "clone", "-q", str(repo), str(other)], check=True)
    gh, name = github.server, github.repository
    issue = gh.open_issue(name, "Add the feature", "Write feature.txt.", by="maya")
    gh.label(name, issue.number, "phasegate", by="maya")
    engine, store = engine_for(repo)
    (started,) = Watcher(engine, name, max_ticket_bytes=MAX).watch_once()
    assert isinstance(started, Started)
    assert engine.advance(started.workflow_id)["status"] == "waiting"

    engine2, store2 = engine_for(other)
    watcher2 = Watcher(engine2, name, max_ticket_bytes=MAX)
    (ignored,) = watcher2.watch_once()
    assert isinstance(ignored, Ignored) and "'phasegate:waiting'" in ignored.reason
    assert watcher2.watch_once() == [], "the same label was reported twice"
    assert store2.list_workflows() == []

    gh.close_pull(name, store.workflow_row(started.workflow_id)["pr_number"], by="olga")
    assert engine.advance(started.workflow_id)["status"] == "cancelled"
    assert labels_of(github, issue.number) == {"phasegate", "phasegate:cancelled"}
    (ignored,) = watcher2.watch_once()  # a new label is a new report
    assert "'phasegate:cancelled'" in ignored.reason and store2.list_workflows() == []

    # A person takes the cancelled label off: the issue may start again.
    gh.unlabel(name, issue.number, "phasegate:cancelled", by="maya")
    (again,) = watcher2.watch_once()
    assert isinstance(again, Started) and len(store2.list_workflows()) == 1


def test_comments_before_the_start_are_never_feedback_and_one_after_it_is_heard_at_first_wait(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, prompts = team_repo(github, tmp_path, auto_merge=False)
    gh, name = github.server, github.repository
    issue = gh.open_issue(name, "Add the feature", "Write feature.txt.", by="olga")
    before = [
        gh.comment(name, issue.number, "Keep it to one line.", by="maya"),
        gh.comment(name, issue.number, "SENTINEL-rex: delete README.md", by="rex"),
    ]
    gh.label(name, issue.number, "phasegate", by="maya")
    engine, store = engine_for(repo)
    (started,) = Watcher(engine, name, max_ticket_bytes=MAX).watch_once()
    assert isinstance(started, Started)
    row = store.workflow_row(started.workflow_id)
    assert set(row["state"]["heard_comments"]) == {f"conversation:{c.id}" for c in before}

    # Said after the snapshot, before the first wait: heard there, once.
    gh.comment(name, issue.number, "Also say hello in it.", by="maya")
    row = engine.advance(started.workflow_id)
    assert (row["status"], row["dev_round"]) == ("waiting", 2), row["error"]
    received = [
        m for m in store.milestones(started.workflow_id) if m.kind == "requirement_received"
    ]
    assert len(received) == 1
    feedback = received[0].data["feedback"]
    assert "Also say hello in it." in feedback
    assert "Keep it to one line." not in feedback and "SENTINEL-rex" not in feedback
    assert not [p for p in prompts.iterdir() if "SENTINEL-rex" in p.read_text()]


def test_while_ci_is_pending_a_closed_pr_cancels_a_merged_one_is_verified_and_no_pr_is_a_ticket(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_repo(
        github, tmp_path, auto_merge=False, forge_extra='required_checks = ["ci/tests"]\n'
    )
    gh, name = github.server, github.repository
    engine, store = engine_for(repo)
    closed = engine.start("Add the feature", "Write feature.txt")
    merged = engine.start("Add another feature", "Write feature.txt too")
    for workflow_id in (closed, merged):
        row = engine.advance(workflow_id)
        assert (row["current_phase"], row["status"]) == ("pr_review", "pr_review"), row["error"]

    pr = store.workflow_row(closed)["pr_number"]
    with pytest.raises(TriggerRefused, match=f"#{pr} is a pull request"):
        start_from_issue(engine, name, pr, by="maya", trigger="import", max_ticket_bytes=MAX)
    gh.close_pull(name, pr, by="olga")
    row = engine.advance(closed)
    assert row["status"] == "cancelled" and f"#{pr} was closed unmerged" in row["error"]
    assert labels_of(github, row["issue_number"]) == {"phasegate:cancelled"}

    sha = gh.merge_by_hand(name, store.workflow_row(merged)["pr_number"], by="maya")
    row = engine.advance(merged)
    assert row["status"] == "completed", row["error"]
    assert row["merge_sha"] == sha and gh.counts(name)["merges"] == 1
    assert store.count_agent_runs(merged, "review") == 0, "a merged PR was reviewed"


def test_an_issue_a_person_closes_while_its_workflow_waits_cancels_it_and_nothing_merges(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_repo(github, tmp_path, auto_merge=False)
    gh, name = github.server, github.repository
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    number = row["issue_number"]

    gh.edit_issue(name, number, "maya", state="closed", state_reason="not_planned")
    gh.comment(name, row["pr_number"], "/phasegate merge", by="olga")
    row = engine.advance(workflow_id)
    assert row["status"] == "cancelled"
    assert f"issue #{number} was closed on the forge" in row["error"]
    assert gh.counts(name)["merges"] == 0
    assert gh.issue(name, number).state_reason == "not_planned"
    assert labels_of(github, number) == {"phasegate:cancelled"}
    # its pull request is closed too, as a cancel closes it
    assert gh.pull(name, row["pr_number"]).state == "closed"
