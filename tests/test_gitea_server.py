"""The fake Gitea answers like Gitea: shapes, status codes, refusals, roles, real git.

Each operation phasegate's Gitea forge will use is driven with httpx as a
Gitea client sends it (``Authorization: token T``, JSON bodies), and git goes
over smart HTTP with the token as password; merges land on the bare
repository. Every exchange is held to Gitea's official description
(support.gitea_description): one that broke it would fail the test.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from phasegate.integrations.webhooks import concerns, verify

from support.fake_hooks import receiving_hooks
from support.fake_http import served_by_hand
from support.gitea_description import Description
from support.gitea_lab import BOT, REPO, Lab, ok, served
from support.github_git import git_env

R = f"/repos/{REPO}"


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    with served(tmp_path) as made:
        yield made


def label_id(lab: Lab, name: str, color: str = "#00aabb") -> int:
    return int(
        ok(lab.client("alice").post(f"{R}/labels", json={"name": name, "color": color}), 201)["id"]
    )


# -- the caller, the repository, permissions ----------------------------------------------------


def test_tokens_authenticate_and_unknown_ones_get_401(lab: Lab) -> None:
    me = ok(lab.client("dev").get("/user"))
    assert (me["login"], me["email"], me["username"]) == ("dev", "dev@example.com", "dev")
    bearer = lab.opened({"Authorization": f"Bearer {lab.token('dev')}"})
    assert ok(bearer.get("/user"))["id"] == me["id"]
    basic = httpx.get(f"{lab.gitea.url}/api/v1/user", auth=("dev", lab.token("dev")))
    assert basic.json()["login"] == "dev"
    assert ok(lab.client("guest").get("/version")) == {"version": "1.27.3"}
    none = httpx.get(f"{lab.gitea.url}/api/v1/user")
    assert (none.status_code, none.json()["message"]) == (401, "token is required")
    wrong = httpx.get(f"{lab.gitea.url}/api/v1/user", headers={"Authorization": "token nope"})
    assert (wrong.status_code, wrong.json()["message"]) == (
        401, "invalid username, password or token",
    )  # fmt: skip


def test_private_repository_is_404_to_strangers_and_permissions_by_role(lab: Lab) -> None:
    got = ok(lab.client("dev").get(R))
    assert (got["full_name"], got["default_branch"], got["private"]) == (REPO, "main", True)
    assert got["clone_url"] == f"{lab.gitea.url}/{REPO}.git"
    assert got["permissions"] == {"admin": False, "push": True, "pull": True}
    assert ok(lab.client("guest").get(R))["permissions"]["push"] is False
    hidden = lab.client("stranger").get(R)
    assert (hidden.status_code, hidden.json()["message"]) == (404, "The target couldn't be found.")
    alice = lab.client("alice")
    modes = {
        name: ok(alice.get(f"{R}/collaborators/{name}/permission"))["permission"]
        for name in ("alice", "dev", "guest", "stranger", BOT)
    }
    assert modes == {"alice": "owner", "dev": "write", "guest": "read", "stranger": "none",
                     BOT: "write"}  # fmt: skip
    # As on Gitea, a write collaborator may ask for its own permission only.
    bot = lab.client(BOT)
    assert ok(bot.get(f"{R}/collaborators/{BOT}/permission"))["role_name"] == "write"
    other = bot.get(f"{R}/collaborators/dev/permission")
    assert other.status_code == 403 and "repo admins can query" in other.json()["message"]
    lab.gitea.add_collaborator(REPO, BOT, "admin")
    assert ok(bot.get(f"{R}/collaborators/dev/permission"))["permission"] == "write"
    names = [u["login"] for u in ok(alice.get(f"{R}/collaborators"))]
    assert sorted(names) == sorted(["dev", "guest", BOT])


# -- issues, labels, comments, timeline ----------------------------------------------------------


def test_issues_number_per_repository_take_labels_by_id_and_close(lab: Lab) -> None:
    agent = label_id(lab, "agent")
    dev = lab.client("dev")
    first = ok(
        dev.post(f"{R}/issues", json={"title": "One", "body": "do it", "labels": [agent]}), 201
    )
    assert (first["number"], first["state"], first["user"]["login"]) == (1, "open", "dev")
    assert [lb["name"] for lb in first["labels"]] == ["agent"]
    assert first["html_url"] == f"{lab.gitea.url}/{REPO}/issues/1"
    assert first["pull_request"] is None
    # A reader files issues, but the labels it names are dropped, as on Gitea.
    second = ok(
        lab.client("guest").post(f"{R}/issues", json={"title": "Two", "labels": [agent]}), 201
    )
    assert (second["number"], second["labels"]) == (2, [])
    missing = dev.post(f"{R}/issues", json={"body": "no title"})
    assert missing.status_code == 422
    assert [v.rpartition(": ")[2] for v in lab.refused()] == ["CreateIssueOption requires title"]
    closed = ok(dev.patch(f"{R}/issues/1", json={"state": "closed"}), 201)
    assert closed["state"] == "closed" and closed["closed_at"]
    assert [i["number"] for i in ok(dev.get(f"{R}/issues"))] == [2]
    every = ok(dev.get(f"{R}/issues", params={"state": "all", "labels": "agent"}))
    assert [i["number"] for i in every] == [1]
    refused = lab.client("guest").patch(f"{R}/issues/1", json={"state": "open"})
    assert refused.status_code == 403
    assert dev.get(f"{R}/issues/99").status_code == 404


def test_issue_lists_page_filter_pulls_out_and_since(lab: Lab) -> None:
    clock = [lab.gitea.clock()]
    lab.gitea.clock = lambda: clock[0]
    for n in range(4):
        clock[0] += timedelta(minutes=1)
        lab.gitea.open_issue(REPO, "alice", f"issue {n}")
    lab.push_branch("dev", "feat", {"f.txt": "f\n"})
    lab.gitea.open_pull(REPO, "dev", "feat", "main", "A pull")
    dev = lab.client("dev")
    assert len(ok(dev.get(f"{R}/issues"))) == 5  # pulls are issues too, unless asked
    only = ok(dev.get(f"{R}/issues", params={"type": "issues"}))
    assert [i["number"] for i in only] == [4, 3, 2, 1]
    page = dev.get(f"{R}/issues", params={"type": "issues", "limit": 3, "page": 1})
    assert page.headers["x-total-count"] == "4" and 'rel="next"' in page.headers["link"]
    since = (lab.gitea.repo(REPO).issues[3].updated_at).strftime("%Y-%m-%dT%H:%M:%SZ")
    recent = ok(dev.get(f"{R}/issues", params={"type": "issues", "since": since}))
    assert [i["number"] for i in recent] == [4, 3]


def test_labels_put_post_delete_and_the_timeline_says_who(lab: Lab) -> None:
    bug, agent = label_id(lab, "bug"), label_id(lab, "agent")
    lab.gitea.open_issue(REPO, "guest", "Labelled")
    bot = lab.client(BOT)
    added = ok(bot.post(f"{R}/issues/1/labels", json={"labels": [agent]}))
    assert [lb["name"] for lb in added] == ["agent"]
    by_name = ok(lab.client("alice").post(f"{R}/issues/1/labels", json={"labels": ["bug"]}))
    assert [lb["id"] for lb in by_name] == [agent, bug]
    replaced = ok(bot.put(f"{R}/issues/1/labels", json={"labels": [bug]}))
    assert [lb["name"] for lb in replaced] == ["bug"]
    assert (
        lab.client("guest").post(f"{R}/issues/1/labels", json={"labels": [agent]}).status_code
        == 403
    )
    timeline = ok(bot.get(f"{R}/issues/1/timeline"))
    events = [(e["type"], e["user"]["login"], e["label"]["name"], e["body"]) for e in timeline]
    assert events == [
        ("label", BOT, "agent", "1"),
        ("label", "alice", "bug", "1"),
        ("label", BOT, "agent", ""),
    ]
    assert bot.delete(f"{R}/issues/1/labels/{bug}").status_code == 204
    assert ok(bot.get(f"{R}/issues/1/labels")) == []
    ok(bot.put(f"{R}/issues/1/labels", json={"labels": [bug, agent]}))
    assert bot.delete(f"{R}/issues/1/labels").status_code == 204
    assert ok(bot.get(f"{R}/issues/1"))["labels"] == []
    listed = ok(bot.get(f"{R}/labels"))
    assert [(lb["name"], lb["color"]) for lb in listed] == [("bug", "00aabb"), ("agent", "00aabb")]


def test_comments_and_their_place_in_the_timeline(lab: Lab) -> None:
    lab.gitea.open_issue(REPO, "alice", "Talk")
    guest = lab.client("guest")
    said = ok(guest.post(f"{R}/issues/1/comments", json={"body": "/phasegate go"}), 201)
    assert (said["body"], said["user"]["login"]) == ("/phasegate go", "guest")
    assert said["issue_url"] == f"{lab.gitea.url}/{REPO}/issues/1"
    lab.gitea.label(REPO, "alice", 1, "agent")
    assert [c["body"] for c in ok(guest.get(f"{R}/issues/1/comments"))] == ["/phasegate go"]
    kinds = [e["type"] for e in ok(guest.get(f"{R}/issues/1/timeline"))]
    assert kinds == ["comment", "label"]
    assert ok(guest.get(f"{R}/issues/1"))["comments"] == 1
    assert guest.post(f"{R}/issues/1/comments", json={}).status_code == 422
    assert "CreateIssueCommentOption requires body" in lab.refused()[0]


# -- pull requests, reviews, statuses, protection, merges -----------------------------------------


def open_pull(
    lab: Lab, branch: str, files: dict[str, str], title: str = "Change"
) -> dict[str, Any]:
    lab.push_branch("dev", branch, files)
    body = {"head": branch, "base": "main", "title": title, "body": "Closes #1"}
    return ok(lab.client(BOT).post(f"{R}/pulls", json=body), 201)


def test_pulls_open_find_edit_and_refuse_twins(lab: Lab) -> None:
    lab.gitea.open_issue(REPO, "alice", "an issue first: pulls share the numbers")
    pull = open_pull(lab, "agent/1", {"app.py": "print('hi')\n"})
    head = lab.repo.bare.branch_sha("agent/1")
    assert (pull["number"], pull["state"], pull["mergeable"], pull["merged"]) == (
        2,
        "open",
        True,
        False,
    )
    assert (pull["head"]["ref"], pull["head"]["sha"], pull["base"]["ref"]) == (
        "agent/1",
        head,
        "main",
    )
    assert (pull["additions"], pull["changed_files"]) == (1, 1)
    bot = lab.client(BOT)
    assert ok(bot.get(f"{R}/pulls/main/agent/1"))["number"] == 2
    assert bot.get(f"{R}/pulls/main/agent/none").status_code == 404
    assert [p["number"] for p in ok(bot.get(f"{R}/pulls"))] == [2]
    assert ok(bot.get(f"{R}/issues/2"))["pull_request"]["merged"] is False
    twin = bot.post(f"{R}/pulls", json={"head": "agent/1", "base": "main", "title": "again"})
    assert twin.status_code == 409 and "already exists" in twin.json()["message"]
    nothing = bot.post(f"{R}/pulls", json={"head": "main", "base": "main", "title": "same"})
    assert nothing.status_code == 422
    edited = ok(bot.patch(f"{R}/pulls/2", json={"title": "Better", "body": "Closes #1 now"}), 201)
    assert (edited["title"], edited["body"]) == ("Better", "Closes #1 now")
    closed = ok(bot.patch(f"{R}/pulls/2", json={"state": "closed"}), 201)
    assert closed["state"] == "closed" and closed["mergeable"] is False
    assert ok(bot.get(f"{R}/pulls", params={"state": "closed"}))[0]["number"] == 2


def test_reviews_carry_line_comments_with_path_and_position(lab: Lab) -> None:
    open_pull(lab, "feat", {"app.py": "a = 1\nb = 2\n"})
    alice = lab.client("alice")
    review = ok(alice.post(f"{R}/pulls/1/reviews", json={
        "event": "REQUEST_CHANGES", "body": "not yet",
        "comments": [{"path": "app.py", "new_position": 2, "body": "b should be 3"}],
    }))  # fmt: skip
    assert (review["state"], review["user"]["login"], review["comments_count"]) == (
        "REQUEST_CHANGES", "alice", 1,
    )  # fmt: skip
    assert review["official"] is True
    lab.gitea.line_comment(REPO, 1, "guest", "app.py", 1, "a is fine")
    reviews = ok(alice.get(f"{R}/pulls/1/reviews"))
    assert [(r["user"]["login"], r["state"]) for r in reviews] == [
        ("alice", "REQUEST_CHANGES"), ("guest", "COMMENT"),
    ]  # fmt: skip
    comments = ok(alice.get(f"{R}/pulls/1/reviews/{review['id']}/comments"))
    line = comments[0]
    assert (line["path"], line["position"], line["body"]) == ("app.py", 2, "b should be 3")
    assert line["commit_id"] == lab.repo.bare.branch_sha("feat")
    assert "+b = 2" in line["diff_hunk"]
    own = lab.client("dev").post(f"{R}/pulls/1/reviews", json={"event": "APPROVED"})
    assert own.status_code == 201 or own.status_code == 200  # dev is not the author: the bot is
    mine = lab.client(BOT).post(f"{R}/pulls/1/reviews", json={"event": "APPROVED"})
    assert (mine.status_code, mine.json()["message"]) == (
        422,
        "approve your own pull is not allowed",
    )


def test_statuses_one_by_one_and_combined(lab: Lab) -> None:
    pull = open_pull(lab, "ci", {"c.txt": "c\n"})
    head = pull["head"]["sha"]
    bot = lab.client(BOT)
    empty = ok(bot.get(f"{R}/commits/{head}/status"))
    assert (empty["state"], empty["total_count"]) == ("", 0)
    posted = ok(bot.post(f"{R}/statuses/{head}", json={
        "state": "pending", "context": "phasegate/verify", "target_url": "http://ci.example/1",
        "description": "running",
    }), 201)  # fmt: skip
    assert (posted["status"], posted["context"], posted["creator"]["login"]) == (
        "pending", "phasegate/verify", BOT,
    )  # fmt: skip
    ok(
        bot.post(f"{R}/statuses/{head}", json={"state": "success", "context": "phasegate/verify"}),
        201,
    )
    ok(bot.post(f"{R}/statuses/{head}", json={"state": "failure", "context": "lint"}), 201)
    combined = ok(bot.get(f"{R}/commits/ci/status"))
    assert (combined["state"], combined["sha"], combined["total_count"]) == ("failure", head, 2)
    listed = ok(bot.get(f"{R}/commits/{head}/statuses"))
    assert [s["status"] for s in listed] == ["failure", "success", "pending"]
    assert len(ok(bot.get(f"{R}/statuses/{head}"))) == 3
    assert (
        lab.client("guest").post(f"{R}/statuses/{head}", json={"state": "success"}).status_code
        == 403
    )
    bad = bot.post(f"{R}/statuses/{head}", json={"state": "green"})
    assert bad.status_code == 422  # the description refuses it before Gitea would
    assert "must be one of enum values" in lab.refused()[0]


def test_protection_is_admin_only_and_enforced_at_merge(lab: Lab) -> None:
    pull = open_pull(lab, "guarded", {"g.txt": "g\n"})
    head = pull["head"]["sha"]
    rule = {"rule_name": "main", "enable_status_check": True,
            "status_check_contexts": ["phasegate/*"], "required_approvals": 1}  # fmt: skip
    bot, alice = lab.client(BOT), lab.client("alice")
    assert bot.post(f"{R}/branch_protections", json=rule).status_code == 403
    made = ok(alice.post(f"{R}/branch_protections", json=rule), 201)
    assert (made["rule_name"], made["status_check_contexts"], made["enable_push"]) == (
        "main", ["phasegate/*"], False,
    )  # fmt: skip
    assert [p["rule_name"] for p in ok(alice.get(f"{R}/branch_protections"))] == ["main"]
    merge = {"Do": "merge", "head_commit_id": head}
    refused = bot.post(f"{R}/pulls/1/merge", json=merge)
    assert (refused.status_code, refused.json()["message"]) == (
        405, "not allowed to merge [reason: Not all required status checks successful]",
    )  # fmt: skip
    assert (
        ok(bot.get(f"{R}/pulls/1"))["mergeable"] is True
    )  # as on Gitea: no conflict is all it says
    ok(
        bot.post(f"{R}/statuses/{head}", json={"state": "success", "context": "phasegate/verify"}),
        201,
    )
    unapproved = bot.post(f"{R}/pulls/1/merge", json=merge)
    assert (
        unapproved.json()["message"]
        == "not allowed to merge [reason: Does not have enough approvals]"
    )
    ok(alice.post(f"{R}/pulls/1/reviews", json={"event": "APPROVED", "body": "fine"}))
    stale = bot.post(f"{R}/pulls/1/merge", json={"Do": "merge", "head_commit_id": "0" * 40})
    assert (stale.status_code, stale.json()["message"]) == (409, "head out of date")
    assert bot.get(f"{R}/pulls/1/merge").status_code == 404
    done = bot.post(f"{R}/pulls/1/merge", json={**merge, "delete_branch_after_merge": True})
    assert (done.status_code, done.content) == (200, b"")
    assert bot.get(f"{R}/pulls/1/merge").status_code == 204
    merged = ok(bot.get(f"{R}/pulls/1"))
    assert (merged["state"], merged["merged"], merged["merged_by"]["login"]) == (
        "closed",
        True,
        BOT,
    )
    tip = lab.repo.bare.branch_sha("main")
    assert tip is not None and merged["merge_commit_sha"] == tip
    assert lab.repo.bare.git("rev-list", "--parents", "-n1", tip).split()[2] == head
    assert lab.repo.bare.branch_sha("guarded") is None
    again = bot.post(f"{R}/pulls/1/merge", json=merge)
    assert again.status_code == 405
    assert bot.delete(f"{R}/branches/main").status_code == 403


def test_conflicts_refuse_the_merge_and_branches_delete(lab: Lab) -> None:
    lab.push_branch("dev", "one", {"README.md": "one\n"})
    lab.push_branch("alice", "two", {"README.md": "two\n"})
    dev = lab.client("dev")
    for branch in ("one", "two"):
        ok(dev.post(f"{R}/pulls", json={"head": branch, "base": "main", "title": branch}), 201)
    assert dev.post(f"{R}/pulls/1/merge", json={"Do": "squash"}).status_code == 200
    squashed = lab.repo.bare.git("log", "-1", "--format=%P%n%s", "main").split("\n")
    assert len(squashed[0].split()) == 1 and squashed[1] == "one (#1)"
    two = ok(dev.get(f"{R}/pulls/2"))
    assert two["mergeable"] is False
    clash = dev.post(f"{R}/pulls/2/merge", json={"Do": "merge"})
    assert (clash.status_code, clash.json()["message"]) == (405, "Please try again later")
    guest = lab.client("guest")
    assert guest.post(f"{R}/pulls/2/merge", json={"Do": "merge"}).status_code == 405
    assert guest.delete(f"{R}/branches/two").status_code == 403
    assert dev.delete(f"{R}/branches/two").status_code == 204
    assert dev.delete(f"{R}/branches/two").status_code == 404
    assert dev.delete(f"{R}/branches/main").json()["message"] == "can not delete default branch"


# -- git over HTTP --------------------------------------------------------------------------------


def test_git_needs_a_token_and_write_to_push(lab: Lab) -> None:
    anonymous = subprocess.run(
        ["git", "ls-remote", lab.gitea.clone_url(REPO)], env=git_env(), capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    assert anonymous.returncode != 0
    stranger = lab.git("ls-remote", lab.gitea.clone_url(REPO, lab.token("stranger")), check=False)
    assert "not found" in stranger.lower()
    assert "refs/heads/main" in lab.git("ls-remote", lab.gitea.clone_url(REPO, lab.token("guest")))
    with pytest.raises(AssertionError, match="denied"):
        lab.push_branch("guest", "nope", {"x.txt": "x\n"})
    sha = lab.push_branch(BOT, "agent/7", {"x.txt": "x\n"})
    assert lab.repo.bare.branch_sha("agent/7") == sha


# -- faults ---------------------------------------------------------------------------------------


def test_faults_on_demand(lab: Lab) -> None:
    dev = lab.client("dev")
    lab.gitea.fail("GET", r"/user$", 429, headers={"Retry-After": "2"})
    limited = dev.get("/user")
    assert limited.status_code == 429 and limited.headers["retry-after"] == "2"
    assert limited.json()["message"] == "Too Many Requests"
    assert dev.get("/user").status_code == 200
    lab.gitea.fail("POST", r"/issues$", 500, times=2)
    assert dev.post(f"{R}/issues", json={"title": "x"}).status_code == 500
    assert dev.post(f"{R}/issues", json={"title": "x"}).status_code == 500
    assert lab.gitea.repo(REPO).issues == {}  # a planned failure handles nothing
    lab.gitea.delay("POST", r"/issues$", 0.3)
    started = time.monotonic()
    ok(dev.post(f"{R}/issues", json={"title": "slow"}), 201)
    assert time.monotonic() - started >= 0.3
    statuses = [r.status for r in lab.gitea.requests if r.path.endswith("/issues")]
    assert statuses == [500, 500, 201]
    assert all(r.login == "dev" for r in lab.gitea.requests)


def test_started_by_hand() -> None:
    """``python -m support.gitea_server`` serves until told to stop, with a write, a read
    and a stranger beside the owner and the bot, on a public repository."""
    with served_by_hand("support.gitea_server") as out:
        first = out.readline()
        assert first.startswith("fake Gitea at http://127.0.0.1:")
        url = first.split()[3]
        owner_token = out.readline().split()[-1]
        bot_line = out.readline()
        assert bot_line.startswith("phasegate-bot token (admin): ")
        bot_token = bot_line.split()[3]
        answer = httpx.get(
            f"{url}/api/v1/repos/alice/app", headers={"Authorization": f"token {bot_token}"}
        )
        assert answer.json()["permissions"] == {"admin": True, "push": True, "pull": True}
        mine = httpx.get(f"{url}/api/v1/user", headers={"Authorization": f"token {owner_token}"})
        assert mine.json()["login"] == "alice"
        tokens, modes = {}, {}
        for _ in range(3):
            name, _, rest = out.readline().partition(" token (")
            modes[name], _, token = rest.partition("): ")
            tokens[name] = token.strip()
        assert modes == {"dev": "write", "guest": "read", "stranger": "none"}

        def as_(name: str) -> dict[str, str]:
            return {"Authorization": f"token {tokens[name]}"}

        repo = f"{url}/api/v1/repos/alice/app"
        permission = {
            n: httpx.get(f"{repo}/collaborators/{n}/permission",
                         headers={"Authorization": f"token {bot_token}"}).json()["permission"]
            for n in tokens
        }  # fmt: skip
        assert permission == {"dev": "write", "guest": "read", "stranger": "none"}
        opened = httpx.post(f"{repo}/issues", headers=as_("stranger"), json={"title": "Hi"})
        assert opened.status_code == 201  # a public repository takes anyone's issue
        said = httpx.post(f"{repo}/issues/1/comments", headers=as_("stranger"),
                          json={"body": "me too"})  # fmt: skip
        assert said.status_code == 201
        label = httpx.post(f"{repo}/labels", headers=as_("dev"),
                           json={"name": "phasegate", "color": "#0e8a16"}).json()  # fmt: skip
        labelled = httpx.post(f"{repo}/issues/1/labels", headers=as_("dev"),
                              json={"labels": [label["id"]]})  # fmt: skip
        assert [lb["name"] for lb in labelled.json()] == ["phasegate"]
        refused = httpx.post(f"{repo}/issues/1/labels", headers=as_("stranger"),
                             json={"labels": [label["id"]]})  # fmt: skip
        assert refused.status_code == 403


# -- webhooks -------------------------------------------------------------------------------------


def test_webhooks_are_signed_as_gitea_signs_and_phasegate_reads_them(lab: Lab) -> None:
    with receiving_hooks() as (url, received):
        lab.gitea.hooks.add(REPO, url, "s3cret")
        agent = label_id(lab, "agent")
        dev, bot = lab.client("dev"), lab.client(BOT)
        ok(lab.client("guest").post(f"{R}/issues", json={"title": "Hooked"}), 201)
        ok(dev.post(f"{R}/issues/1/labels", json={"labels": [agent]}))
        ok(dev.post(f"{R}/issues/1/comments", json={"body": "/phasegate retry"}), 201)
        head = open_pull(lab, "hooked", {"h.txt": "h\n"})["head"]["sha"]
        ok(lab.client("alice").post(f"{R}/pulls/2/reviews", json={"event": "APPROVED"}))
        ok(bot.post(f"{R}/statuses/{head}", json={"state": "success", "context": "ci"}), 201)
        ok(bot.post(f"{R}/pulls/2/merge", json={"Do": "merge"}))
        delivered = lab.gitea.hooks.wait_all()
    assert [d.status for d in delivered] == [200] * 7
    seen = [(h["X-Gitea-Event"], h["X-Gitea-Event-Type"], json.loads(b).get("action"))
            for h, b in received]  # fmt: skip
    assert seen == [
        ("issues", "issues", "opened"),
        ("issues", "issue_label", "label_updated"),
        ("issue_comment", "issue_comment", "created"),
        ("pull_request", "pull_request", "opened"),
        ("pull_request_approved", "pull_request_review_approved", "reviewed"),
        ("status", "status", None),
        ("pull_request", "pull_request", "closed"),
    ]
    for headers, body in received:
        for name in ("X-Gitea-Signature", "X-Forgejo-Signature"):
            verify("gitea", {name: headers[name]}, body, "s3cret")  # phasegate's own check
        assert headers["X-Forgejo-Event"] == headers["X-Gitea-Event"]
        assert headers["X-Hub-Signature-256"] == "sha256=" + headers["X-Gitea-Signature"]
    assert len({h["X-Gitea-Delivery"] for h, _ in received}) == 7
    # The payloads have no schema in the description; what they carry does.
    described = Description.load()
    for _, body in received:
        payload = json.loads(body)
        for key, model in (("issue", "Issue"), ("pull_request", "PullRequest"),
                           ("comment", "Comment"), ("repository", "Repository"),
                           ("sender", "User")):  # fmt: skip
            if payload.get(key) is not None:
                described.conform(model, payload[key], f"payload {key}")
    labelled = json.loads(received[1][1])
    assert labelled["sender"]["login"] == "dev"
    assert [lb["name"] for lb in labelled["issue"]["labels"]] == ["agent"]
    about = concerns("gitea", "issues", labelled)
    assert (about.repository, about.numbers) == (REPO, frozenset({1}))
    # Gitea names no added label: phasegate sees the labels carried, the
    # watcher asks the timeline who put the trigger label there.
    assert (about.label, about.labelled, about.carried) == (None, None, frozenset({"agent"}))
    comment = concerns("gitea", "issue_comment", json.loads(received[2][1]))
    assert comment.command is True
    merged = json.loads(received[6][1])
    assert merged["pull_request"]["merged"] is True and merged["number"] == 2
    assert concerns("gitea", "pull_request", merged).branches == frozenset({"hooked"})


# -- protection on push, hooks made through the API ---------------------------------------


def test_a_protected_branch_takes_no_push_unless_its_rule_allows_the_pusher(lab: Lab) -> None:
    checkout = lab.work / "pusher"
    lab.git("clone", "--quiet", lab.gitea.clone_url(REPO, lab.token("dev")), str(checkout))
    (checkout / "direct.txt").write_text("direct\n")
    lab.git("add", "-A", cwd=checkout)
    lab.git("-c", "user.name=Dev", "-c", "user.email=dev@example.com", "commit", "-qm", "direct",
            cwd=checkout)  # fmt: skip
    lab.gitea.protect(lab.repo, "main", {})
    refused = lab.git("push", "origin", "main", cwd=checkout, check=False)
    assert "Not allowed to push to protected branch main" in refused
    lab.gitea.protect(lab.repo, "release/*", {"enable_push": True, "enable_push_whitelist": True,
                                              "push_whitelist_usernames": ["alice"]})  # fmt: skip
    other = lab.git("push", "origin", "HEAD:release/1", cwd=checkout, check=False)
    assert "Not allowed to push to protected branch release/1" in other
    lab.gitea.repo(REPO).protections[0].enable_push = True
    from support.gitea_guard import install

    install(lab.repo)
    lab.git("push", "--quiet", "origin", "main", cwd=checkout)
    assert lab.repo.bare.branch_sha("main") == lab.git("rev-parse", "HEAD", cwd=checkout)
    gone = lab.git("push", "origin", ":main", cwd=checkout, check=False)
    assert "protected from deletion" in gone or "refusing to delete the current branch" in gone


def test_a_hook_made_through_the_api_gets_the_events_it_chose(lab: Lab) -> None:
    config = {"url": "http://127.0.0.1:9/hook", "content_type": "json", "secret": "s"}
    hook = {"type": "gitea", "events": ["issues"], "active": True, "config": config}
    assert lab.client(BOT).post(f"{R}/hooks", json=hook).status_code == 403
    made = ok(lab.client("alice").post(f"{R}/hooks", json=hook), 201)
    assert (made["type"], made["events"], made["config"]["url"]) == (
        "gitea", ["issues"], "http://127.0.0.1:9/hook",
    )  # fmt: skip
    assert "secret" not in made["config"]
    assert [h["id"] for h in ok(lab.client("alice").get(f"{R}/hooks"))] == [made["id"]]
    lab.gitea.open_issue(REPO, "dev", "Hooked")
    lab.gitea.comment(REPO, "dev", 1, "not chosen")
    lab.gitea.label(REPO, "alice", 1, "agent")
    delivered = lab.gitea.hooks.wait_all()
    assert [(d.event, d.kind) for d in delivered] == [
        ("issues", "issues"),
        ("issues", "issue_label"),
    ]
    assert all(d.status is None for d in delivered)  # nobody listens on port 9
