"""The fake GitHub's REST operations for what a person, or their CI, does on GitHub.

phasegate never calls these; a person trying GitHub mode offline does, with
curl (docs/github-offline.md), and so can a test. Each follows GitHub's path,
status code and JSON shape (its @octokit/openapi operation id is given beside
it) and checks permission the way ``github_routes`` does:

- a review (pulls/create-review): ``event`` APPROVE, REQUEST_CHANGES or
  COMMENT with a ``body`` (required unless approving), and inline
  ``comments`` of ``{path, line, body}`` on the head's version of a file;
  GitHub keeps a review without ``event`` pending, which the fake does not
  model (422);
- one inline comment (pulls/create-review-comment): ``{body, commit_id,
  path, line}``, which GitHub files as a review of its own, COMMENTED;
- check runs (checks/create, checks/update, checks/get): GitHub takes them
  from GitHub Apps only; the fake takes them from anyone who may write, so a
  person can play CI. A ``conclusion`` without ``status`` completes the run,
  as on GitHub;
- branch protection (repos/update-branch-protection): an admin requires
  status checks on a branch; a merge into it then waits for them (the model's
  ``GitHub.protect``).

Nobody reviews their own pull request: approving or requesting changes on
one's own is 422, as GitHub answers.
"""

from __future__ import annotations

from typing import Any

from support.github_model import GitHubError, Issue, Repo, invalid, not_found
from support.github_routes import Call, route

__all__ = ["REVIEW_EVENTS"]

#: A review's ``event`` and the state it leaves the review in.
REVIEW_EVENTS = {
    "APPROVE": "APPROVED",
    "REQUEST_CHANGES": "CHANGES_REQUESTED",
    "COMMENT": "COMMENTED",
}


def _inline(call: Call, given: Any) -> list[tuple[str, int, str]]:
    """A review's ``comments`` as the model takes them, ``(path, line, body)``."""
    if given is None:
        return []
    if not isinstance(given, list):
        raise invalid("PullRequestReview", "comments", "invalid")
    found = []
    for comment in given:
        if not isinstance(comment, dict) or not comment.get("path") or not comment.get("body"):
            raise invalid("PullRequestReviewComment", "path", "missing_field")
        line = comment.get("line")
        if not isinstance(line, int) or isinstance(line, bool):
            # GitHub also takes a diff ``position``; the fake knows lines only.
            raise invalid("PullRequestReviewComment", "line", "missing_field")
        found.append((str(comment["path"]), line, str(comment["body"])))
    return found


def _review(call: Call, r: Repo, issue: Issue, state: str, body: str, **given: Any) -> Any:
    """The model's review of ``issue``; a line outside the diff is GitHub's 422."""
    try:
        return call.gh.review(r.full_name, issue.number, call.user.login, state, body, **given)
    except ValueError as exc:
        raise GitHubError(
            422,
            "Unprocessable Entity",
            [{"resource": "PullRequestReviewComment", "code": "custom", "message": str(exc)}],
        ) from None


@route("POST", "/repos/{owner}/{repo}/pulls/{pull_number}/reviews")
def create_review(call: Call) -> Any:
    r = call.repo()
    issue = call.gh.pull(r, call.number("pull_number"))
    state = REVIEW_EVENTS.get(str(call.field("event", "")).upper())
    if state is None:
        raise invalid("PullRequestReview", "event", "missing_field")
    body = call.text("PullRequestReview", required=state != "APPROVED") or ""
    if state != "COMMENTED" and issue.user.login.lower() == call.user.login.lower():
        what = "approve" if state == "APPROVED" else "request changes on"
        raise GitHubError(422, "Unprocessable Entity", [f"Can not {what} your own pull request"])
    review = _review(
        call,
        r,
        issue,
        state,
        body,
        comments=_inline(call, call.field("comments")),
        commit_id=call.field("commit_id"),
    )
    return call.gh.shapes.review(r, issue, review)


