"""A workflow's change, wherever it is: the one place the CLI, the dashboard and the
API read a workflow's diff from.

Where it is read, first found first:

- merged (``merge_sha`` recorded): the merge commit against its first parent —
  a ``--no-ff`` merge or a squash is one commit on the base; a rebase is the
  branch's commits in a row, counted from the branch head the workflow
  recorded (``head_sha``) when this machine has it;
- the branch against its base (what a pull request shows), while the branch
  is in this clone or, on the local forge, in the clone that built it
  (``repo_path``, when this machine can read it);
- else from the forge: a team forge's branch (or its base, holding the merge)
  fetched with the forge's token into ``refs/phasegate/forge/`` (the forge's
  ``branch_ref``/``find_merge``) — first, for a workflow another clone built;
  on the local forge, the clone's ``origin`` fetched into
  ``refs/phasegate/fetched/``. Nothing is fetched into a person's branches or
  remote-tracking refs.

When none has it, ``Change.missing`` says which branch or commit, what failed
and what to run; a front end shows that instead of a diff.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phasegate.core.contract import PhasegateError
from phasegate.git.command import run_git
from phasegate.git.diffs import DiffFile, branch_diff, commit_diff, has_commit, parse_diff

if TYPE_CHECKING:
    from phasegate.runtime.engine import Engine

__all__ = ["FETCHED_PREFIX", "Change", "workflow_change"]

#: Where a branch of the local forge's ``origin`` is fetched to: phasegate's own
#: namespace (a team forge's fetches go to ``refs/phasegate/forge/``).
FETCHED_PREFIX = "refs/phasegate/fetched/"


@dataclass
class Change:
    """A workflow's change: ``files`` parsed, ``text`` as git printed it, ``source``
    where it was read (``branch b against main``, ``merge commit 1a2b3c4``),
    ``missing`` why there is none (None when it was read)."""

    workflow_id: str
    files: list[DiffFile] = field(default_factory=list)
    text: str = ""
    source: str = ""
    missing: str | None = None

    @property
    def added(self) -> int:
        return sum(f.added for f in self.files)

    @property
    def removed(self) -> int:
        return sum(f.removed for f in self.files)

    def as_dict(self) -> dict[str, Any]:
        """For JSON: where it was read, why it is missing, the totals and every file."""
        return {
            "workflow": self.workflow_id,
            "source": self.source,
            "missing": self.missing,
            "added": self.added,
            "removed": self.removed,
            "files": [f.as_dict() for f in self.files],
        }


def workflow_change(engine: Engine, workflow_id: str) -> Change:
    """The change of workflow ``workflow_id``, read as the module says. Raises
    WorkflowNotFound for an unknown id; a git or forge failure is ``missing``."""
    row = engine.store.workflow_row(workflow_id)
    change = Change(workflow_id)
    branch, base = row.get("branch_name"), row["base_branch"]
    repos = _repos(engine.repo, row.get("repo_path"))
    tried: list[str] = []
    if row.get("merge_sha"):
        found = _merged(engine, row, repos, tried)
        if found is not None:
            return _read(change, *found)
    if not branch:
        change.missing = "no branch yet: the workflow has not prepared its branch"
        return change
    # On a team forge the forge's branch is the one pushed: a clone that did not
    # build the workflow reads it there first (a branch of the same name here may be
    # an old copy), and reads no other clone's path (on another machine that path
    # may be another repository). On the local forge the branch lives in the clone.
    team = engine.cartridge.forge.kind != "local"
    built_in = row.get("repo_path")
    elsewhere = team and bool(built_in) and Path(str(built_in)).resolve() != engine.repo.resolve()
    if elsewhere:
        found = _fetched_branch(engine, branch, base, tried)
        if found is not None:
            return _read(change, *found)
    if team:
        repos = repos[:1]
    for repo in repos:
        if _branch_in(repo, branch):
            return _read(
                change, f"branch {branch} against {base}", partial(branch_diff, repo, base, branch)
            )
    found = None if elsewhere else _fetched_branch(engine, branch, base, tried)
    if found is not None:
        return _read(change, *found)
    places = " nor ".join(str(r) for r in repos)
    said = f"; {'; '.join(tried)}" if tried else ""
    merged = row.get("merge_sha")
    wanted = f"its merge commit {merged[:12]} (on {base})" if merged else f"the branch {branch}"
    change.missing = (
        f"no diff: the branch {branch} is not in {places}{said}. Fetch {wanted} into "
        f"{engine.repo} (e.g. `git fetch <remote> {base if merged else branch}`), or "
        f"read it where it was built (`phasegate diff {workflow_id} -C <that clone>`)"
    )
    return change


def _read(change: Change, source: str, diff: Callable[[], str]) -> Change:
    """``change`` with the diff ``diff()`` prints, or why it could not be read."""
    try:
        change.text = diff()
    except PhasegateError as exc:  # GitError: the refs went away under us
        change.missing = f"{source}: git could not read it: {exc}"
        return change
    change.source = source
    change.files = parse_diff(change.text)
    return change


def _repos(here: Path, built_in: str | None) -> list[Path]:
    """This clone, then the clone that built the workflow when it is another one
    this machine can read."""
    repos = [here]
    if built_in:
        there = Path(built_in)
        if there.resolve() != here.resolve() and (there / ".git").exists():
            repos.append(there)
    return repos


def _branch_in(repo: Path, branch: str) -> bool:
    proc = run_git(["rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}"], repo)
    return proc.returncode == 0


def _merged(
    engine: Engine, row: dict[str, Any], repos: list[Path], tried: list[str]
) -> tuple[str, Callable[[], str]] | None:
    """The merge commit's source and diff, from a clone that has it or after the
    forge brought it here; None (why in ``tried``) when none can."""
    sha = row["merge_sha"]
    holder = next((repo for repo in repos if has_commit(repo, sha)), None)
    if holder is None and engine.cartridge.forge.kind != "local" and row.get("pr_number"):
        try:  # a team forge fetches the base holding the merge (refs/phasegate/forge/)
            engine.forge.find_merge(row["pr_number"])
        except PhasegateError as exc:
            tried.append(f"fetching the merge {sha[:12]} from the forge failed: {exc}")
        holder = engine.repo if has_commit(engine.repo, sha) else None
    local = engine.cartridge.forge.kind == "local"
    if holder is None and local and _fetch_origin(engine.repo, row["base_branch"], tried):
        holder = engine.repo if has_commit(engine.repo, sha) else None
    if holder is None:
        tried.append(f"the merge commit {sha[:12]} is in none of them")
        return None
    back, how = _landed_commits(engine, holder, row, sha)
    return f"merge commit {sha[:12]}{how}", partial(commit_diff, holder, sha, back)


def _landed_commits(engine: Engine, repo: Path, row: dict[str, Any], sha: str) -> tuple[int, str]:
    """How many first-parent commits up to ``sha`` the merge landed, and a note: one
    for a merge or a squash; a rebase's count of the branch's own commits since it
    met the base, when ``repo`` has the recorded branch head."""
    if engine.cartridge.forge.merge_method != "rebase" or engine.cartridge.forge.kind == "local":
        return 1, ""
    head = (row.get("state") or {}).get("head_sha")
    if not head or not has_commit(repo, head):
        return 1, " (rebased: its last commit only, the branch head is not here)"
    fork = run_git(["merge-base", head, sha], repo).stdout.strip()
    count = run_git(["rev-list", "--count", "--no-merges", f"{fork}..{head}"], repo)
    own = int(count.stdout.strip() or 0) if count.returncode == 0 else 0
    return (own, f" (rebased: {own} commits)") if own > 1 else (1, "")


def _fetched_branch(
    engine: Engine, branch: str, base: str, tried: list[str]
) -> tuple[str, Callable[[], str]] | None:
    """The branch fetched from the forge into phasegate's own refs, against its base
    (fetched too, so the diff is against the base the forge has); None, why in
    ``tried``, when the forge has no such branch or could not be reached."""
    repo = engine.repo
    if engine.cartridge.forge.kind == "local":
        if not _fetch_origin(repo, branch, tried):
            return None
        fetched = f"{FETCHED_PREFIX}{branch}"
        return f"branch {branch} against {base} (fetched)", partial(
            branch_diff, repo, base, fetched
        )
    try:
        ref = engine.forge.branch_ref(branch)
    except PhasegateError as exc:
        tried.append(f"fetching {branch} from the forge failed: {exc}")
        return None
    try:
        base_ref = engine.forge.branch_ref(base)
    except PhasegateError:
        base_ref = base  # this clone's own base: the diff is still against the merge base
    source = f"branch {branch} against {base} (fetched from the forge)"
    return source, partial(branch_diff, repo, base_ref, ref)


def _fetch_origin(repo: Path, branch: str, tried: list[str]) -> bool:
    """Fetch ``origin``'s ``branch`` into ``refs/phasegate/fetched/<branch>``: the
    local forge's clones share no forge but the remote they were cloned from.
    False (why in ``tried``) when there is no origin or it has no such branch."""
    if run_git(["remote", "get-url", "origin"], repo).returncode != 0:
        return False
    local = f"{FETCHED_PREFIX}{branch}"
    fetch = [
        "fetch",
        "-q",
        "--no-tags",
        "--no-write-fetch-head",
        "origin",
        f"+refs/heads/{branch}:{local}",
    ]
    proc = run_git(fetch, repo)
    if proc.returncode != 0:
        tried.append(f"`git fetch origin {branch}` failed: {proc.stderr.strip()[:300]}")
        return False
    return True
