"""The new project's repository on the forge, made at the top of preparation.

``set_up`` runs when the workflow's ``state["new_project"]`` says so: the
``repo_setup`` milestone is written ``in_progress`` before GitHub is asked to
create the repository (empty, its description naming the workflow) and settled
once the first commit is pushed as the base branch. After a crash the
repository is found again by ``GET /repos/{owner}/{repo}`` and taken as this
workflow's only when its description names the workflow. What a person runs
before the workflow starts (``resolve``, ``make_checkout``) is in
``phasegate.tools.new_project``, which the phases do not import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from phasegate.core.contract import PREPARATION, MilestoneWrite, PhasegateError, WorkflowContext
from phasegate.git.command import git
from phasegate.phases.deps import PhaseDeps

__all__ = ["KIND", "NewProjectRefused", "description_for", "set_up"]

#: The milestone kind of the repository made for a new project.
KIND = "repo_setup"


class NewProjectRefused(PhasegateError):
    """The new project cannot be made: a bad name, a directory in the way, or a
    repository of that name that is not this project's. The message says which."""


def description_for(ctx: WorkflowContext) -> str:
    """The repository's description: the ticket's title and the workflow's id, which
    is how an earlier try's repository is told from someone else's."""
    return f"{ctx.title[:200]} (made by phasegate for workflow {ctx.id})"


def set_up(ctx: WorkflowContext, deps: PhaseDeps) -> None:
    """The new project's repository on the forge, journaled as ``repo_setup``
    (in preparation); a no-op once that milestone is completed.

    On GitHub: found (``GET /repos/{owner}/{repo}``) or created empty, then the
    first commit pushed as the base branch and ``origin`` pointed at its
    ``clone_url`` (no credentials in it). Raises NewProjectRefused when the
    repository exists and its description does not name this workflow (or no
    earlier try of it was journaled), ForgeError on GitHub's errors."""
    said = ctx.state["new_project"]
    repository = said.get("repository")
    write = MilestoneWrite(
        KIND,
        status="in_progress",
        key=str(repository or said["name"]),
        data={"params": dict(said)},
        summary=f"{repository or ctx.repo_path}: in progress",
    )
    store, fence = deps.store, deps.effects.fence
    earlier = store.milestone_by_key(store.dedupe_key(ctx.id, PREPARATION, write))
    if earlier is not None and earlier.status == "completed":
        return
    forge: Any = deps.forge
    if repository is None or getattr(forge, "create_repository", None) is None:
        store.write_milestone(
            ctx.id,
            PREPARATION,
            MilestoneWrite(
                KIND,
                key=write.key,
                data={"params": dict(said), "result": {"forge": "local", "path": ctx.repo_path}},
                summary=f"the local repository {ctx.repo_path} is the new project",
            ),
        )
        return
    description = description_for(ctx)
    found = forge.find_repository()
    if found is not None and (earlier is None or found.get("description") != description):
        raise _taken(repository)
    if fence is not None:
        fence.check()
    row = store.write_milestone(ctx.id, PREPARATION, write)
    if fence is not None:
        fence.check()  # again, right before the effect: the row is evidence either way
    try:
        if found is None:
            found = _create(forge, repository, description, bool(said.get("private", True)))
        forge.publish_branch(ctx.base_branch)
    except Exception as exc:
        store.settle_milestone(row, "failed", summary=f"{KIND}: {exc}")
        raise
    clone_url = str(found["clone_url"])
    repo = Path(ctx.repo_path)
    if git(["remote", "get-url", "origin"], repo, check=False) == "":
        git(["remote", "add", "origin", clone_url], repo)
    sha = deps.workspace.rev(repo, ctx.base_branch)
    store.settle_milestone(
        row,
        "completed",
        summary=f"{repository}: made, {ctx.base_branch} at {sha[:12]} pushed",
        data={"result": {"repository": repository, "clone_url": clone_url, "sha": sha}},
    )


def _create(forge: Any, repository: str, description: str, private: bool) -> dict[str, Any]:
    # Here, not at the top: githubkit loads only for a new project made on GitHub.
    from phasegate.forge.github.faults import GitHubRefused

    try:
        return dict(forge.create_repository(description, private=private))
    except GitHubRefused as exc:
        if exc.status != 422:
            raise
        # "name already exists": ours only if an earlier try made it and died unanswered
        found = forge.find_repository()
        if found is None or found.get("description") != description:
            raise _taken(repository) from exc
        return dict(found)


def _taken(repository: str) -> NewProjectRefused:
    return NewProjectRefused(
        f"{repository} already exists on GitHub and is not this workflow's "
        "(its description names no phasegate workflow of this project): choose another "
        "NAME; no issue or branch was made"
    )
