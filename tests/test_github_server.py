"""The fake GitHub (support.github_server) over real HTTP, with real git.

Each REST area round-trips through httpx; pushes go through git's smart HTTP
with an askpass helper; merges are checked on the bare repository itself.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from conftest import git
from support.github_server import GitHubServer

REPO = "alice/app"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A repository with ``main`` (a.txt: one line) and ``feature`` (a second line)."""
    work = tmp_path / "checkout"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    (work / "a.txt").write_text("one\n")
    git(work, "add", "a.txt")
    git(work, "commit", "-q", "-m", "first")
    git(work, "checkout", "-q", "-b", "feature")
    (work / "a.txt").write_text("one\ntwo\n")
    git(work, "commit", "-q", "-am", "second line")
    git(work, "checkout", "-q", "main")
    return work


@pytest.fixture
def gh(tmp_path: Path, checkout: Path) -> Iterator[GitHubServer]:
    """alice owns alice/app (seeded from ``checkout``); bob maintains it; rita reads it."""
    with GitHubServer(tmp_path / "github") as server:
        server.add_user("alice", "tok-alice")
        server.create_repo("alice", "app", from_path=checkout, private=True)
        for login, role in (("bob", "maintain"), ("rita", "read")):
            server.add_user(login, f"tok-{login}", permissions={REPO: role})
        yield server


def client(
    gh: GitHubServer, token: str | None = "tok-alice", scheme: str = "token", timeout: float = 30
) -> httpx.Client:
    headers = {"Authorization": f"{scheme} {token}"} if token else {}
    return httpx.Client(base_url=gh.url, headers=headers, timeout=timeout)


def open_pull(c: httpx.Client, head: str = "feature", body: str = "Implements #1") -> dict:
    answer = c.post(
        f"/repos/{REPO}/pulls", json={"title": "p", "head": head, "base": "main", "body": body}
    )
    assert answer.status_code == 201, answer.text
    return answer.json()


def bare(gh: GitHubServer, *args: str) -> str:
    return git(gh.bare_path(REPO), *args)


# -- auth and permissions --
def test_no_token_or_an_unknown_one_is_401_and_every_answer_has_rate_limit_headers(
    gh: GitHubServer,
) -> None:
    with client(gh, None) as anonymous, client(gh, "not-a-token") as stranger, client(gh) as alice:
        assert anonymous.get(f"/repos/{REPO}").status_code == 401
        bad = stranger.get(f"/repos/{REPO}")
        assert (bad.status_code, bad.json()["message"]) == (401, "Bad credentials")
        first, second = alice.get(f"/repos/{REPO}"), alice.get(f"/repos/{REPO}")
    assert first.json()["full_name"] == REPO
    assert first.json()["clone_url"] == f"{gh.url}/git/{REPO}.git"
    assert int(first.headers["x-ratelimit-remaining"]) - 1 == int(
        second.headers["x-ratelimit-remaining"]
    )
    assert int(first.headers["x-ratelimit-reset"]) > time.time()
    assert bad.headers["x-ratelimit-limit"] == "5000"


def test_permissions_gate_writes_and_hide_a_private_repo(gh: GitHubServer) -> None:
    gh.add_user("eve", "tok-eve")
    with client(gh) as alice, client(gh, "tok-rita") as rita, client(gh, "tok-eve") as eve:
        alice.post(f"/repos/{REPO}/issues", json={"title": "t"})
        assert eve.get(f"/repos/{REPO}").status_code == 404  # private, not hers
        labelled = rita.post(f"/repos/{REPO}/issues/1/labels", json={"labels": ["phasegate"]})
        assert labelled.status_code == 403
        assert rita.post(f"/repos/{REPO}/issues/1/comments", json={"body": "hi"}).status_code == 201
        role = alice.get(f"/repos/{REPO}/collaborators/bob/permission").json()
        nobody = alice.get(f"/repos/{REPO}/collaborators/eve/permission").json()
    assert gh.issue(REPO, 1).labels == []
    assert (role["permission"], role["role_name"], role["user"]["login"]) == (
        "write",
        "maintain",
        "bob",
    )
    assert nobody["role_name"] == "none"


