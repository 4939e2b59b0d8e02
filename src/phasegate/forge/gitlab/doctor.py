"""What ``phasegate doctor`` asks of a GitLab forge: one read-only call with the cartridge's token.

``GET /projects/:id`` answers the caller's own role in ``permissions``
(``project_access``, ``group_access``: the higher counts). A Developer or
higher may push, open merge requests and post statuses: "push". A lower role
is missing (phasegate cannot work there), and so is a refused token or a
project the token cannot see; GitLab out of reach is a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from phasegate.config.forge import ForgeSettings
from phasegate.forge.base import ForgeAuthError, ForgeError, ForgeNotFound, ForgeUnavailable
from phasegate.forge.gitlab.api import GitLabAPI
from phasegate.forge.gitlab.auth import gitlab_auth, instance_url, repository_from_origin
from phasegate.git.workspace import Workspace

__all__ = ["looked_at"]

#: The least access level phasegate works with (Developer).
DEVELOPER = 30


def looked_at(
    settings: ForgeSettings,
    root: Path,
    env: Mapping[str, str],
    missing: list[str],
    warnings: list[str],
    *,
    offline: bool,
) -> dict[str, str]:
    """The forge as doctor shows it: ``kind``, ``api`` (the instance), ``repository``,
    ``credentials`` (never the token) and ``access`` (push, read or unknown); what
    stops a run is added to ``missing``, what may surprise to ``warnings``."""
    found = {"kind": "gitlab", "api": instance_url(settings)}
    # each looked at apart: a repository not found still shows whose token it would be
    try:
        auth = gitlab_auth(settings, env)
        found["credentials"] = auth.credentials
    except ForgeError as exc:
        missing.append(str(exc))
    try:
        repository = settings.repository or repository_from_origin(root, settings.base_url)
        found["repository"] = repository
    except ForgeError as exc:
        missing.append(str(exc))
    if "credentials" not in found or "repository" not in found:
        return found
    found["access"] = "unknown"
    if offline:
        return found
    quick = settings.for_one_look()
    try:
        shape = GitLabAPI(repository, auth, root, Workspace(), quick).project_info()
    except ForgeUnavailable as exc:
        warnings.append(f"forge: GitLab not reached, so the token is untried: {exc}")
        return found
    except (ForgeAuthError, ForgeNotFound) as exc:
        missing.append(f"forge: {exc}")
        return found
    except ForgeError as exc:
        warnings.append(f"forge: GitLab's answer about {repository} is unclear: {exc}")
        return found
    level = _level(shape.get("permissions"))
    found["access"] = "push" if level >= DEVELOPER else "read"
    if level < DEVELOPER:
        missing.append(
            f"forge: {auth.credentials} has access level {level} on {repository}: phasegate "
            "needs Developer (30) or higher to push, open merge requests and post statuses"
        )
    return found


def _level(permissions: Any) -> int:
    if not isinstance(permissions, dict):
        return 0
    levels = [
        int((permissions.get(k) or {}).get("access_level") or 0)
        for k in ("project_access", "group_access")
    ]
    return max(levels)
