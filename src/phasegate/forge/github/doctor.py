"""What ``phasegate doctor`` asks of a GitHub forge: one read-only call with its credentials.

``GET /repos/{owner}/{repo}`` answers what these credentials may do there
(``permissions``): push, maintain or admin is "push". A refused token, a
repository the token cannot see, or one it may read but not push to is
missing; GitHub out of reach is a warning. A GitHub App's key file tracked by
git is a warning too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from phasegate.config.forge import ForgeSettings
from phasegate.forge.base import ForgeAuthError, ForgeError, ForgeUnavailable
from phasegate.forge.github.api import GitHubAPI
from phasegate.forge.github.auth import ForgeAuth, forge_auth, repository_from_origin
from phasegate.git.workspace import GitError, Workspace, git

__all__ = ["looked_at"]


def looked_at(
    settings: ForgeSettings,
    root: Path,
    env: Mapping[str, str],
    missing: list[str],
    warnings: list[str],
    *,
    offline: bool,
) -> dict[str, str]:
    """The forge as doctor shows it: ``kind``, ``api``, ``repository``, ``credentials``
    (never a token's value) and, unless ``offline``, ``access`` (push, read or
    unknown); what stops a run is added to ``missing``, what may surprise to
    ``warnings``."""
    found = {"kind": settings.kind, "api": settings.base_url or "https://api.github.com"}
    _tracked_key(settings, root, warnings)
    try:
        repository = settings.repository or repository_from_origin(root, settings.base_url)
        found["repository"] = repository
        auth = forge_auth(settings, root, repository, env)
        found["credentials"] = auth.credentials
    except ForgeError as exc:
        missing.append(str(exc))
        return found
    found["access"] = "unknown"
    if not offline:
        found["access"] = _access(settings, root, repository, auth, missing, warnings)
    return found


def _access(
    settings: ForgeSettings,
    root: Path,
    repository: str,
    auth: ForgeAuth,
    missing: list[str],
    warnings: list[str],
) -> str:
    """``GET /repos/{owner}/{repo}`` once, read-only: "push" or "read" as the
    repository's ``permissions`` for these credentials say, "unknown" when GitHub
    was not reached or did not say."""
    quick = settings.for_one_look()
    try:
        shape = GitHubAPI(repository, auth, root, Workspace(), quick).find_repository()
    except ForgeUnavailable as exc:
        warnings.append(f"forge: GitHub not reached, so the credentials are untried: {exc}")
        return "unknown"
    except ForgeAuthError as exc:
        missing.append(f"forge: {exc}")
        return "unknown"
    except ForgeError as exc:
        warnings.append(f"forge: GitHub's answer about {repository} is unclear: {exc}")
        return "unknown"
    if shape is None:
        missing.append(
            f"forge: GitHub has no repository {repository}, or {auth.credentials} cannot "
            "see it: check forge.repository (or the origin remote) and the token's access"
        )
        return "unknown"
    permissions = shape.get("permissions")
    if not isinstance(permissions, dict):  # an App's installation token may not be told
        return "unknown"
    if permissions.get("push") or permissions.get("admin") or permissions.get("maintain"):
        return "push"
    missing.append(
        f"forge: {auth.credentials} can read but not push to {repository}: it needs "
        "Contents: write (and Issues, Pull requests: write)"
    )
    return "read"


def _tracked_key(settings: ForgeSettings, root: Path, warnings: list[str]) -> None:
    """Warn when the GitHub App's key file is in git: it would be in every
    worktree, in every agent's reach, and pushed with the branch."""
    if settings.private_key_file is None:
        return
    try:
        git(["ls-files", "--error-unmatch", "--", settings.private_key_file], root)
    except GitError:
        return  # untracked (or outside the repository): as it should be
    warnings.append(
        f"forge.private_key_file {settings.private_key_file} is tracked by git: it is in "
        "every worktree and pushed with each branch; `git rm --cached` it, add it to "
        ".gitignore, and rotate the App's key"
    )