# -- issues, labels, comments ------------------------------------------------------------------
def test_issues_round_trip_with_labels_events_comments_and_state(gh: GitHubServer) -> None:
    with client(gh, "tok-bob") as bob:
        made = bob.post(
            f"/repos/{REPO}/issues", json={"title": "Do it", "body": "b", "labels": ["phasegate"]}
        )
        number = made.json()["number"]
        assert made.status_code == 201 and made.headers["Location"].endswith(f"/issues/{number}")
        bob.post(f"/repos/{REPO}/issues/{number}/labels", json={"labels": ["phasegate:planning"]})
        left = bob.delete(f"/repos/{REPO}/issues/{number}/labels/phasegate:planning")
        assert [x["name"] for x in left.json()] == ["phasegate"]
        assert bob.delete(f"/repos/{REPO}/issues/{number}/labels/nope").status_code == 404
        events = bob.get(f"/repos/{REPO}/issues/{number}/events").json()
        by_label = bob.get(f"/repos/{REPO}/issues", params={"labels": "PHASEGATE"}).json()
        posted = bob.post(f"/repos/{REPO}/issues/{number}/comments", json={"body": "hello"})
        said = bob.get(f"/repos/{REPO}/issues/{number}/comments").json()
        later = bob.get(
            f"/repos/{REPO}/issues/{number}/comments", params={"since": "2999-01-01T00:00:00Z"}
        )
        closed = bob.patch(f"/repos/{REPO}/issues/{number}", json={"state": "closed", "body": "b2"})
        still_open = bob.get(f"/repos/{REPO}/issues").json()
        every = bob.get(f"/repos/{REPO}/issues", params={"state": "all"}).json()
        labels = bob.get(f"/repos/{REPO}/labels").json()
    assert [(e["event"], e["label"]["name"], e["actor"]["login"]) for e in events] == [
        ("labeled", "phasegate", "bob"),
        ("labeled", "phasegate:planning", "bob"),
        ("unlabeled", "phasegate:planning", "bob"),
    ]
    assert [i["number"] for i in by_label] == [number]
    assert posted.status_code == 201 and [c["body"] for c in said] == ["hello"]
    assert said[0]["user"]["login"] == "bob" and said[0]["author_association"] == "COLLABORATOR"
    assert later.json() == []
    assert (closed.json()["state"], closed.json()["body"]) == ("closed", "b2")
    assert still_open == [] and [i["number"] for i in every] == [number]
    assert {x["name"] for x in labels} == {"phasegate", "phasegate:planning"}
    assert gh.counts(REPO) == {"issues": 1, "pulls": 0, "comments": 1, "reviews": 0, "merges": 0}


def test_the_clock_and_at_place_what_people_do_in_time_and_since_filters_by_it(
    tmp_path: Path, checkout: Path
) -> None:
    start = datetime(2026, 3, 1, 12, 0, 0, 500_000, tzinfo=UTC)
    with GitHubServer(tmp_path / "timed", clock=lambda: start) as timed:
        timed.add_user("alice", "tok-alice")
        timed.create_repo("alice", "app", from_path=checkout)
        timed.open_issue(REPO, "t", None, "alice")
        timed.comment(REPO, 1, "before", "alice")
        timed.comment(REPO, 1, "after", "alice", at=start + timedelta(minutes=5))
        timed.open_issue(REPO, "untouched", None, "alice")
        with client(timed) as alice:
            issue = alice.get(f"/repos/{REPO}/issues/1").json()
            since = alice.get(
                f"/repos/{REPO}/issues/1/comments", params={"since": "2026-03-01T12:01:00Z"}
            )
            timed.edit_issue(REPO, 1, "alice", body="edited", at=start + timedelta(hours=1))
            edited = alice.get(f"/repos/{REPO}/issues", params={"since": "2026-03-01T12:30:00Z"})
    assert issue["created_at"] == "2026-03-01T12:00:00Z"  # whole seconds, as GitHub keeps them
    assert [c["body"] for c in since.json()] == ["after"]
    assert since.json()[0]["created_at"] == "2026-03-01T12:05:00Z"
    [changed] = edited.json()  # since filters issues by updated_at
    assert (changed["number"], changed["body"]) == (1, "edited")
    assert changed["updated_at"] == "2026-03-01T13:00:00Z"


