"""The fake GitHub's CI and branches over REST: checks, statuses, a branch and its protection.

Operations (their @octokit/openapi ids): checks/list-for-ref,
repos/get-combined-status-for-ref, repos/create-commit-status,
repos/get-branch and git/delete-ref. A commit status may be posted by anyone who may write (GitHub:
push access); a branch's ``protection`` shows its required status checks to
anyone who may read, as GitHub's branch summary does. What the protection
enforces on a merge is the model's part (``GitHub.required_missing``).
Deleting a ref takes push access; GitHub answers 422 for a ref that does not
exist ("Reference does not exist"), a protected branch and the default branch.
"""

from __future__ import annotations

from typing import Any

from support.github_commits import commit_shape
from support.github_model import STATUS_STATES, CommitStatus, GitHubError, Repo, invalid, not_found
from support.github_routes import Call, route

__all__ = ["branch_shape"]

#: What GitHub keeps of a commit status's ``description``.
MAX_DESCRIPTION = 140


def _ref_sha(r: Repo, ref: str) -> str:
    sha = r.git.sha(ref)
    if sha is None:
        raise GitHubError(422, f"No commit found for SHA: {ref}")
    return sha


@route("GET", "/repos/{owner}/{repo}/commits/{ref:path}/check-runs")
def list_check_runs(call: Call) -> Any:
    r = call.repo()
    sha = _ref_sha(r, call.params["ref"])
    runs = [c for c in r.check_runs if c.head_sha == sha]
    if name := call.query.get("check_name"):
        runs = [c for c in runs if c.name == name]
    if status := call.query.get("status"):
        runs = [c for c in runs if c.status == status]
    if call.query.get("filter", "latest") == "latest":
        newest = {c.name: c for c in sorted(runs, key=lambda c: c.id)}
        runs = list(newest.values())
    runs.sort(key=lambda c: c.id, reverse=True)
    shown = call.page(runs)
    return {"total_count": len(runs), "check_runs": [call.gh.shapes.check_run(r, c) for c in shown]}


@route("GET", "/repos/{owner}/{repo}/commits/{ref:path}/status")
def combined_status(call: Call) -> Any:
    r = call.repo()
    sha = _ref_sha(r, call.params["ref"])
    latest: dict[str, CommitStatus] = {}
    for s in sorted((s for s in r.statuses if s.sha == sha), key=lambda s: s.id):
        latest[s.context] = s
    newest_first = sorted(latest.values(), key=lambda s: s.id, reverse=True)
    return call.gh.shapes.combined_status(r, sha, call.page(newest_first))


@route("POST", "/repos/{owner}/{repo}/statuses/{sha}")
def create_status(call: Call) -> Any:
    r = call.repo("write")
    sha = r.git.sha(call.params["sha"])
    if sha is None or sha != call.params["sha"]:
        raise GitHubError(422, f"No commit found for SHA: {call.params['sha']}")
    state = call.required("state", "Status")
    if state not in STATUS_STATES:
        raise invalid("Status", "state", "invalid")
    description = call.field("description")
    if description is not None and len(str(description)) > MAX_DESCRIPTION:
        raise invalid("Status", "description", "custom", "description is too long")
    posted = call.gh.status(
        r.full_name,
        sha,
        str(call.field("context") or "default"),
        str(state),
        call.user.login,
        description=description,
        target_url=call.field("target_url"),
    )
    call.created(f"{call.gh.url}/repos/{r.full_name}/statuses/{sha}")
    shape = call.gh.shapes.status(r, posted)
    return {**shape, "creator": call.gh.shapes.user(posted.creator)}


@route("GET", "/repos/{owner}/{repo}/branches/{branch:path}")
def get_branch(call: Call) -> Any:
    r = call.repo()
    branch = call.params["branch"]
    if r.git.branch_sha(branch) is None:
        raise GitHubError(404, "Branch not found")
    return branch_shape(call, r, branch)


def branch_shape(call: Call, r: Repo, branch: str) -> dict[str, Any]:
    """``branch-with-protection`` of ``branch``: its head commit, and its
    protection's required status checks when it has any."""
    sha = r.git.branch_sha(branch)
    if sha is None:
        raise not_found()
    contexts = r.protection.get(branch)
    api, base = call.gh.url, f"{call.gh.url}/repos/{r.full_name}"
    commit = commit_shape(api, r, sha)
    protection: dict[str, Any] = {"enabled": contexts is not None}
    if contexts is not None:
        protection["required_status_checks"] = {
            "enforcement_level": "everyone",
            "contexts": list(contexts),
            "checks": [{"context": c, "app_id": None} for c in contexts],
        }
    return {
        "name": branch,
        "commit": commit,
        "_links": {
            "self": f"{base}/branches/{branch}",
            "html": f"{api}/{r.full_name}/tree/{branch}",
        },
        "protected": contexts is not None,
        "protection": protection,
        "protection_url": f"{base}/branches/{branch}/protection",
    }


@route("DELETE", "/repos/{owner}/{repo}/git/refs/{ref:path}")
def delete_ref(call: Call) -> Any:
    r = call.repo("write")
    ref = call.params["ref"]  # heads/<branch>, its slashes sent as %2F
    kind, _, branch = ref.partition("/")
    if kind != "heads" or not branch or r.git.branch_sha(branch) is None:
        raise GitHubError(422, "Reference does not exist")
    if branch == r.default_branch:
        raise GitHubError(422, "Cannot delete the default branch")
    if branch in r.protection:
        raise GitHubError(422, "Cannot delete this protected branch")
    r.git.git("update-ref", "-d", f"refs/heads/{branch}")
    call.status = 204
    return None
