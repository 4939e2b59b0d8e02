"""What ``phasegate doctor`` says of a Gitea forge: the repository, whose token, what it may do.

One read-only call, ``GET /repos/{owner}/{repo}`` with the cartridge's token
(none when ``offline``): a refused token, a repository the token cannot see,
or an account that may not push is missing; one that pushes but does not
administer the repository is missing too, since Gitea tells other people's
permissions only to an administrator; Gitea out of reach is a warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from phasegate.config.forge import ForgeSettings
from phasegate.forge.base import ForgeAuthError, ForgeError, ForgeNotFound, ForgeUnavailable
from phasegate.forge.gitea.api import GiteaAPI
from phasegate.forge.gitea.auth import gitea_auth, instance_url, repository_from_origin
from phasegate.git.workspace import Workspace

__all__ = ["diagnose_gitea"]


def diagnose_gitea(
    settings: ForgeSettings,
    root: Path,
    env: Mapping[str, str],
    missing: list[str],
    warnings: list[str],
    *,
    offline: bool,
) -> dict[str, str]:
    """The forge as doctor shows it: ``kind``, ``api``, ``repository``,
    ``credentials`` (never the token's value) and ``access`` ("admin", "push",
    "read" or "unknown"); what stops a run is appended to ``missing``, what may
    surprise to ``warnings``."""
    assert settings.base_url is not None
    found = {"kind": "gitea", "api": f"{settings.base_url.rstrip('/')}/api/v1"}
    # each looked at apart: a repository not found still shows whose token it would be
    try:
        auth = gitea_auth(settings, env)
        found["credentials"] = auth.credentials
    except ForgeError as exc:
        missing.append(str(exc))
    try:
        instance_url(settings.base_url)
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
    api = GiteaAPI(repository, auth, root, Workspace(), quick)
    try:
        shape = api.get(api.base) or {}
    except ForgeUnavailable as exc:
        warnings.append(f"forge: Gitea not reached, so the token is untried: {exc}")
        return found
    except (ForgeAuthError, ForgeNotFound) as exc:
        missing.append(f"forge: {exc}")
        return found
    except ForgeError as exc:
        warnings.append(f"forge: Gitea's answer about {repository} is unclear: {exc}")
        return found
    finally:
        api.close()
    permissions = shape.get("permissions") if isinstance(shape, dict) else None
    if not isinstance(permissions, dict):
        return found
    if permissions.get("admin"):
        found["access"] = "admin"
    elif permissions.get("push"):
        found["access"] = "push"
        missing.append(
            f"forge: {auth.credentials} may push to {repository} but not administer it: "
            "Gitea tells other people's permissions only to an administrator, and "
            "phasegate asks them of everyone whose label or comment it reads "
            "(docs/gitea.md: the token)"
        )
    else:
        found["access"] = "read"
        missing.append(
            f"forge: {auth.credentials} can read but not push to {repository}: its account "
            "must administer the repository, and the token needs the scopes repository "
            "and issue: read and write"
        )
    return found
