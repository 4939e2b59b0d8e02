"""What trusted people command in comments on GitHub (``/phasegate resume``,
``cancel``, ``verify ...``), read by the watcher and applied through operations:
the fake GitHub behind Prism, real git."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from test_github_lifecycle import team_repo

from phasegate.forge.base import TrustCache
from phasegate.integrations.commands import COMMAND_EVENT, Commanded, listen
from phasegate.integrations.triggers import Watcher
from phasegate.operations import DECISION_EVENT
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from conftest import GitHubLab

Build = Callable[..., tuple[Engine, Store]]


def commanded(watcher: Watcher) -> list[tuple[str, str, str | None]]:
    """(command, by, refused) of each command one look found."""
    found = watcher.watch_once()
    assert all(isinstance(x, Commanded) for x in found), found
    return [(x.command, x.by, x.refused) for x in found if isinstance(x, Commanded)]


def decisions_by_comment(store: Store, workflow_id: str) -> list[tuple[str, str]]:
    """(action, by) of each decision a forge comment commanded."""
    return [
        (e["data"]["action"], e["data"]["by"])
        for e in store.events(workflow_id, types=(DECISION_EVENT,))
        if e["data"].get("comment")
    ]


def test_a_rejected_verdict_comments_its_reason_and_trusted_verify_commands_act_once(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    seen = tmp_path / "verify-prompts"
    seen.mkdir()
    verify = (
        'runner = "command"\n'
        f'command = "cat > {seen}/v-$(ls {seen} | wc -l).txt; '
        'echo The README says nothing of it. SENTINEL-why; echo VERDICT: rejected"\n'
    )
    repo, _ = team_repo(github, tmp_path, {"verification": verify}, auto_merge=True)
    engine, store = engine_for(repo)
    gh, name = github.server, github.repository
    watcher = Watcher(engine, name, max_ticket_bytes=1_000_000)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "paused" and "rejected" in row["error"], row
    issue = row["issue_number"]
    said = [c.body for c in gh.issue(name, issue).comments]
    (verdict,) = [b for b in said if "**rejected** by the verifier" in b]
    assert "SENTINEL-why" in verdict

    gh.comment(name, issue, "/phasegate verify confirmed", by="rex")  # read permission
    gh.comment(name, issue, "/phasegate verify rejected", by="maya")  # no reason
    (untrusted, unsaid) = commanded(watcher)
    assert untrusted[:2] == ("verify confirmed", "rex") and "'read'" in str(untrusted[2])
    assert unsaid[:2] == ("verify rejected", "maya") and "say why" in str(unsaid[2])
    assert store.workflow_row(workflow_id)["status"] == "paused"

    pr = row["pr_number"]
    gh.comment(
        name, pr, "/phasegate verify rejected it must say what it does\nin one line", by="maya"
    )
    assert commanded(watcher) == [("verify rejected", "maya", None)]
    assert commanded(watcher) == []  # acted on once
    row = store.workflow_row(workflow_id)
    assert row["status"] == "paused" and row["state"]["verified_by"] == "maya"
    said = [c.body for c in gh.issue(name, issue).comments]
    (reason,) = [b for b in said if "**rejected** by maya" in b]
    assert "it must say what it does\nin one line" in reason

    gh.comment(name, issue, "/phasegate verify confirmed", by="maya")
    assert commanded(watcher) == [("verify confirmed", "maya", None)]
    row = store.workflow_row(workflow_id)
    assert row["status"] == "completed" and row["state"]["verified_by"] == "maya"
    assert gh.issue(name, issue).state == "closed"
    assert decisions_by_comment(store, workflow_id) == [
        ("verify_override", "maya"),
        ("verify_override", "maya"),
    ]
    refused = store.events(workflow_id, types=(COMMAND_EVENT,))
    assert [e["data"]["by"] for e in refused] == ["rex", "maya"]
    assert commanded(watcher) == []  # a completed workflow is not listened to


def test_a_trusted_cancel_command_cancels_a_waiting_workflow_and_is_never_feedback(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, prompts = team_repo(github, tmp_path, auto_merge=False)
    engine, store = engine_for(repo)
    gh, name = github.server, github.repository
    watcher = Watcher(engine, name, max_ticket_bytes=1_000_000)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    pr, issue = row["pr_number"], row["issue_number"]

    gh.comment(name, pr, "/phasegate cancel\nSENTINEL-outsider stop it", by="rex")
    gh.comment(name, issue, "/phasegate verify confirmed", by="maya")
    gh.comment(name, issue, "/phasegate frobnicate", by="maya")
    # wait hears no command as feedback: no new round
    assert engine.advance(workflow_id)["dev_round"] == row["dev_round"]
    found = commanded(watcher)
    assert [(c, b) for c, b, _ in found] == [
        ("cancel", "rex"),
        ("verify confirmed", "maya"),
        ("frobnicate", "maya"),
    ]
    assert "acceptance_verification" in str(found[1][2]) and "no command" in str(found[2][2])
    assert store.workflow_row(workflow_id)["status"] == "waiting"
    # A trusted person is told why on the forge, where they typed it; an outsider is not.
    answers = [c.body for c in gh.issue(name, issue).comments if c.body.startswith("@")]
    assert [a.split("`")[1] for a in answers] == [
        "/phasegate verify confirmed",
        "/phasegate frobnicate",
    ]
    assert answers[0].startswith("@maya ") and "not acceptance_verification" in answers[0]
    assert not [c for c in gh.pull(name, pr).comments if c.body.startswith("@")]

    gh.comment(name, issue, "/phasegate cancel", by="maya")
    assert commanded(watcher) == [("cancel", "maya", None)]
    row = store.workflow_row(workflow_id)
    assert (row["status"], row["error"]) == ("cancelled", "cancelled by maya")
    assert gh.pull(name, pr).state == "closed"
    assert decisions_by_comment(store, workflow_id) == [("cancel", "maya")]
    assert commanded(watcher) == []

    # A command on the cancelled workflow: polling leaves an ended workflow alone, and
    # the webhook's delivery of that comment gets its author told why nothing happened.
    gh.comment(name, issue, "/phasegate resume", by="maya")
    assert commanded(watcher) == []
    heard = listen(engine, name, TrustCache(engine.forge), lambda: False, numbers=[issue])
    assert [(x.command, x.by) for x in heard] == [("resume", "maya")]
    assert "cancelled" in str(heard[0].refused)
    answers = [c.body for c in gh.issue(name, issue).comments if c.body.startswith("@maya")]
    assert answers[-1].startswith("@maya `/phasegate resume`: ") and "cancelled" in answers[-1]
    assert listen(engine, name, TrustCache(engine.forge), lambda: False, numbers=[issue]) == []
    assert store.workflow_row(workflow_id)["status"] == "cancelled"
    every = "".join(p.read_text() for p in prompts.iterdir())
    assert "SENTINEL-outsider" not in every and "/phasegate" not in every


def test_a_trusted_resume_command_resumes_a_workflow_paused_by_a_forge_outage(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_repo(github, tmp_path, auto_merge=False)
    gh, name = github.server, github.repository
    gh.fail("GET", r"/repos/octo/widgets/commits/[0-9a-f]+/check-runs$", 500, times=4)
    engine, store = engine_for(repo)
    watcher = Watcher(engine, name, max_ticket_bytes=1_000_000)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "paused" and row["error"].startswith("forge_unavailable:"), row

    gh.comment(name, row["issue_number"], "/phasegate resume", by="maya")
    assert commanded(watcher) == [("resume", "maya", None)]
    assert store.workflow_row(workflow_id)["status"] != "paused"
    assert decisions_by_comment(store, workflow_id) == [("resume", "maya")]
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    assert commanded(watcher) == []