def test_a_body_over_githubs_65536_characters_is_422(gh: GitHubServer) -> None:
    gh.open_issue(REPO, "t", None, "alice")
    with client(gh) as alice:
        long = alice.post(f"/repos/{REPO}/issues/1/comments", json={"body": "x" * 65537})
        most = alice.post(f"/repos/{REPO}/issues/1/comments", json={"body": "x" * 65536})
        issue = alice.post(f"/repos/{REPO}/issues", json={"title": "t", "body": "x" * 65537})
    assert long.status_code == 422 and "too long" in long.json()["errors"][0]["message"]
    assert (most.status_code, issue.status_code) == (201, 422)
    assert gh.counts(REPO)["comments"] == 1


def test_a_repository_label_is_made_once_then_422(gh: GitHubServer) -> None:
    with client(gh) as alice:
        first = alice.post(f"/repos/{REPO}/labels", json={"name": "phasegate", "color": "00ff00"})
        again = alice.post(f"/repos/{REPO}/labels", json={"name": "phasegate", "color": "00ff00"})
    assert (first.status_code, first.json()["color"]) == (201, "00ff00")
    assert again.status_code == 422 and again.json()["errors"][0]["code"] == "already_exists"


def test_lists_page_by_per_page_with_a_link_header(gh: GitHubServer) -> None:
    for n in range(5):
        gh.open_issue(REPO, f"issue {n}", None, "alice")
    with client(gh) as alice:
        first = alice.get(f"/repos/{REPO}/issues", params={"per_page": 2})
        last = alice.get(f"/repos/{REPO}/issues", params={"per_page": 2, "page": 3})
    assert [i["number"] for i in first.json()] == [5, 4]  # newest first, as GitHub
    assert 'rel="next"' in first.headers["Link"] and "page=3" in first.headers["Link"]
    assert [i["number"] for i in last.json()] == [1]
    assert 'rel="prev"' in last.headers["Link"] and 'rel="next"' not in last.headers["Link"]


# -- pull requests --
def test_pull_requests_round_trip_with_real_shas_and_are_found_by_head(
    gh: GitHubServer, checkout: Path
) -> None:
    gh.open_issue(REPO, "the ticket", "b", "alice")
    with client(gh) as alice:
        made = open_pull(alice)
        again = alice.post(
            f"/repos/{REPO}/pulls", json={"title": "p", "head": "feature", "base": "main"}
        )
        found = alice.get(
            f"/repos/{REPO}/pulls", params={"head": "alice:feature", "state": "all"}
        ).json()
        other = alice.get(f"/repos/{REPO}/pulls", params={"head": "alice:nope"}).json()
        bare_head = alice.get(f"/repos/{REPO}/pulls", params={"head": "nope"}).json()
        edited = alice.patch(f"/repos/{REPO}/pulls/2", json={"body": "Implements #1\n\nv2"}).json()
        as_issue = alice.get(f"/repos/{REPO}/issues/2").json()
    assert made["number"] == 2  # numbers are shared with issues
    assert made["head"]["sha"] == git(checkout, "rev-parse", "feature")
    assert made["base"]["sha"] == git(checkout, "rev-parse", "main")
    assert (made["mergeable"], made["mergeable_state"], made["commits"]) == (True, "clean", 1)
    assert (made["additions"], made["deletions"], made["changed_files"]) == (1, 0, 1)
    assert again.status_code == 422
    assert [p["number"] for p in found] == [2] and other == []
    assert [p["number"] for p in bare_head] == [2]  # no owner: GitHub ignores the filter
    assert edited["body"] == "Implements #1\n\nv2"
    assert as_issue["pull_request"]["merged_at"] is None


