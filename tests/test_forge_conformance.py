"""The forge conformance suite: what every forge behind the ``Forge`` protocol does
alike, run over each forge's rig (forge_conformance_kit.KITS).

Markers find what was made, so a crash between a create and its record never
makes a second one; phasegate's own comments are never read back as people's;
a pull request merges only at the head it names; closing and deleting are
idempotent. Where a forge has people, CI and labels, the suite also proves who
is trusted, who labelled, what people said (a review's line with its path), and
that a required check holds the merge until it passed on that head.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from forge_conformance_kit import KITS, Kit, branch_with_change, kits_with

from phasegate.forge.base import (
    OWN_CHECK,
    STATUS_LABEL_PREFIX,
    ForgeError,
    ForgeNotFound,
    ForgeNotMergeable,
    ForgeUnavailable,
    TrustCache,
)

from conftest import git


@pytest.fixture
def kit(request: pytest.FixtureRequest, tmp_path: Path) -> Kit:
    return KITS[request.param](request, tmp_path)


def every(*needs: str) -> pytest.MarkDecorator:
    """Run the test over each rig that can do ``needs``."""
    return pytest.mark.parametrize("kit", kits_with(*needs), indirect=True)


def opened_pull_request(kit: Kit, branch: str = "topic") -> tuple[int, str]:
    """A pull request of a new ``branch`` into main, published: (number, head SHA)."""
    head = branch_with_change(kit.checkout, branch)
    kit.forge.publish_branch(branch)
    number = kit.forge.create_pull_request(branch, "main", "Change x", "Body")
    return number, head


@every()
def test_an_issue_is_found_by_its_marker_and_closes_idempotently(kit: Kit) -> None:
    forge = kit.forge
    assert forge.find_issue("phasegate:wf-1:issue") is None
    number = forge.create_issue("Add a feature", "Write feature.txt", "phasegate:wf-1:issue")
    assert forge.find_issue("phasegate:wf-1:issue") == number
    assert forge.find_issue("phasegate:wf-2:issue") is None
    issue = forge.issue(number)
    assert (issue.number, issue.title, issue.state) == (number, "Add a feature", "open")
    assert "Write feature.txt" in issue.body
    forge.close_issue(number)
    forge.close_issue(number)
    assert forge.issue(number).state == "closed"
    with pytest.raises(ForgeError):
        forge.issue(number + 1000)


@every()
def test_phasegates_own_comments_are_found_by_marker_never_read_as_peoples(kit: Kit) -> None:
    forge = kit.forge
    number = forge.create_issue("Ticket", "Body", "phasegate:wf-1:issue")
    assert forge.find_comment(number, "phasegate:wf-1:plan:r1") is None
    said = forge.comment(number, "**Plan (round 1)**\n\nDo it.", "phasegate:wf-1:plan:r1")
    assert forge.find_comment(number, "phasegate:wf-1:plan:r1") == said
    assert forge.find_comment(number, "phasegate:wf-1:plan:r2") is None
    assert forge.comments(number) == []


@every()
def test_a_pull_request_opens_once_per_branch_and_merges_only_at_the_head_it_names(
    kit: Kit,
) -> None:
    forge = kit.forge
    assert forge.find_pull_request("topic") is None
    number, head = opened_pull_request(kit)
    assert forge.find_pull_request("topic") == number
    pr = forge.pull_request(number)
    assert (pr.head, pr.base, pr.state) == ("topic", "main", "open")
    # A forge that shares phasegate's repository (the local one) tracks no head of its own.
    assert pr.head_sha == (None if kit.shares_repository else head)
    forge.update_pull_request(number, "A new body")
    assert forge.pull_request(number).body.startswith("A new body")
    assert forge.find_merge(number) is None

    with pytest.raises(ForgeError):
        forge.merge_pull_request(number, "Merge", head=git(kit.checkout, "rev-parse", "main"))
    assert forge.find_merge(number) is None and forge.pull_request(number).state == "open"
    merged = forge.merge_pull_request(number, "Merge topic", head=head)
    assert forge.find_merge(number) == merged
    pr = forge.pull_request(number)
    assert (pr.state, pr.merge_sha) == ("merged", merged)
    base = forge.branch_ref("main")
    git(kit.checkout, "merge-base", "--is-ancestor", head, base)  # raises unless merged in
    forge.close_pull_request(number)  # merged stays merged
    assert forge.pull_request(number).state == "merged"


@every()
def test_closing_a_pull_request_and_deleting_its_branch_are_idempotent(kit: Kit) -> None:
    forge = kit.forge
    number, _ = opened_pull_request(kit)
    forge.close_pull_request(number)
    forge.close_pull_request(number)
    assert forge.pull_request(number).state == "closed"
    forge.delete_branch("topic")
    forge.delete_branch("topic")
    with pytest.raises(ForgeNotFound):
        forge.branch_ref("no-such-branch")


@every("labels")
def test_an_issue_carries_one_status_label_at_a_time_beside_peoples_labels(kit: Kit) -> None:
    assert kit.label is not None and kit.maintainer is not None
    forge = kit.forge
    number = forge.create_issue("Ticket", "Body", "phasegate:wf-1:issue")
    kit.label(number, "bug", kit.maintainer)
    forge.set_status_label(number, STATUS_LABEL_PREFIX + "planning")
    forge.set_status_label(number, STATUS_LABEL_PREFIX + "review")
    forge.set_status_label(number, STATUS_LABEL_PREFIX + "review")
    assert set(forge.issue(number).labels) == {"bug", STATUS_LABEL_PREFIX + "review"}
    forge.set_status_label(number, None)
    assert set(forge.issue(number).labels) == {"bug"}


@every("people", "labels")
def test_who_is_trusted_and_who_labelled_an_issue(kit: Kit) -> None:
    assert kit.open_issue and kit.label and kit.maintainer and kit.reader
    trust = TrustCache(kit.forge)
    assert trust.trusted(kit.maintainer) and not trust.trusted(kit.reader)
    assert not trust.trusted("nobody-at-all") and not trust.trusted("")
    number = kit.open_issue("Add a feature", "Write feature.txt", kit.reader)
    kit.label(number, "phasegate", kit.maintainer)
    (labelled,) = [x for x in kit.forge.labelled_issues("phasegate") if x.issue.number == number]
    assert labelled.by == kit.maintainer and labelled.at.tzinfo is not None
    assert labelled.issue.title == "Add a feature"
    assert kit.forge.labelled_issues("no-such-label") == []


@every("people")
def test_peoples_comments_and_a_reviews_line_come_back_oldest_first(kit: Kit) -> None:
    assert kit.say and kit.review_line and kit.maintainer and kit.reader
    forge = kit.forge
    number, _ = opened_pull_request(kit)
    forge.comment(number, "phasegate's report", "phasegate:wf-1:report:r1")
    kit.say(number, "Please add a test.", kit.maintainer)
    kit.say(number, "Looks odd to me.", kit.reader)
    kit.review_line(number, "app.py", 1, "x should stay 1", kit.maintainer)
    said = forge.comments(number)
    assert [(c.author, c.body) for c in said if c.kind == "conversation"] == [
        (kit.maintainer, "Please add a test."),
        (kit.reader, "Looks odd to me."),
    ]
    (inline,) = [c for c in said if c.kind == "inline"]
    assert (inline.author, inline.path, inline.line) == (kit.maintainer, "app.py", 1)
    assert "x should stay 1" in inline.body
    assert all(c.created_at.tzinfo is not None for c in said)
    assert [c.created_at for c in said] == sorted(c.created_at for c in said)
    later = forge.comments(number, since=said[-1].created_at + timedelta(seconds=1))
    assert later == []


@every("ci")
def test_a_required_check_holds_the_merge_until_it_passed_on_that_head(kit: Kit) -> None:
    assert kit.report and kit.protect
    forge = kit.forge
    assert forge.required_checks("main", fresh=True) == []
    kit.protect("main", ["ci/tests"])
    # GitHub and Gitea require the check by name; GitLab the pipeline it belongs to.
    assert forge.required_checks("main", fresh=True) != []
    number, head = opened_pull_request(kit)
    forge.set_commit_status(head, "success", "reviewed and checked")
    kit.report(head, "ci/tests", "failure")
    checks = {c.name: c.state for c in forge.checks(head)}
    assert {OWN_CHECK: "success", "ci/tests": "failure"}.items() <= checks.items(), checks
    with pytest.raises(ForgeNotMergeable):
        forge.merge_pull_request(number, "Merge", head=head)
    assert forge.find_merge(number) is None

    kit.report(head, "ci/tests", "success")
    assert {c.name: c.state for c in forge.checks(head)}["ci/tests"] == "success"
    merged = forge.merge_pull_request(number, "Merge topic", head=head)
    assert forge.find_merge(number) == merged


@every("faults")
def test_a_failed_answer_is_retried_into_one_issue_and_past_the_retries_is_unavailable(
    kit: Kit,
) -> None:
    assert kit.fail and kit.paths
    forge = kit.forge
    kit.fail("POST", kit.paths["issue"], 500, 1)
    number = forge.create_issue("Ticket", "Body", "phasegate:wf-1:issue")
    assert forge.find_issue("phasegate:wf-1:issue") == number
    kit.fail("POST", kit.paths["issue"], 502, 1)
    assert forge.create_issue("Other", "Body", "phasegate:wf-2:issue") == number + 1

    kit.fail("POST", kit.paths["comment"], 500, 100)
    with pytest.raises(ForgeUnavailable):
        forge.comment(number, "Plan", "phasegate:wf-1:plan:r1")
    assert forge.find_comment(number, "phasegate:wf-1:plan:r1") is None