@route("POST", "/repos/{owner}/{repo}/pulls/{pull_number}/comments")
def create_review_comment(call: Call) -> Any:
    r = call.repo()
    issue = call.gh.pull(r, call.number("pull_number"))
    body = call.text("PullRequestReviewComment", required=True) or ""
    path = str(call.required("path", "PullRequestReviewComment"))
    commit_id = str(call.required("commit_id", "PullRequestReviewComment"))
    [(_, line, _)] = _inline(call, [{"path": path, "line": call.field("line"), "body": body}])
    review = _review(
        call, r, issue, "COMMENTED", "", comments=[(path, line, body)], commit_id=commit_id
    )
    pull = issue.pull
    assert pull is not None
    said = next(c for c in reversed(pull.review_comments) if c.review_id == review.id)
    call.created(f"{call.gh.url}/repos/{r.full_name}/pulls/comments/{said.id}")
    return call.gh.shapes.review_comment(r, issue, said)


def _output(call: Call) -> dict[str, Any]:
    output = call.field("output") or {}
    if not isinstance(output, dict):
        raise invalid("CheckRun", "output", "invalid")
    return {k: output.get(k) for k in ("title", "summary", "text")}


def _check_run_state(status: str | None, conclusion: str | None) -> tuple[str, str | None]:
    """``status`` and ``conclusion`` as GitHub settles them: a conclusion completes."""
    if conclusion is not None:
        return "completed", conclusion
    return status or "queued", None


@route("POST", "/repos/{owner}/{repo}/check-runs")
def create_check_run(call: Call) -> Any:
    r = call.repo("write")
    name = str(call.required("name", "CheckRun"))
    sha = str(call.required("head_sha", "CheckRun"))
    if r.git.sha(sha) != sha:
        raise invalid("CheckRun", "head_sha", "invalid", f"No commit found for SHA: {sha}")
    status, conclusion = _check_run_state(call.field("status"), call.field("conclusion"))
    try:
        run = call.gh.check_run(
            r.full_name,
            sha,
            name,
            status,
            conclusion,
            details_url=call.field("details_url"),
            **_output(call),
        )
    except ValueError as exc:
        raise invalid("CheckRun", "status", "invalid", str(exc)) from None
    call.created(f"{call.gh.url}/repos/{r.full_name}/check-runs/{run.id}")
    return call.gh.shapes.check_run(r, run)


def _run_of(call: Call, r: Repo) -> Any:
    run_id = call.number("check_run_id")
    run = next((c for c in r.check_runs if c.id == run_id), None)
    if run is None:
        raise not_found()
    return run


@route("GET", "/repos/{owner}/{repo}/check-runs/{check_run_id}")
def get_check_run(call: Call) -> Any:
    r = call.repo()
    return call.gh.shapes.check_run(r, _run_of(call, r))


@route("PATCH", "/repos/{owner}/{repo}/check-runs/{check_run_id}")
def update_check_run(call: Call) -> Any:
    r = call.repo("write")
    run = _run_of(call, r)
    conclusion = call.field("conclusion")
    status, conclusion = _check_run_state(call.field("status") or run.status, conclusion)
    if status == "completed" and conclusion is None:
        conclusion = run.conclusion
    try:
        call.gh.update_check_run(
            r.full_name,
            run.id,
            status,
            conclusion,
            name=call.field("name"),
            details_url=call.field("details_url"),
            **_output(call),
        )
    except ValueError as exc:
        raise invalid("CheckRun", "status", "invalid", str(exc)) from None
    return call.gh.shapes.check_run(r, run)


# -- branch protection (repos/update-branch-protection): what an admin sets --
@route("PUT", "/repos/{owner}/{repo}/branches/{branch:path}/protection")
def protect_branch(call: Call) -> Any:
    """The fake keeps only ``required_status_checks`` (its ``contexts`` and
    ``checks[].context``; null requires none): GitHub's other rules are not modelled."""
    r = call.repo("admin")
    branch = call.params["branch"]
    if r.git.branch_sha(branch) is None:
        raise GitHubError(404, "Branch not found")
    for name in ("required_status_checks", "enforce_admins", "required_pull_request_reviews"):
        if not isinstance(call.body, dict) or name not in call.body:
            raise invalid("BranchProtection", name, "missing_field")
    rules = call.field("required_status_checks") or {}
    names = [str(c) for c in rules.get("contexts") or ()]
    names += [str(c["context"]) for c in rules.get("checks") or () if c.get("context")]
    call.gh.protect(r.full_name, branch, dict.fromkeys(names))
    url = f"{call.gh.url}/repos/{r.full_name}/branches/{branch}/protection"
    shown = {"url": f"{url}/required_status_checks", "contexts": names, "strict": False}
    return {"url": url, "required_status_checks": shown}
