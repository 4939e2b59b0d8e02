"""The fake GitHub's REST routes for what a person does (support/github_people.py):
reviews, inline comments and check runs over HTTP, judged by GitHub's own schema
through Prism, and ``support/fake_github.py``, which starts the fake for a person.
They sit beside tests/test_github_server.py, whose fixtures they share."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_github_server import REPO, bare, checkout, client, gh, open_pull

from support.github_openapi import cut_file
from support.github_server import GitHubServer
from support.prism import PrismError, PrismProxy, find_description, find_prism

__all__ = ["checkout", "gh"]  # fixtures of test_github_server.py, used here by name

#: The operations ``github_people`` serves, as GitHub's description spells them.
PERSON_OPERATIONS = (
    ("POST", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews"),
    ("POST", "/repos/{owner}/{repo}/pulls/{pull_number}/comments"),
    ("POST", "/repos/{owner}/{repo}/check-runs"),
    ("GET", "/repos/{owner}/{repo}/check-runs/{check_run_id}"),
    ("PATCH", "/repos/{owner}/{repo}/check-runs/{check_run_id}"),
)


def review(c: httpx.Client, number: int, **body: object) -> httpx.Response:
    return c.post(f"/repos/{REPO}/pulls/{number}/reviews", json=body)


# -- reviews ------------------------------------------------------------------------------
def test_a_review_requests_changes_with_a_body_and_an_inline_comment_then_approves(
    gh: GitHubServer,
) -> None:
    with client(gh) as alice, client(gh, "tok-bob") as bob:
        head = open_pull(alice)["head"]["sha"]
        changes = review(
            bob,
            1,
            event="REQUEST_CHANGES",
            body="not yet",
            comments=[{"path": "a.txt", "line": 2, "body": "why two?"}],
        )
        approved = review(bob, 1, event="APPROVE")
        reviews = alice.get(f"/repos/{REPO}/pulls/1/reviews").json()
        inline = alice.get(f"/repos/{REPO}/pulls/1/comments").json()
    assert changes.status_code == 200, changes.text
    assert (changes.json()["state"], changes.json()["commit_id"]) == ("CHANGES_REQUESTED", head)
    assert (approved.status_code, approved.json()["state"]) == (200, "APPROVED")
    assert [(r["state"], r["body"], r["user"]["login"]) for r in reviews] == [
        ("CHANGES_REQUESTED", "not yet", "bob"),
        ("APPROVED", "", "bob"),
    ]
    [line] = inline
    assert (line["path"], line["line"], line["body"]) == ("a.txt", 2, "why two?")
    assert line["diff_hunk"] == "@@ -1 +1,2 @@\n one\n+two"
    assert line["pull_request_review_id"] == reviews[0]["id"]


def test_a_review_is_refused_as_github_refuses_it(gh: GitHubServer) -> None:
    with client(gh) as alice, client(gh, "tok-bob") as bob:
        open_pull(alice)
        own = review(alice, 1, event="APPROVE")
        no_body = review(bob, 1, event="REQUEST_CHANGES")
        pending = review(bob, 1, body="a pending review")
        off_diff = review(
            bob, 1, event="COMMENT", body="?", comments=[{"path": "a.txt", "line": 9, "body": "x"}]
        )
        not_a_pull = review(bob, 7, event="APPROVE")
        reviews = alice.get(f"/repos/{REPO}/pulls/1/reviews").json()
    assert (own.status_code, own.json()["errors"]) == (
        422,
        ["Can not approve your own pull request"],
    )
    assert [r.status_code for r in (no_body, pending, off_diff)] == [422, 422, 422]
    assert "not in the diff" in off_diff.json()["errors"][0]["message"]
    assert not_a_pull.status_code == 404
    assert reviews == []


def test_an_inline_comment_is_a_review_of_its_own_and_gives_its_location(
    gh: GitHubServer,
) -> None:
    with client(gh) as alice, client(gh, "tok-rita") as rita:
        head = open_pull(alice)["head"]["sha"]
        said = rita.post(
            f"/repos/{REPO}/pulls/1/comments",
            json={"body": "typo?", "commit_id": head, "path": "a.txt", "line": 2},
        )
        outside = rita.post(
            f"/repos/{REPO}/pulls/1/comments",
            json={"body": "?", "commit_id": head, "path": "a.txt", "line": 5},
        )
        reviews = alice.get(f"/repos/{REPO}/pulls/1/reviews").json()
    assert said.status_code == 201, said.text
    comment = said.json()
    assert said.headers["Location"].endswith(f"/repos/{REPO}/pulls/comments/{comment['id']}")
    assert (comment["path"], comment["line"], comment["commit_id"]) == ("a.txt", 2, head)
    assert [(r["state"], r["id"]) for r in reviews] == [
        ("COMMENTED", comment["pull_request_review_id"])
    ]
    assert outside.status_code == 422


# -- check runs ---------------------------------------------------------------------------
def test_a_person_plays_ci_with_check_runs_on_a_sha(gh: GitHubServer) -> None:
    sha = bare(gh, "rev-parse", "feature")
    with client(gh, "tok-bob") as bob, client(gh, "tok-rita") as rita:
        made = bob.post(
            f"/repos/{REPO}/check-runs",
            json={"name": "tests", "head_sha": sha, "details_url": "http://ci.example/1"},
        )
        run = made.json()
        running = bob.patch(f"/repos/{REPO}/check-runs/{run['id']}", json={"status": "in_progress"})
        done = bob.patch(
            f"/repos/{REPO}/check-runs/{run['id']}",
            json={"conclusion": "failure", "output": {"title": "1 failed", "summary": "E"}},
        )
        seen = rita.get(f"/repos/{REPO}/check-runs/{run['id']}").json()
        listed = rita.get(f"/repos/{REPO}/commits/feature/check-runs").json()
        by_reader = rita.post(f"/repos/{REPO}/check-runs", json={"name": "x", "head_sha": sha})
        no_commit = bob.post(f"/repos/{REPO}/check-runs", json={"name": "x", "head_sha": "0" * 40})
        gone = bob.patch(f"/repos/{REPO}/check-runs/999999", json={"status": "queued"})
    assert made.status_code == 201, made.text
    assert made.headers["Location"].endswith(f"/check-runs/{run['id']}")
    assert (run["status"], run["conclusion"], run["head_sha"]) == ("queued", None, sha)
    assert run["details_url"] == "http://ci.example/1"
    assert running.json()["status"] == "in_progress" and running.json()["started_at"]
    assert (done.json()["status"], done.json()["conclusion"]) == ("completed", "failure")
    assert seen["output"]["title"] == "1 failed" and seen["completed_at"] is not None
    assert [(r["id"], r["conclusion"]) for r in listed["check_runs"]] == [(run["id"], "failure")]
    assert [by_reader.status_code, no_commit.status_code, gone.status_code] == [403, 422, 404]


def test_a_check_run_created_with_a_conclusion_is_completed(gh: GitHubServer) -> None:
    sha = bare(gh, "rev-parse", "main")
    with client(gh) as alice:
        made = alice.post(
            f"/repos/{REPO}/check-runs",
            json={"name": "lint", "head_sha": sha, "conclusion": "success"},
        )
        bad = alice.post(
            f"/repos/{REPO}/check-runs",
            json={"name": "lint", "head_sha": sha, "status": "completed"},
        )
    assert (made.json()["status"], made.json()["conclusion"]) == ("completed", "success")
    assert bad.status_code == 422


# -- GitHub's schema as referee -----------------------------------------------------------
@pytest.fixture
def person_prism(gh: GitHubServer, tmp_path: Path) -> Iterator[PrismProxy]:
    """Prism over GitHub's description cut to ``PERSON_OPERATIONS``, in front of ``gh``."""
    try:
        find_prism()
        source = find_description()
    except PrismError as missing:
        if os.environ.get("CI") or os.environ.get("PHASEGATE_PRISM"):
            pytest.fail(str(missing))
        pytest.skip(str(missing))
    cut = tmp_path / "people.json"
    cut_file(source, cut, PERSON_OPERATIONS)
    proxy = PrismProxy(gh.url, cut)
    with proxy:
        yield proxy