def test_mergeable_is_null_while_github_would_still_be_working_it_out(
    gh: GitHubServer, checkout: Path
) -> None:
    gh.mergeable_unknown_reads = 1
    with client(gh) as alice:
        made = open_pull(alice)
        worked_out = alice.get(f"/repos/{REPO}/pulls/1").json()
        git(checkout, "checkout", "-q", "feature")
        (checkout / "a.txt").write_text("one\ntwo\nthree\n")
        git(checkout, "commit", "-q", "-am", "third line")
        git(checkout, "push", "-q", str(gh.bare_path(REPO)), "feature")
        moved, settled = (alice.get(f"/repos/{REPO}/pulls/1").json() for _ in range(2))
    assert (made["mergeable"], made["mergeable_state"]) == (None, "unknown")
    assert worked_out["mergeable"] is True
    assert moved["mergeable"] is None and moved["head"]["sha"] == git(checkout, "rev-parse", "HEAD")
    assert (settled["mergeable"], settled["commits"]) == (True, 2)


@pytest.mark.parametrize("method", ["merge", "squash", "rebase"])
def test_a_merge_through_the_api_is_real_git_on_the_bare_repo(
    gh: GitHubServer, method: str
) -> None:
    with client(gh) as alice, client(gh, "tok-bob") as bob:
        head = open_pull(alice)["head"]["sha"]
        done = bob.put(f"/repos/{REPO}/pulls/1/merge", json={"merge_method": method, "sha": head})
        pull = alice.get(f"/repos/{REPO}/pulls/1").json()
        twice = bob.put(f"/repos/{REPO}/pulls/1/merge", json={"merge_method": method})
    sha = done.json()["sha"]
    assert done.status_code == 200 and done.json()["merged"] is True
    assert bare(gh, "rev-parse", "main") == sha
    parents = bare(gh, "rev-list", "--parents", "-n1", sha).split()[1:]
    assert len(parents) == (2 if method == "merge" else 1)
    assert bare(gh, "show", f"{sha}:a.txt") == "one\ntwo"
    if method == "merge":
        assert parents[1] == head
    else:
        assert sha != head  # squash and rebase write a new commit, as GitHub does
    assert (pull["merged"], pull["merge_commit_sha"], pull["merged_by"]["login"]) == (
        True,
        sha,
        "bob",
    )
    assert pull["state"] == "closed"
    assert twice.status_code == 405
    assert gh.counts(REPO)["merges"] == 1


def test_a_merge_of_a_head_that_moved_is_409_and_merges_nothing(gh: GitHubServer) -> None:
    with client(gh) as alice:
        stale = open_pull(alice)["base"]["sha"]
        moved = alice.put(f"/repos/{REPO}/pulls/1/merge", json={"sha": stale})
        pull = alice.get(f"/repos/{REPO}/pulls/1").json()
    assert moved.status_code == 409
    assert pull["merged"] is False and pull["state"] == "open"
    assert bare(gh, "rev-parse", "main") == pull["base"]["sha"]


def test_a_conflicting_pull_request_is_not_mergeable_and_its_merge_is_405(
    gh: GitHubServer, checkout: Path
) -> None:
    git(checkout, "checkout", "-q", "-b", "rival", "main")
    (checkout / "a.txt").write_text("one\nTWO\n")
    git(checkout, "commit", "-q", "-am", "rival line")
    git(checkout, "push", "-q", str(gh.bare_path(REPO)), "rival")
    with client(gh) as alice:
        open_pull(alice)
        rival = open_pull(alice, head="rival")
        assert alice.put(f"/repos/{REPO}/pulls/1/merge", json={}).status_code == 200
        after = alice.get(f"/repos/{REPO}/pulls/{rival['number']}").json()
        refused = alice.put(f"/repos/{REPO}/pulls/{rival['number']}/merge", json={})
    assert rival["mergeable"] is True  # before the first merge
    assert (after["mergeable"], after["mergeable_state"]) == (False, "dirty")
    assert (
        refused.status_code == 405 and refused.json()["message"] == "Pull Request is not mergeable"
    )


