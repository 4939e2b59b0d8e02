"""The fake GitHub's CI, branch protection and webhooks over real HTTP, with real git.

Webhook payloads are judged by GitHub's own schemas (the REST description's
``x-webhooks``), their signatures recomputed as a receiver would.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_github_server import REPO, bare, checkout, client, gh, open_pull  # noqa: F401

from support.fake_hooks import receiving_hooks
from support.github_hooks import payload_problems
from support.github_server import GitHubServer


def test_check_runs_and_the_combined_status_of_a_commit(gh: GitHubServer) -> None:  # noqa: F811
    sha = bare(gh, "rev-parse", "feature")
    old = gh.check_run(
        REPO, sha, "tests", "completed", "failure", title="2 failed", text="E assert"
    )
    rerun = gh.check_run(REPO, sha, "tests", "queued")  # a re-run: the latest is what counts
    gh.update_check_run(REPO, rerun.id, "in_progress")
    gh.check_run(REPO, sha, "lint", "completed", "success", summary="clean")
    gh.status(REPO, sha, "ci/legacy", "pending", "bob")
    gh.status(REPO, sha, "ci/legacy", "failure", "bob", description="broke")
    with client(gh) as alice:
        latest = alice.get(f"/repos/{REPO}/commits/{sha}/check-runs").json()
        every = alice.get(
            f"/repos/{REPO}/commits/feature/check-runs", params={"filter": "all"}
        ).json()
        status = alice.get(f"/repos/{REPO}/commits/{sha}/status").json()
        nothing = alice.get(f"/repos/{REPO}/commits/main/status").json()
    runs = {r["name"]: r for r in latest["check_runs"]}
    assert latest["total_count"] == 2 and runs["tests"]["status"] == "in_progress"
    assert runs["lint"]["output"]["summary"] == "clean" and runs["lint"]["conclusion"] == "success"
    assert every["total_count"] == 3
    assert [r for r in every["check_runs"] if r["id"] == old.id][0]["output"]["text"] == "E assert"
    assert (status["state"], status["total_count"]) == ("failure", 1)
    assert status["statuses"][0]["description"] == "broke"
    assert (nothing["state"], nothing["statuses"]) == ("pending", [])
    gh.update_check_run(REPO, rerun.id, "completed", "success", summary="fixed")
    with client(gh) as alice:
        done = alice.get(f"/repos/{REPO}/commits/{sha}/check-runs", params={"check_name": "tests"})
    [finished] = done.json()["check_runs"]
    assert (finished["status"], finished["conclusion"]) == ("completed", "success")
    assert finished["completed_at"] is not None and finished["started_at"] is not None


def test_a_protected_branch_takes_a_merge_only_once_its_required_checks_passed_on_the_head(
    gh: GitHubServer,  # noqa: F811
) -> None:
    sha = bare(gh, "rev-parse", "feature")
    gh.check_run(REPO, sha, "tests", "completed", "success")
    rules = {
        "required_status_checks": {"strict": False, "contexts": ["tests", "phasegate"]},
        "enforce_admins": None,
        "required_pull_request_reviews": None,
        "restrictions": None,
    }
    protection = f"/repos/{REPO}/branches/main/protection"
    with client(gh) as alice, client(gh, "tok-rita") as rita, client(gh, "tok-bob") as bob:
        assert bob.put(protection, json=rules).status_code == 403  # an admin's setting
        assert alice.put(protection, json=rules).status_code == 200
        open_pull(alice)
        branch = rita.get(f"/repos/{REPO}/branches/main").json()  # read access shows it
        refused = alice.put(f"/repos/{REPO}/pulls/1/merge", json={})
        long = "x" * 141
        too_long = alice.post(
            f"/repos/{REPO}/statuses/{sha}", json={"state": "success", "description": long}
        )
        by_reader = rita.post(f"/repos/{REPO}/statuses/{sha}", json={"state": "success"})
        posted = alice.post(
            f"/repos/{REPO}/statuses/{sha}",
            json={"state": "success", "context": "phasegate", "description": "reviewed"},
        )
        merged = alice.put(f"/repos/{REPO}/pulls/1/merge", json={})
        free = alice.get(f"/repos/{REPO}/branches/feature").json()
    checks = branch["protection"]["required_status_checks"]
    assert branch["protected"] is True and checks["contexts"] == ["tests", "phasegate"]
    assert branch["commit"]["sha"] == bare(gh, "rev-parse", "main^")
    assert refused.status_code == 405
    assert refused.json()["message"] == 'Required status check "phasegate" is expected.'
    assert (too_long.status_code, by_reader.status_code) == (422, 403)
    assert posted.status_code == 201 and posted.json()["creator"]["login"] == "alice"
    assert merged.status_code == 200 and merged.json()["merged"] is True
    assert free["protected"] is False and free["commit"]["sha"] == sha


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    """An HTTP receiver (its URL) keeping each POST's headers and body; answers 202."""
    with receiving_hooks(202) as (url, got):
        yield url, got


def test_webhooks_are_signed_deliveries_of_what_githubs_schemas_describe(
    gh: GitHubServer,  # noqa: F811
    checkout: Path,  # noqa: F811
    receiver: tuple[str, list[tuple[dict[str, str], bytes]]],
) -> None:
    url, got = receiver
    with client(gh) as alice, client(gh, "tok-rita") as reader:
        made = alice.post(
            f"/repos/{REPO}/hooks",
            json={"config": {"url": url, "content_type": "json", "secret": "s3"}, "events": ["*"]},
        )
        rita = reader.post(f"/repos/{REPO}/hooks", json={"config": {"url": url}})
        pull = open_pull(alice)
    assert (made.status_code, rita.status_code) == (201, 403)
    issue = gh.open_issue(REPO, "t", "b", by="bob")
    gh.label(REPO, issue.number, "bug", by="bob")
    gh.comment(REPO, issue.number, "hi", by="bob")
    gh.review(REPO, pull["number"], "bob", "COMMENTED", "ok")
    sha = pull["head"]["sha"]
    gh.check_run(REPO, sha, "tests", conclusion="success")
    gh.status(REPO, sha, "ci/legacy", "success", "bob")
    gh.merge_by_hand(REPO, pull["number"], "bob")
    delivered = gh.hooks.wait_all()
    events = [(d.event, json.loads(d.body).get("action")) for d in delivered]
    assert events == [
        ("issues", "labeled"),
        ("issue_comment", "created"),
        ("pull_request_review", "submitted"),
        ("check_run", "created"),
        ("status", None),
        ("pull_request", "closed"),
    ]
    assert {d.status for d in delivered} == {202} and len(got) == len(delivered)
    for d in delivered:
        assert payload_problems(d) == [], d.event
    headers, body = got[1]
    expected = "sha256=" + hmac.new(b"s3", body, hashlib.sha256).hexdigest()
    assert headers["X-Hub-Signature-256"] == expected
    assert headers["X-GitHub-Event"] == "issue_comment" and headers["X-GitHub-Delivery"]
    run = json.loads(delivered[3].body)["check_run"]
    assert [p["number"] for p in run["pull_requests"]] == [pull["number"]]
    status = json.loads(delivered[4].body)
    assert [b["name"] for b in status["branches"]] == ["feature"]
    again = gh.hooks.redeliver(delivered[1])
    assert again.body == delivered[1].body and len(got) == len(delivered) + 1