def test_githubs_schema_finds_nothing_wrong_with_a_persons_calls(
    gh: GitHubServer, person_prism: PrismProxy
) -> None:
    sha = bare(gh, "rev-parse", "feature")
    with client(gh) as alice:
        open_pull(alice)
    with httpx.Client(
        base_url=person_prism.url, headers={"Authorization": "token tok-bob"}, timeout=60
    ) as bob:
        answers = [
            review(bob, 1, event="COMMENT", body="hm", comments=[]),
            review(bob, 1, event="APPROVE", body=""),
            bob.post(
                f"/repos/{REPO}/pulls/1/comments",
                json={"body": "typo?", "commit_id": sha, "path": "a.txt", "line": 2},
            ),
            bob.post(f"/repos/{REPO}/check-runs", json={"name": "tests", "head_sha": sha}),
        ]
        run_id = answers[-1].json()["id"]
        answers.append(bob.get(f"/repos/{REPO}/check-runs/{run_id}"))
        answers.append(
            bob.patch(f"/repos/{REPO}/check-runs/{run_id}", json={"conclusion": "success"})
        )
    assert [a.status_code for a in answers] == [200, 200, 201, 201, 200, 200]
    person_prism.assert_clean()


# -- the command a person starts ----------------------------------------------------------
def test_fake_github_starts_for_a_person_and_prints_how_to_reach_it(tmp_path: Path) -> None:
    script = Path(__file__).parent / "support" / "fake_github.py"
    seed = tmp_path / "calc"
    subprocess.run(["git", "init", "-q", "-b", "main", str(seed)], check=True)
    (seed / "README.md").write_text("# calc\n")
    subprocess.run(["git", "-C", str(seed), "add", "README.md"], check=True)
    subprocess.run(
        ["git", "-C", str(seed), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c"],
        check=True,
    )
    with subprocess.Popen(
        [sys.executable, str(script), "--port", "0", "--repo-dir", str(seed)],
        stdout=subprocess.PIPE,
        text=True,
    ) as started:
        try:
            _reach_it_as_printed(started)
        finally:
            started.send_signal(signal.SIGINT)
            stopped = started.wait(timeout=30)
    assert stopped == 0


def _reach_it_as_printed(started: subprocess.Popen[str]) -> None:
    """What fake_github.py prints lets the bot read the repository and maya file an issue."""
    assert started.stdout is not None
    said = ""
    while "export API=" not in said:
        line = started.stdout.readline()
        assert line, f"it stopped early: {said}"
        said += line
    exports = dict(re.findall(r"^export (\w+)=(\S+)$", said, re.M))
    assert 'kind = "github"\nrepository = "maya/calc"\n' in said
    assert f'base_url = "{exports["API"].split("/repos/")[0]}"' in said
    with httpx.Client(timeout=30) as c:
        bot = {"Authorization": f"token {exports['GITHUB_TOKEN']}"}
        as_bot = c.get(exports["API"], headers=bot)
        filed = c.post(
            f"{exports['API']}/issues",
            headers={"Authorization": f"token {exports['MAINTAINER_TOKEN']}"},
            content=json.dumps({"title": "Add multiply()"}),
        )
    assert as_bot.json()["permissions"]["push"] is True
    assert filed.status_code == 201 and filed.json()["user"]["login"] == "maya"