def test_closing_keywords_close_the_issue_on_merge_and_implements_does_not(
    gh: GitHubServer, checkout: Path
) -> None:
    gh.open_issue(REPO, "kept open", None, "alice")
    gh.open_issue(REPO, "closed by keyword", None, "alice")
    git(checkout, "checkout", "-q", "-b", "other", "main")
    (checkout / "b.txt").write_text("b\n")
    git(checkout, "add", "b.txt")
    git(checkout, "commit", "-q", "-m", "b")
    git(checkout, "push", "-q", str(gh.bare_path(REPO)), "other")
    with client(gh) as alice:
        first = open_pull(alice, body="Implements #1")["number"]
        second = open_pull(alice, head="other", body="Fixes #2")["number"]
        for number in (first, second):
            assert alice.put(f"/repos/{REPO}/pulls/{number}/merge", json={}).status_code == 200
        states = [alice.get(f"/repos/{REPO}/issues/{n}").json()["state"] for n in (1, 2)]
    assert states == ["open", "closed"]


def test_reviews_and_inline_comments_carry_state_path_line_and_the_real_diff_hunk(
    gh: GitHubServer,
) -> None:
    with client(gh) as alice:
        open_pull(alice)
        gh.review(
            REPO, 1, "bob", "CHANGES_REQUESTED", "not yet", comments=[("a.txt", 2, "why two?")]
        )
        gh.review(REPO, 1, "bob", "APPROVED")
        gh.comment(REPO, 1, "looks fine now", "bob")
        reviews = alice.get(f"/repos/{REPO}/pulls/1/reviews").json()
        inline = alice.get(f"/repos/{REPO}/pulls/1/comments").json()
        talk = alice.get(f"/repos/{REPO}/issues/1/comments").json()
        pull = alice.get(f"/repos/{REPO}/pulls/1").json()
    assert [(r["state"], r["body"], r["user"]["login"]) for r in reviews] == [
        ("CHANGES_REQUESTED", "not yet", "bob"),
        ("APPROVED", "", "bob"),
    ]
    assert reviews[0]["commit_id"] == pull["head"]["sha"]
    [line] = inline
    assert (line["path"], line["line"], line["body"]) == ("a.txt", 2, "why two?")
    assert line["diff_hunk"] == "@@ -1 +1,2 @@\n one\n+two"
    assert line["pull_request_review_id"] == reviews[0]["id"]
    assert [c["body"] for c in talk] == ["looks fine now"]
    assert pull["review_comments"] == 1
    with pytest.raises(ValueError, match="not in the diff"):
        gh.review(REPO, 1, "bob", "COMMENTED", comments=[("a.txt", 9, "nowhere")])


def test_people_merge_or_close_a_pull_request_by_hand(gh: GitHubServer, checkout: Path) -> None:
    git(checkout, "checkout", "-q", "-b", "other", "main")
    (checkout / "b.txt").write_text("b\n")
    git(checkout, "add", "b.txt")
    git(checkout, "commit", "-q", "-m", "b")
    git(checkout, "push", "-q", str(gh.bare_path(REPO)), "other")
    with client(gh) as alice:
        open_pull(alice)
        open_pull(alice, head="other")
        sha = gh.merge_by_hand(REPO, 1, "bob", method="squash")
        gh.close_pull(REPO, 2, "bob")
        merged, closed = (alice.get(f"/repos/{REPO}/pulls/{n}").json() for n in (1, 2))
    assert (merged["merged"], merged["merge_commit_sha"], merged["merged_by"]["login"]) == (
        True,
        sha,
        "bob",
    )
    assert (closed["state"], closed["merged"], closed["merged_by"]) == ("closed", False, None)


# -- CI --
# -- repositories --
def test_a_repository_created_over_rest_has_its_first_commit(gh: GitHubServer) -> None:
    with client(gh, "tok-bob") as bob:
        made = bob.post("/user/repos", json={"name": "fresh", "auto_init": True, "private": True})
        again = bob.post("/user/repos", json={"name": "fresh"})
        seen = bob.get("/repos/bob/fresh").json()
    assert made.status_code == 201 and made.json()["full_name"] == "bob/fresh"
    assert again.status_code == 422
    assert seen["permissions"]["admin"] is True and seen["private"] is True
    assert git(gh.bare_path("bob/fresh"), "log", "--format=%s", "main") == "Initial commit"


