"""GitHubForge against the fake GitHub (support.github_server): real
HTTP on 127.0.0.1, real git over smart HTTP into a real bare repository."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from phasegate.config.cartridge import Cartridge
from phasegate.config.forge import ForgeSettings
from phasegate.core import decisions
from phasegate.forge import (
    ForgeAuth,
    ForgeAuthError,
    ForgeError,
    ForgeUnavailable,
    GitHubForge,
    LocalForge,
    forge_auth,
    make_forge,
    repository_from_origin,
)
from phasegate.forge.git_remote import FETCHED_PREFIX
from phasegate.forge.github.api import BODY_LIMIT
from phasegate.forge.github.faults import GitHubRefused
from phasegate.forge.github.forge import CHECK_OUTPUT_BYTES, neutralize_closing
from phasegate.git.workspace import Workspace
from phasegate.journal import SideEffects
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store

from conftest import GitHubLab, git, github_repo, new_workflow, scripted_cartridge
from github_forge_kit import REPO, branch_with_change, forge, forge_for, local, posts, settings
from support.github_server import GitHubServer

__all__ = ["forge", "local"]  # fixtures, used by name

# -- issues ---------------------------------------------------------------------------


def test_issue_round_trips_with_its_marker_hidden_and_a_new_forge_finds_it(
    github: GitHubLab, forge: GitHubForge
) -> None:
    number = forge.create_issue("Add x", "Please add x.", "phasegate:workflow:w1")
    # a restarted process: a new forge, which the journal asks before it repeats
    assert forge_for(github, forge.repo).find_issue("phasegate:workflow:w1") == number
    assert forge.find_issue("phasegate:workflow:other") is None
    issue = forge.issue(number)
    assert (issue.title, issue.body, issue.state) == ("Add x", "Please add x.", "open")
    assert issue.author == "phasegate-bot"
    forge.close_issue(number)
    assert forge.issue(number).state == "closed"
    assert github.server.counts(REPO)["issues"] == 1


def held_until(github: GitHubLab, kind: str, timeout_s: float = 30) -> None:
    """Wait until the fake GitHub holds one of ``kind`` (issues, pulls): a delayed
    request the client gave up on has been handled by then."""
    deadline = time.monotonic() + timeout_s
    while github.server.counts(REPO)[kind] < 1:
        assert time.monotonic() < deadline, f"GitHub never finished the delayed {kind}"
        time.sleep(0.02)


def test_the_journal_finds_an_issue_and_pr_whose_answers_timed_out_instead_of_repeating(
    github: GitHubLab, forge: GitHubForge, local: Path, tmp_path: Path
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    workflow = new_workflow(store)
    # The calls that time out go through a forge that gives up after 0.5 s; the rest
    # (the push, the resumed calls: a restarted worker's) through a patient one, so
    # a loaded machine's slow answer fails no call meant to succeed.
    impatient = SideEffects(
        store, forge_for(github, local, timeout_s=0.5), Workspace(), workflow, local
    )
    effects = SideEffects(store, forge_for(github, local), Workspace(), workflow, local)
    github.server.delay("POST", r"/issues$", 1.0)
    with pytest.raises(ForgeUnavailable):
        impatient.create_issue("preparation", "Add x", "body")
    branch_with_change(local, "phasegate/w")
    effects.push_branch("development", "phasegate/w", git(local, "rev-parse", "phasegate/w"))
    held_until(github, "issues")  # GitHub finishes the issue the client gave up on
    number = effects.create_issue("preparation", "Add x", "body")  # resume: looks first
    github.server.delay("POST", r"/pulls$", 1.0)
    with pytest.raises(ForgeUnavailable):
        impatient.open_pull_request(
            "pr_review", "phasegate/w", "main", "t", f"Implements #{number}"
        )
    held_until(github, "pulls")
    pr = effects.open_pull_request("pr_review", "phasegate/w", "main", "t", f"Implements #{number}")
    assert forge.pull_request(pr).head == "phasegate/w"
    assert (github.server.counts(REPO)["issues"], github.server.counts(REPO)["pulls"]) == (1, 1)
    assert len(posts(github, "/issues")) == 1 and len(posts(github, "/pulls")) == 1


def test_an_epics_piece_is_filed_once_as_a_sub_issue_of_its_parent(
    github: GitHubLab, forge: GitHubForge, local: Path, tmp_path: Path
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    effects = SideEffects(store, forge, Workspace(), new_workflow(store), local)
    parent = effects.create_issue("preparation", "The epic", "all of it")
    piece = effects.file_ticket("planning", "piece1", "The parser", f"Part of #{parent}.")
    assert forge.parent_issue(piece) is None  # GitHub's 404: no parent yet
    assert effects.link_sub_issue("planning", "piece1", parent, piece)
    assert forge_for(github, local).parent_issue(piece) == parent
    # again (a restarted phase): the journal's record, nothing sent twice
    assert effects.file_ticket("planning", "piece1", "The parser", "again") == piece
    assert effects.link_sub_issue("planning", "piece1", parent, piece)
    assert len(posts(github, "/sub_issues")) == 1
    assert github.server.counts(REPO)["issues"] == 2
    store.close()


def test_status_label_is_created_once_and_replaces_the_other_status_labels(
    github: GitHubLab, forge: GitHubForge
) -> None:
    number = forge.create_issue("t", "b", "phasegate:workflow:w1")
    github.server.label(REPO, number, "bug", "maya")
    forge.set_status_label(number, "phasegate:planning")
    forge.set_status_label(number, "phasegate:development")
    assert set(forge.issue(number).labels) == {"bug", "phasegate:development"}
    forge.set_status_label(number, None)
    assert forge.issue(number).labels == ("bug",)
    assert len(posts(github, "/labels")) == 2 + 2  # two labels made, each added once
    with pytest.raises(ForgeError, match="no status label"):
        forge.set_status_label(number, "planning")


def test_labelled_issues_say_who_labelled_last_and_skip_pull_requests(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    first = github.server.open_issue(REPO, "one", "text", "stranger").number
    second = github.server.open_issue(REPO, "two", "text", "stranger").number
    github.server.label(REPO, first, "phasegate", "rex")
    github.server.unlabel(REPO, first, "phasegate", "rex")
    github.server.label(REPO, first, "phasegate", "maya")
    github.server.label(REPO, second, "phasegate", "rex")
    github.server.open_issue(REPO, "closed one", "", "maya", labels=["phasegate"])
    github.server.edit_issue(REPO, 3, "maya", state="closed")
    branch_with_change(local, "feature")
    forge.publish_branch("feature")
    pr = forge.create_pull_request("feature", "main", "PR", "body")
    github.server.label(REPO, pr, "phasegate", "maya")
    found = {x.issue.number: x.by for x in forge.labelled_issues("phasegate")}
    assert found == {first: "maya", second: "rex"}


def test_permission_is_githubs_role_and_none_for_strangers(forge: GitHubForge) -> None:
    assert forge.permission("maya") == "maintain"
    assert forge.permission("rex") == "read"
    assert forge.permission("octo") == "admin"
    assert forge.permission("nobody-at-all") == "none"


# -- comments -------------------------------------------------------------------------


def test_comment_round_trips_and_a_repeat_finds_it(github: GitHubLab, forge: GitHubForge) -> None:
    number = forge.create_issue("t", "b", "phasegate:workflow:w1")
    cid = forge.comment(number, "Report.\n\n<!-- phasegate:w1:report -->", "phasegate:w1:report")
    assert forge.find_comment(number, "phasegate:w1:report") == cid
    assert forge.find_comment(number, "phasegate:w1:other") is None
    other = forge.comment(number, "no marker in the text", "phasegate:w1:plain")
    assert forge.find_comment(number, "phasegate:w1:plain") == other
    assert github.server.counts(REPO)["comments"] == 2


def test_a_body_longer_than_github_takes_is_cut_keeping_its_marker(
    github: GitHubLab, forge: GitHubForge
) -> None:
    number = forge.create_issue("t", "x" * 70_000, "phasegate:workflow:w1")
    assert forge.find_issue("phasegate:workflow:w1") == number
    report = "y" * 70_000 + "\n\n<!-- phasegate:w1:report -->"
    cid = forge.comment(number, report, "phasegate:w1:report")
    assert forge.find_comment(number, "phasegate:w1:report") == cid
    sent = [r.body["body"] for r in github.server.requests if r.method == "POST" and r.body]
    assert len(sent) == 2
    assert all(len(body) <= BODY_LIMIT and "characters were more" in body for body in sent)


def test_comments_merge_conversation_reviews_and_inline_oldest_first_without_phasegates(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    branch_with_change(local, "feature")
    forge.publish_branch("feature")
    pr = forge.create_pull_request("feature", "main", "PR", "body")
    t0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
    forge.comment(pr, "phasegate's report", "phasegate:w1:report")
    github.server.comment(REPO, pr, "too early", "maya", at=t0 - timedelta(hours=1))
    github.server.comment(REPO, pr, "please rename x", "maya", at=t0 + timedelta(minutes=1))
    github.server.review(
        REPO,
        pr,
        "maya",
        "COMMENTED",
        "",
        comments=[("app.py", 1, "why 2?")],
        at=t0 + timedelta(minutes=2),
    )
    github.server.review(REPO, pr, "maya", "APPROVED", "", at=t0 + timedelta(minutes=3))
    said = forge.comments(pr, since=t0)
    assert [(c.kind, c.author, c.body) for c in said] == [
        ("conversation", "maya", "please rename x"),
        ("inline", "maya", "why 2?"),
        ("review", "maya", ""),
    ]
    inline = said[1]
    assert (inline.path, inline.line) == ("app.py", 1)
    assert inline.diff_hunk and "+x = 2" in inline.diff_hunk
    assert said[2].review_state == "approved"
    assert all(c.created_at.tzinfo is not None for c in said)
    everything = forge.comments(pr)
    assert [c.body for c in everything][0] == "too early"
    assert not any("report" in c.body for c in everything)
    issue = github.server.open_issue(REPO, "t", "b", "maya").number
    github.server.comment(REPO, issue, "more detail", "maya")
    reviews_asked = len([r for r in github.server.requests if "/reviews" in r.path])
    assert [c.body for c in forge.comments(issue)] == ["more detail"]
    assert len([r for r in github.server.requests if "/reviews" in r.path]) == reviews_asked


# -- branches, pull requests, merges -----------------------------------------------------


def test_pull_request_round_trips_by_head_and_never_says_a_closing_keyword(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    issue = forge.create_issue("t", "b", "phasegate:workflow:w1")
    sha = branch_with_change(local, "phasegate/w1")
    forge.publish_branch("phasegate/w1")
    assert github.server.repo(REPO).git.git("rev-parse", "refs/heads/phasegate/w1").strip() == sha
    number = forge.create_pull_request("phasegate/w1", "main", "Add x", f"Fixes #{issue}.")
    assert forge.find_pull_request("phasegate/w1") == number
    assert forge.find_pull_request("elsewhere") is None
    pr = forge.pull_request(number)
    assert (pr.head, pr.base, pr.state, pr.head_sha) == ("phasegate/w1", "main", "open", sha)
    assert pr.body == f"Implements #{issue}."
    forge.update_pull_request(number, f"Closes: #{issue} and resolves octo/app#{issue}")
    assert (
        forge.pull_request(number).body == f"Implements: #{issue} and Implements octo/app#{issue}"
    )
    merged = forge.merge_pull_request(number, f"Merge: fixes #{issue}\n\nResolved #{issue}")
    assert forge.issue(issue).state == "open"  # merging closed nothing: verification will
    after = forge.pull_request(number)
    assert (after.state, after.merge_sha, after.merged_by) == ("merged", merged, "phasegate-bot")
    assert git(local, "cat-file", "-t", merged) == "commit"
    assert git(local, "rev-parse", f"{FETCHED_PREFIX}main") == merged


def test_a_repeated_merge_returns_the_first_merge_and_find_merge_sees_it(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    branch_with_change(local, "feature")
    forge.publish_branch("feature")
    number = forge.create_pull_request("feature", "main", "t", "b")
    assert forge.find_merge(number) is None
    sha = forge.merge_pull_request(number, "merge it")
    assert forge.merge_pull_request(number, "merge it") == sha
    assert forge_for(github, local).find_merge(number) == sha
    assert github.server.counts(REPO)["merges"] == 1


def test_a_merge_github_refuses_says_githubs_status_and_message(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    branch_with_change(local, "one", "x = 'one'\n")
    branch_with_change(local, "two", "x = 'two'\n")
    forge.publish_branch("one")
    forge.publish_branch("two")
    first = forge.create_pull_request("one", "main", "one", "b")
    second = forge.create_pull_request("two", "main", "two", "b")
    forge.merge_pull_request(first, "one")
    with pytest.raises(GitHubRefused) as conflict:  # the same line: a real conflict
        forge.merge_pull_request(second, "two")
    assert conflict.value.status == 405 and "not mergeable" in str(conflict.value)
    github.server.fail("PUT", r"/merge$", 409, body={"message": "Head branch was modified."})
    third = forge.create_pull_request("two", "one", "onto one", "b")
    with pytest.raises(GitHubRefused, match="Head branch was modified") as moved:
        forge.merge_pull_request(third, "m")
    assert moved.value.status == 409
    assert forge.pull_request(second).state == "open"
    assert github.server.counts(REPO)["merges"] == 1


def test_squash_merge_uses_the_cartridges_method(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    squash = forge_for(github, local, merge_method="squash")
    branch_with_change(local, "feature")
    squash.publish_branch("feature")
    number = squash.create_pull_request("feature", "main", "t", "b")
    sha = squash.merge_pull_request(number, "Squashed\n\nbody")
    parents = git(local, "rev-list", "--parents", "-n", "1", sha).split()
    assert len(parents) == 2  # the commit and its one parent: a squash, not a merge
    puts = [r for r in github.server.requests if r.method == "PUT"]
    assert puts[-1].body["merge_method"] == "squash"


def test_checks_read_check_runs_and_statuses_capping_output(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    sha = branch_with_change(local, "feature")
    forge.publish_branch("feature")
    github.server.check_run(
        REPO, sha, "tests", "completed", "failure", title="2 failed", summary="boom " * 4000
    )
    github.server.check_run(REPO, sha, "lint", "in_progress")
    github.server.check_run(REPO, sha, "docs", "completed", "skipped")
    github.server.status(REPO, sha, "ci/legacy", "error", "octo", description="exploded")
    found = {c.name: c for c in forge.checks(sha)}
    assert {n: c.state for n, c in found.items()} == {
        "tests": "failure",
        "lint": "pending",
        "docs": "success",
        "ci/legacy": "failure",
    }
    assert found["tests"].output.startswith("2 failed\n\nboom")
    assert len(found["tests"].output.encode()) <= CHECK_OUTPUT_BYTES
    assert found["ci/legacy"].output == "exploded"
    assert forge.checks(git(local, "rev-parse", "main")) == []


# -- the token: nowhere but the askpass variable -------------------------------------------


def test_push_sends_the_token_through_askpass_only(
    github: GitHubLab,
    forge: GitHubForge,
    local: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a git first on PATH that records every argv and environment it runs with
    log_file = tmp_path / "git-argv.log"
    wrapper = tmp_path / "bin" / "git"
    wrapper.parent.mkdir()
    real = subprocess.run(["which", "git"], capture_output=True, text=True).stdout.strip()
    wrapper.write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {log_file}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    caplog.set_level(logging.DEBUG)
    branch_with_change(local, "feature")
    forge.publish_branch("feature")
    pushes = [r for r in github.server.requests if r.path.endswith("git-receive-pack")]
    assert pushes and all(r.login == "phasegate-bot" for r in pushes)
    assert github.bot.token not in log_file.read_text()  # no argv held it
    assert "feature" in log_file.read_text()
    assert github.bot.token not in (local / ".git" / "config").read_text()
    assert git(local, "remote") == ""  # no remote was added with a URL
    assert github.bot.token not in caplog.text
    assert github.bot.token not in "".join(str(r) for r in github.server.requests)


def test_no_text_sent_holds_the_token_or_a_secret(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    secret = "sk-model-key-0123456789"
    careful = GitHubForge(
        REPO,
        ForgeAuth.from_token(github.bot.token, "GITHUB_TOKEN"),
        local,
        Workspace(),
        settings(github.api_url),
        [secret],
    )
    leak = f"token {github.bot.token} key {secret}"
    number = careful.create_issue(f"title {leak}", f"body {leak}", "phasegate:workflow:w1")
    careful.comment(number, f"report {leak}", "phasegate:w1:report")
    branch_with_change(local, "feature")
    careful.publish_branch("feature")
    pr = careful.create_pull_request(
        "feature", "main", f"PR {leak}", f"Implements #{number}. {leak}"
    )
    careful.update_pull_request(pr, f"again {leak}")
    careful.merge_pull_request(pr, f"merge {leak}\n\n{leak}")
    sent = repr([r.body for r in github.server.requests])
    assert "***" in sent
    assert github.bot.token not in sent and secret not in sent
    merged = git(github.server.bare_path(REPO), "log", "--format=%B", "main")
    assert github.bot.token not in merged and secret not in merged


def test_fetch_branch_brings_githubs_branch_or_says_none(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    sha = branch_with_change(local, "survivor")
    forge.publish_branch("survivor")
    git(local, "branch", "-D", "survivor")
    assert forge.fetch_branch("survivor") == sha
    assert git(local, "rev-parse", f"{FETCHED_PREFIX}survivor") == sha
    assert forge.fetch_branch("never-pushed") is None


def test_a_refused_push_names_the_token_and_never_shows_it(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    github.server.add_user("reader", "ghp_READER0123456789abcdefREADER")
    github.server.grant(REPO, "reader", "read")
    reader = forge_for(github, local, token="ghp_READER0123456789abcdefREADER")
    branch_with_change(local, "feature")
    with pytest.raises(ForgeError) as raised:
        reader.publish_branch("feature")
    assert "ghp_READER" not in str(raised.value)
    assert "git push" in str(raised.value)


# -- auth and the repository --------------------------------------------------------------


def test_github_app_mints_installation_tokens_through_the_fake(
    github: GitHubLab, forge: GitHubForge, local: Path, tmp_path: Path
) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    github.server.add_app(77, public, 7001, slug="phasegate", owner="octo")
    (local / "app.pem").write_text(pem)
    # Through Prism: the bot's URLs are percent-encoded (…/users/phasegate%5Bbot%5D)
    # as GitHub writes them; a raw "[bot]" is no uri, and the schema says so.
    app_settings = settings(github.api_url, app_id=77, private_key_file="app.pem")
    auth = forge_auth(app_settings, local, REPO, environ={})
    app = GitHubForge(REPO, auth, local, Workspace(), app_settings)
    number = app.create_issue("from the app", "b", "phasegate:workflow:app")
    assert app.issue(number).author == "phasegate[bot]"
    shown = github.server.shapes.user(github.server.user("phasegate[bot]"))
    assert shown["url"].endswith("/users/phasegate%5Bbot%5D")
    assert shown["html_url"].endswith("/apps/phasegate")
    assert app.find_issue("phasegate:workflow:app") == number
    branch_with_change(local, "app-branch")
    app.publish_branch("app-branch")
    minted = posts(github, "/access_tokens")
    assert minted and all(r.status == 201 for r in minted)
    pushes = [r for r in github.server.requests if r.path.endswith("git-receive-pack")]
    assert pushes[-1].login == "phasegate[bot]"
    # the same App on another GitHub: its tokens are that GitHub's, none reused
    with GitHubServer(tmp_path / "other") as other:
        other.create_repo("octo", "app", from_path=local)
        other.add_app(77, public, 7001, slug="phasegate", owner="octo")
        elsewhere = settings(other.url, app_id=77, private_key_file="app.pem")
        auth = forge_auth(elsewhere, local, REPO, environ={})
        there = GitHubForge(REPO, auth, local, Workspace(), elsewhere)
        assert there.create_issue("there", "b", "phasegate:workflow:app") == 1


def test_make_forge_picks_the_cartridges_forge(
    github: GitHubLab, forge: GitHubForge, local: Path, tmp_path: Path
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    cartridge = Cartridge.model_validate({})
    assert isinstance(make_forge(cartridge, local, store, Workspace(), []), LocalForge)
    git(local, "remote", "add", "origin", f"{github.server.url}/git/{REPO}.git")
    on_github = cartridge.model_copy(
        update={"forge": ForgeSettings(kind="github", base_url=github.api_url, token_env="PG_GH")}
    )
    made = make_forge(on_github, local, store, Workspace(), [], environ={"PG_GH": github.bot.token})
    assert isinstance(made, GitHubForge) and made.repository == REPO
    assert made.permission("maya") == "maintain"


def test_a_missing_token_variable_is_named(local: Path) -> None:
    with pytest.raises(ForgeAuthError, match="MY_GH_TOKEN is not set"):
        forge_auth(settings("http://127.0.0.1:9", token_env="MY_GH_TOKEN"), local, REPO, environ={})


@pytest.mark.parametrize(
    ("url", "base_url"),
    [
        ("https://github.com/octo/app.git", None),
        ("https://github.com/octo/app", "https://api.github.com"),
        ("git@github.com:octo/app.git", None),
        ("ssh://git@GHE.example.com:2222/octo/app.git", "https://ghe.example.com/api/v3"),
        ("http://127.0.0.1:8080/git/octo/app.git", "http://127.0.0.1:9/api"),
    ],
)
def test_repository_comes_from_the_origin_remote_on_the_apis_host(
    local: Path, url: str, base_url: str | None
) -> None:
    git(local, "remote", "add", "origin", url)
    assert repository_from_origin(local, base_url) == "octo/app"


@pytest.mark.parametrize(
    ("url", "base_url", "host"),
    [
        ("git@ghe.corp.example:octo/app.git", None, "ghe.corp.example"),
        ("https://gitlab.com/octo/app.git", None, "gitlab.com"),
        ("https://github.com/octo/app.git", "https://ghe.corp.example/api/v3", "github.com"),
        ("ssh://git@gitlab.com/octo/app.git", "https://ghe.corp.example/api/v3", "gitlab.com"),
    ],
)
def test_an_origin_on_another_host_than_the_apis_is_refused_naming_it(
    local: Path, url: str, base_url: str | None, host: str
) -> None:
    git(local, "remote", "add", "origin", url)
    with pytest.raises(ForgeError, match=f"is on {host}") as refused:
        repository_from_origin(local, base_url)
    assert f'forge.base_url = "https://{host}/api/v3"' in str(refused.value)
    assert "forge.repository" in str(refused.value)


def test_make_forge_refuses_a_gitlab_origin_before_any_token_is_read(
    local: Path, tmp_path: Path
) -> None:
    git(local, "remote", "add", "origin", "https://gitlab.com/octo/app.git")
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    cartridge = Cartridge.model_validate({"forge": {"kind": "github"}})
    with pytest.raises(ForgeError, match="gitlab.com"):
        make_forge(cartridge, local, store, Workspace(), [], environ={"GITHUB_TOKEN": "t"})
    store.close()


def test_a_repository_with_a_git_suffix_is_refused_naming_the_key() -> None:
    with pytest.raises(ValueError, match=r"forge.repository: 'octo/widgets.git' ends in .git"):
        ForgeSettings(kind="github", repository="octo/widgets.git")
    assert (
        ForgeSettings(kind="github", repository="octo/widgets.js").repository == "octo/widgets.js"
    )


def test_no_origin_names_forge_repository(local: Path) -> None:
    with pytest.raises(ForgeError, match="forge.repository"):
        repository_from_origin(local)


def test_closing_keywords_become_implements() -> None:
    text = "Closes #1, fixed: #2, RESOLVES o/r#3, fix https://github.com/o/r/issues/4; fixes bugs"
    assert neutralize_closing(text) == (
        "Implements #1, Implements: #2, Implements o/r#3, "
        "Implements https://github.com/o/r/issues/4; fixes bugs"
    )


# -- credentials refused during a workflow --------------------------------------------------

WORKFLOW_ANSWERS = """
[[plan]]
text = "1. Write feature.txt"
[[plan_review]]
text = "VERDICT: approve"
[[review]]
text = "VERDICT: approve"
[[verification]]
text = "feature.txt is on the merge commit.\\nVERDICT: confirmed"
"""


def test_a_404_or_a_revoked_token_in_wait_pauses_and_resume_completes_once(
    github: GitHubLab, tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    build = {"build": 'runner = "command"\ncommand = "echo feature > feature.txt; echo built"\n'}
    repo = github_repo(
        github,
        tmp_path / "repo",
        scripted_cartridge(role_overrides=build, auto_merge=False),
        {"README.md": "# w\n", ".gitignore": ".phasegate/\n", "answers.toml": WORKFLOW_ANSWERS},
    )
    engine, _ = engine_for(repo)
    gh, name, bot = github.server, github.repository, github.bot
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    gh.comment(name, row["pr_number"], "/phasegate merge", by="olga")
    gh.fail("GET", rf"/repos/{name}/", 404, times=1)  # GitHub lost sight of something
    row = engine.advance(workflow_id)
    assert row["status"] == "paused", row["error"]
    assert row["error"].startswith("forge_not_found: wait: ")
    engine.decide(workflow_id, decisions.resume)
    with gh.lock:  # the token is revoked on GitHub: every call is 401
        revoked = gh.tokens.pop(bot.token)
    row = engine.advance(workflow_id)
    assert row["status"] == "paused", row["error"]
    assert row["error"].startswith("forge_auth: wait: ") and "GITHUB_TOKEN" in row["error"]
    with gh.lock:
        gh.tokens[bot.token] = revoked
    engine.decide(workflow_id, decisions.resume)
    row = engine.advance(workflow_id)
    assert row["status"] == "completed", row["error"]
    counts = gh.counts(name)
    assert (counts["issues"], counts["pulls"], counts["merges"]) == (1, 1, 1)


def test_the_bases_required_checks_are_read_from_its_protection_once_per_while(
    github: GitHubLab, forge: GitHubForge, local: Path
) -> None:
    github.server.protect(REPO, "main", ["tests", "phasegate"])
    assert forge.required_checks("main") == ["phasegate", "tests"]
    assert forge.required_checks("main") == ["phasegate", "tests"]  # kept: asked once
    asked = [r for r in github.server.requests if r.path.endswith("/branches/main")]
    assert len(asked) == 1
    branch_with_change(local, "feature")
    forge.publish_branch("feature")
    assert forge.required_checks("feature") == []  # not protected
    assert forge.required_checks("gone") == []  # no such branch: nothing to honour


def test_phasegates_own_status_is_posted_and_a_token_that_may_not_is_logged_once(
    github: GitHubLab, forge: GitHubForge, local: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sha = branch_with_change(local, "feature")
    forge.publish_branch("feature")
    forge.set_commit_status(sha, "pending", "x" * 300)  # cut to GitHub's 140 characters
    forge.set_commit_status(sha, "success", "reviewed and checked by phasegate")
    [own] = [c for c in forge.checks(sha) if c.name == "phasegate"]
    assert (own.state, own.output) == ("success", "reviewed and checked by phasegate")

    reader = forge_for(github, local, token=github.people["rex"].token)
    reader.set_commit_status(sha, "failure", "no")
    reader.set_commit_status(sha, "failure", "no")
    refused = [r for r in caplog.records if "own commit status is not posted" in r.message]
    assert len(refused) == 1 and len(posts(github, f"/statuses/{sha}")) == 3
    assert [c.state for c in forge.checks(sha) if c.name == "phasegate"] == ["success"]


def test_a_get_asked_again_carries_its_etag_and_a_304_costs_no_rate_limit(
    github: GitHubLab, forge: GitHubForge
) -> None:
    number = forge.create_issue("t", "b", "phasegate:etag")
    github.server.comment(REPO, number, "first", by="maya")
    first = forge.comments(number)
    asked = len(github.server.requests)
    again = forge.comments(number)
    looks = [r for r in github.server.requests[asked:] if r.path.endswith("/comments")]
    assert again == first and [r.status for r in looks] == [304]
    remaining = github.server.rate_headers("phasegate-bot", counted=False)
    github.server.comment(REPO, number, "second", by="maya")
    assert [c.body for c in forge.comments(number)] == ["first", "second"]  # never stale
    after = github.server.rate_headers("phasegate-bot", counted=False)
    used = int(after["x-ratelimit-used"]) - int(remaining["x-ratelimit-used"])
    assert used == 1  # the changed answer counted, the 304 before it did not
