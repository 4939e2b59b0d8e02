"""GitLabForge against the fake GitLab, real git over HTTP: issues found by
marker, status labels, who labelled, members' permissions, merge requests and
their diff notes, pipelines and statuses, merges at the exact head, branches.
Every request sent is judged by python-gitlab's managers (``gitlab`` fixture)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phasegate.config.forge import ForgeSettings
from phasegate.forge.base import ForgeAuthError, ForgeError, ForgeNotMergeable, TrustCache
from phasegate.forge.factory import make_forge
from phasegate.forge.gitlab.auth import GitLabAuth, repository_from_origin
from phasegate.forge.gitlab.forge import GitLabForge, open_gitlab
from phasegate.forge.gitlab.merges import GitLabNotMergeable
from phasegate.forge.gitlab.numbers import MR_NUMBERS
from phasegate.git.workspace import Workspace

from conftest import git
from gitlab_forge_kit import (
    BOT,
    PROJECT,
    branch_with_change,
    forge_for,
    gitlab,
    gl_forge,
    gl_local,
)
from support.gitlab_lab import Lab

__all__ = ["gitlab", "gl_forge", "gl_local"]  # fixtures, used by name


def test_an_issue_is_found_by_its_marker_and_its_status_label_is_the_only_one(
    gitlab: Lab, gl_forge: GitLabForge
) -> None:
    number = gl_forge.create_issue("Add it", "Write feature.txt", "phasegate:workflow:w1")
    assert gl_forge.find_issue("phasegate:workflow:w1") == number
    assert gl_forge.find_issue("phasegate:workflow:w2") is None
    issue = gl_forge.issue(number)
    assert (issue.title, issue.body, issue.state, issue.author) == (
        "Add it", "Write feature.txt", "open", BOT,
    )  # fmt: skip
    gitlab.gl.label(PROJECT, number, "bug", by="alice")
    gl_forge.set_status_label(number, "phasegate:planning")
    gl_forge.set_status_label(number, "phasegate:developing")
    gl_forge.set_status_label(number, "phasegate:developing")  # idempotent
    held = gitlab.gl.project(PROJECT).issues[number]
    assert sorted(held.labels) == ["bug", "phasegate:developing"]
    assert gitlab.gl.project(PROJECT).labels["phasegate:developing"].color == "#5319e7"
    with pytest.raises(ForgeError, match="no status label"):
        gl_forge.set_status_label(number, "bug")
    gl_forge.set_status_label(number, None)
    assert held.labels == ["bug"]
    gl_forge.close_issue(number)
    assert gl_forge.issue(number).state == "closed"


def test_every_text_sent_is_redacted_of_the_secrets_and_the_token(
    gitlab: Lab, gl_local: Path
) -> None:
    token = gitlab.token(BOT)
    forge = GitLabForge(
        PROJECT, GitLabAuth(token, "the token in GITLAB_TOKEN"), gl_local, Workspace(),
        ForgeSettings(kind="gitlab", repository=PROJECT, base_url=gitlab.gl.url),
        ["sk-live-s3cret"], retry_backoff_s=0.01,
    )  # fmt: skip
    number = forge.create_issue("key sk-live-s3cret", f"token {token}", "phasegate:w:1")
    forge.comment(number, "said sk-live-s3cret", "phasegate:w:plan")
    issue = gitlab.gl.project(PROJECT).issues[number]
    sent = [issue.title, issue.description, issue.notes[0].body]
    assert not [t for t in sent if "sk-live-s3cret" in t or token in t], sent


def test_labelled_issues_say_who_added_the_label_and_permissions_follow_access_levels(
    gitlab: Lab, gl_forge: GitLabForge
) -> None:
    gl = gitlab.gl
    first = gl.open_issue(PROJECT, "guest", "by guest", "x")
    second = gl.open_issue(PROJECT, "alice", "by alice", "y")
    gl.label(PROJECT, first.iid, "phasegate", by="alice")
    gl.label(PROJECT, second.iid, "phasegate", by="dev")
    gl.label(PROJECT, second.iid, "phasegate", by="dev", add=False)
    gl.label(PROJECT, second.iid, "phasegate", by="guest")  # a Guest may not: the fake lets it
    found = {x.issue.number: x.by for x in gl_forge.labelled_issues("phasegate")}
    assert found == {first.iid: "alice", second.iid: "guest"}
    trust = TrustCache(gl_forge)
    levels = {n: trust.permission(n) for n in ("alice", "dev", "guest", "stranger", BOT, "")}
    assert levels == {
        "alice": "admin", "dev": "write", "guest": "read", "stranger": "none",
        BOT: "write", "": "none",
    }  # fmt: skip
    assert [n for n in levels if trust.trusted(n)] == ["alice", "dev", BOT]
    bot, token = gl.project_token(PROJECT, "maintainer")
    assert trust.permission(bot.username) == "maintain"
    as_bot = forge_for(gitlab, gl_forge.repo, token=token)
    assert as_bot.login() == bot.username
    assert as_bot.find_issue("nothing") is None
    head = branch_with_change(gl_forge.repo, "by-the-bot")
    as_bot.publish_branch("by-the-bot")  # git over HTTP with the project's token
    assert gl.project(PROJECT).bare.branch_sha("by-the-bot") == head


def test_a_merge_request_is_numbered_apart_from_issues_and_its_diff_notes_are_inline(
    gitlab: Lab, gl_forge: GitLabForge, gl_local: Path
) -> None:
    issue = gl_forge.create_issue("t", "b", "phasegate:workflow:w1")
    head = branch_with_change(gl_local, "phasegate/w1")
    gl_forge.publish_branch("phasegate/w1")
    number = gl_forge.create_pull_request(
        "phasegate/w1", "main", "Add it", f"Implements #{issue}\n\nCloses #{issue}."
    )
    assert number == MR_NUMBERS + 1 and issue == 1
    assert gl_forge.create_pull_request("phasegate/w1", "main", "Add it", "again") == number
    assert gl_forge.find_pull_request("phasegate/w1") == number
    mr = gitlab.gl.project(PROJECT).merge_requests[1]
    assert len(gitlab.gl.project(PROJECT).merge_requests) == 1
    # GitLab closes an issue on "Implements #1" too: nothing phasegate sends does
    assert mr.description == f"Part of #{issue}\n\nPart of #{issue}."
    pr = gl_forge.pull_request(number)
    assert (pr.head, pr.base, pr.state, pr.head_sha) == ("phasegate/w1", "main", "open", head)
    assert gl_forge.pull_request(1) == pr  # the plain !1 a person types
    assert gl_forge.issue(number).pull_request

    gl_forge.comment(issue, "the plan", "phasegate:w1:plan")
    gl_forge.comment(number, f"see #{number}", "phasegate:w1:report")
    assert gl_forge.find_comment(number, "phasegate:w1:report") is not None
    assert gl_forge.find_comment(issue, "phasegate:w1:report") is None
    assert mr.notes[0].body.startswith("see !1")
    gitlab.gl.comment(mr, gitlab.gl.users["dev"], "Looks close.")
    gitlab.gl.line_comment(PROJECT, 1, "dev", "app.py", 1, "Call it y.")
    said = gl_forge.comments(number)
    assert [(c.kind, c.author, c.body, c.path, c.line) for c in said] == [
        ("conversation", "dev", "Looks close.", None, None),
        ("inline", "dev", "Call it y.", "app.py", 1),
    ]
    assert gl_forge.comments(number, since=said[0].created_at) == said[1:]
    assert gl_forge.comments(issue) == []  # the plan is phasegate's own

    gl_forge.update_pull_request(number, "new text")
    assert mr.description == "new text"
    gl_forge.close_pull_request(number)
    gl_forge.close_pull_request(number)  # idempotent
    assert gl_forge.pull_request(number).state == "closed"


def test_checks_are_the_pipeline_and_statuses_and_pipelines_must_succeed_is_required(
    gitlab: Lab, gl_forge: GitLabForge, gl_local: Path
) -> None:
    head = branch_with_change(gl_local, "feature")
    gl_forge.publish_branch("feature")
    assert gl_forge.checks(head) == [] and gl_forge.required_checks("main") == []
    gl_forge.set_commit_status(head, "pending", "not yet")
    gl_forge.set_commit_status(head, "pending", "not yet")  # GitLab's 400: no error
    gitlab.gl.run_pipeline(PROJECT, head, "running")
    checks = {c.name: c.state for c in gl_forge.checks(head)}
    assert checks == {"pipeline": "pending", "phasegate": "pending"}
    gitlab.gl.run_pipeline(PROJECT, head, "failed")
    assert {c.name: c.state for c in gl_forge.checks(head)}["pipeline"] == "failure"
    project = gitlab.gl.project(PROJECT)
    project.only_allow_merge_if_pipeline_succeeds = True
    assert gl_forge.required_checks("main") == []  # kept a while
    assert gl_forge.required_checks("main", fresh=True) == ["pipeline"]
    strict = forge_for(gitlab, gl_local, required_checks=["lint"])
    assert strict.required_checks("main") == ["lint", "pipeline"]


def test_a_merge_lands_only_the_checked_head_and_honours_pipelines_must_succeed(
    gitlab: Lab, gl_forge: GitLabForge, gl_local: Path
) -> None:
    project = gitlab.gl.project(PROJECT)
    project.only_allow_merge_if_pipeline_succeeds = True
    project.merge_level = 30  # Developers may merge into main
    first = branch_with_change(gl_local, "feature")
    gl_forge.publish_branch("feature")
    number = gl_forge.create_pull_request("feature", "main", "t", "b")
    with pytest.raises(GitLabNotMergeable, match="405"):
        gl_forge.merge_pull_request(number, "Merge it", first)
    gitlab.gl.run_pipeline(PROJECT, first, "success")
    second = more(gl_local, "second")
    gl_forge.publish_branch("feature")
    gitlab.gl.run_pipeline(PROJECT, second, "success")
    with pytest.raises(ForgeError, match="409") as moved:  # the head moved past first
        gl_forge.merge_pull_request(number, "Merge it", first)
    assert not isinstance(moved.value, ForgeNotMergeable)
    third = more(gl_local, "third")
    gl_forge.publish_branch("feature")
    with pytest.raises(ForgeNotMergeable):  # the new head's pipeline has not passed
        gl_forge.merge_pull_request(number, "Merge it", third)
    assert gl_forge.find_merge(number) is None
    gitlab.gl.run_pipeline(PROJECT, third, "success")
    sha = gl_forge.merge_pull_request(number, "Merge #1000001: t\n\nCloses #4", third)
    assert project.merge_requests[1].merged_sha == third
    assert project.bare.git("rev-parse", "refs/heads/main").strip() == sha
    assert git(gl_local, "cat-file", "-t", sha) == "commit"  # fetched back
    message = project.bare.git("log", "-1", "--format=%B", sha)
    assert message.startswith("Merge !1: t") and "Part of #4" in message
    assert gl_forge.merge_pull_request(number, "again", third) == sha  # idempotent
    assert gl_forge.find_merge(number) == sha
    gl_forge.delete_branch("feature")
    gl_forge.delete_branch("feature")  # gone already: no error
    assert project.bare.branch_sha("feature") is None


def more(local: Path, name: str) -> str:
    """One more commit on ``feature``; its SHA."""
    git(local, "checkout", "-q", "feature")
    (local / f"{name}.txt").write_text(f"{name}\n")
    git(local, "add", "-A")
    git(local, "commit", "-qm", name)
    sha = git(local, "rev-parse", "HEAD")
    git(local, "checkout", "-q", "main")
    return sha


def test_a_conflict_is_not_mergeable_a_squash_is_one_commit_and_a_protected_base_names_it(
    gitlab: Lab, gl_forge: GitLabForge, gl_local: Path
) -> None:
    project = gitlab.gl.project(PROJECT)
    branch_with_change(gl_local, "one", "x = 'one'\n")
    branch_with_change(gl_local, "two", "x = 'two'\n")
    gl_forge.publish_branch("one")
    gl_forge.publish_branch("two")
    one = gl_forge.create_pull_request("one", "main", "one", "b")
    two = gl_forge.create_pull_request("two", "main", "two", "b")
    with pytest.raises(ForgeAuthError, match="protected"):  # a Developer; main is Maintainers'
        gl_forge.merge_pull_request(one, "Merge one")
    project.merge_level = 30
    squashing = forge_for(gitlab, gl_local, merge_method="squash")
    sha = squashing.merge_pull_request(one, "Squashed one")
    assert len(project.bare.git("rev-list", "--parents", "-n1", sha).split()) == 2  # one parent
    assert project.merge_requests[1].squash_commit_sha == sha
    with pytest.raises(GitLabNotMergeable, match="406"):
        gl_forge.merge_pull_request(two, "Merge two")


def test_the_project_comes_from_origin_and_the_token_is_named_when_missing(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    for url, base, expected in (
        ("https://gitlab.com/acme/app.git", None, "acme/app"),
        ("git@gitlab.com:acme/tools/app.git", None, "acme/tools/app"),
        ("ssh://git@gl.example.com:2222/a/b/c/app.git", "https://gl.example.com", "a/b/c/app"),
        ("https://git.example.com/gitlab/acme/app", "https://git.example.com/gitlab", "acme/app"),
    ):  # fmt: skip
        git(repo, "remote", "remove", "origin") if git(repo, "remote") else None
        git(repo, "remote", "add", "origin", url)
        assert repository_from_origin(repo, base) == expected
    with pytest.raises(ForgeError, match="forge.base_url"):
        repository_from_origin(repo, None)
    settings = ForgeSettings(kind="gitlab", repository="acme/app")
    with pytest.raises(ForgeAuthError, match="GITLAB_TOKEN is not set"):
        open_gitlab(settings, repo, Workspace(), [], environ={})
    made = open_gitlab(settings, repo, Workspace(), [], environ={"GITLAB_TOKEN": "glpat-x"})
    assert made.repository == "acme/app" and made.settings.token_env == "GITLAB_TOKEN"


def test_the_factory_opens_the_gitlab_forge_and_the_token_is_in_no_argv_or_config(
    gitlab: Lab, gl_local: Path, tmp_path: Path
) -> None:
    (gl_local / "phasegate.toml").write_text(
        f'[forge]\nkind = "gitlab"\nbase_url = "{gitlab.gl.url}"\n'
    )
    from phasegate.config.cartridge import load_cartridge
    from phasegate.store import open_store

    cartridge = load_cartridge(gl_local)
    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    try:
        forge = make_forge(cartridge, gl_local, store, Workspace(), [])
        assert isinstance(forge, GitLabForge) and forge.repository == PROJECT
        branch_with_change(gl_local, "pushed")
        forge.publish_branch("pushed")
        assert gitlab.gl.project(PROJECT).bare.branch_sha("pushed") is not None
        assert forge.branch_ref("main") == "refs/phasegate/forge/main"
    finally:
        store.close()
    token = gitlab.token(BOT)
    assert token not in (gl_local / ".git" / "config").read_text()
    assert not [r for r in gitlab.gl.requests if token in str(r)]