# -- git over smart HTTP --
def askpass(tmp_path: Path) -> Path:
    """GitHub's way for a token: user x-access-token, password the token (from the environment)."""
    helper = tmp_path / "askpass.sh"
    helper.write_text(
        '#!/bin/sh\ncase "$1" in\n'
        "  Username*) echo x-access-token ;;\n"
        '  *) echo "$FAKE_GH_TOKEN" ;;\n'
        "esac\n"
    )
    helper.chmod(helper.stat().st_mode | stat.S_IXUSR)
    return helper


def git_env(helper: Path | None, token: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GIT_ASKPASS", "SSH_ASKPASS")}
    env.update(GIT_TERMINAL_PROMPT="0", FAKE_GH_TOKEN=token)
    if helper is not None:
        env["GIT_ASKPASS"] = str(helper)
    return env


def run_git(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_clone_and_push_over_http_with_an_askpass_helper_reach_the_bare_repo(
    gh: GitHubServer, tmp_path: Path
) -> None:
    with client(gh) as alice:
        clone_url = alice.get(f"/repos/{REPO}").json()["clone_url"]
    env = git_env(askpass(tmp_path), "tok-bob")
    cloned = run_git(tmp_path, env, "clone", "-q", clone_url, "work")
    assert cloned.returncode == 0, cloned.stderr
    work = tmp_path / "work"
    git(work, "checkout", "-q", "-b", "phasegate/1")
    (work / "c.txt").write_text("c\n")
    # Over git's 1 MiB http.postBuffer, so the push streams chunked while it is answered.
    (work / "noise.bin").write_bytes(os.urandom(2 * 1024 * 1024))
    git(work, "add", "c.txt", "noise.bin")
    git(work, "commit", "-q", "-m", "c")
    pushed = run_git(work, env, "push", "-q", "origin", "phasegate/1")
    assert pushed.returncode == 0, pushed.stderr
    assert bare(gh, "rev-parse", "phasegate/1") == git(work, "rev-parse", "HEAD")
    assert "tok-bob" not in (work / ".git" / "config").read_text()
    logins = {r.login for r in gh.requests if r.path.startswith("/git/") and r.status == 200}
    assert logins == {"bob"}
    assert any(r.status == 401 for r in gh.requests if r.path.startswith("/git/"))  # asked first


def test_a_push_without_credentials_or_without_write_is_refused(
    gh: GitHubServer, checkout: Path, tmp_path: Path
) -> None:
    clone_url = f"{gh.url}/git/{REPO}.git"
    git(checkout, "checkout", "-q", "-b", "sneaky", "main")
    (checkout / "s.txt").write_text("s\n")
    git(checkout, "add", "s.txt")
    git(checkout, "commit", "-q", "-m", "s")
    anonymous = run_git(checkout, git_env(None), "push", clone_url, "sneaky")
    reader = run_git(checkout, git_env(askpass(tmp_path), "tok-rita"), "push", clone_url, "sneaky")
    fetched = run_git(checkout, git_env(askpass(tmp_path), "tok-rita"), "fetch", clone_url, "main")
    assert anonymous.returncode != 0 and reader.returncode != 0
    assert "403" in reader.stderr or "denied" in reader.stderr
    assert fetched.returncode == 0, fetched.stderr  # reading is what read permits
    assert "sneaky" not in bare(gh, "branch", "--list")


# -- faults on demand --
def test_a_fault_answers_its_times_then_stops_and_handles_nothing_meanwhile(
    gh: GitHubServer,
) -> None:
    gh.fail("POST", r"/issues$", 429, times=2, headers={"Retry-After": "1"})
    gh.fail("GET", r"/pulls/\d+$", 500)
    with client(gh) as alice:
        answers = [alice.post(f"/repos/{REPO}/issues", json={"title": "t"}) for _ in range(3)]
        server_error = alice.get(f"/repos/{REPO}/pulls/7")
        after = alice.get(f"/repos/{REPO}/pulls/7")
    assert [a.status_code for a in answers] == [429, 429, 201]
    assert answers[0].headers["Retry-After"] == "1"
    assert "secondary rate limit" in answers[0].json()["message"]
    assert (server_error.status_code, after.status_code) == (500, 404)
    assert gh.counts(REPO)["issues"] == 1
    assert [r.status for r in gh.requests if r.method == "POST"] == [429, 429, 201]


def test_a_rate_limit_fault_sets_githubs_headers_over_the_usual_ones(gh: GitHubServer) -> None:
    reset = str(int(time.time()) + 2)
    gh.fail(
        "*", r"/repos/", 403, headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": reset}
    )
    with client(gh) as alice:
        limited, fine = alice.get(f"/repos/{REPO}"), alice.get(f"/repos/{REPO}")
    assert limited.status_code == 403
    assert limited.json()["message"].startswith("API rate limit exceeded")
    assert (limited.headers["x-ratelimit-remaining"], limited.headers["x-ratelimit-reset"]) == (
        "0",
        reset,
    )
    assert fine.status_code == 200 and fine.headers["x-ratelimit-remaining"] != "0"


def test_a_delay_times_the_client_out_and_the_side_effect_still_happens(gh: GitHubServer) -> None:
    gh.delay("POST", r"/comments$", 1.0)
    gh.open_issue(REPO, "t", None, "alice")
    with client(gh, timeout=0.3) as impatient, pytest.raises(httpx.ReadTimeout):
        impatient.post(f"/repos/{REPO}/issues/1/comments", json={"body": "once"})
    deadline = time.monotonic() + 5
    while gh.counts(REPO)["comments"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [c.body for c in gh.issue(REPO, 1).comments] == ["once"]
    with client(gh, timeout=0.3) as alice:  # the delay was used up
        assert alice.post(f"/repos/{REPO}/issues/1/comments", json={"body": "b"}).status_code == 201


# -- GitHub Apps --
def rsa_pem() -> tuple[str, str]:
    """A fresh RSA key pair: (private PKCS#8 PEM, public PEM)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public.decode()


@pytest.fixture(scope="module")
def app_key() -> tuple[str, str]:
    return rsa_pem()


def app_jwt(private: str, app_id: int = 42, lifetime_s: int = 540) -> str:
    now = int(time.time())
    return jwt.encode(
        {"iat": now - 60, "exp": now + lifetime_s, "iss": str(app_id)}, private, "RS256"
    )


def test_an_app_jwt_mints_an_installation_token_that_acts_as_its_bot(
    gh: GitHubServer, app_key: tuple[str, str]
) -> None:
    private, public = app_key
    gh.add_app(42, public, 777, slug="phasegate-ci", owner="alice")
    with client(gh, app_jwt(private), "Bearer") as app:
        installation = app.get(f"/repos/{REPO}/installation").json()
        minted = app.post("/app/installations/777/access_tokens")
    assert (installation["id"], installation["app_id"]) == (777, 42)
    assert minted.status_code == 201
    token = minted.json()["token"]
    expires = datetime.fromisoformat(minted.json()["expires_at"].replace("Z", "+00:00"))
    assert timedelta(minutes=55) < expires - datetime.now(UTC) <= timedelta(hours=1)
    with client(gh, token) as bot:
        made = bot.post(f"/repos/{REPO}/issues", json={"title": "from the app", "labels": ["x"]})
    assert made.status_code == 201
    assert (made.json()["user"]["login"], made.json()["user"]["type"]) == (
        "phasegate-ci[bot]",
        "Bot",
    )


def test_a_bad_app_jwt_is_401(gh: GitHubServer, app_key: tuple[str, str]) -> None:
    private, public = app_key
    gh.add_app(42, public, 777, owner="alice")
    other_key, _ = rsa_pem()
    bad = {
        "signed by another key": app_jwt(other_key),
        "too long a life": app_jwt(private, lifetime_s=3600),
        "an unknown app": app_jwt(private, app_id=9),
        "not a JWT": "tok-alice",
    }
    for why, token in bad.items():
        with client(gh, token, "Bearer") as app:
            answer = app.post("/app/installations/777/access_tokens")
        assert answer.status_code == 401, why
