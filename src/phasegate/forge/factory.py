"""The forge a cartridge names: the one place that knows every kind of forge.

``make_forge`` is here, above the forges, so no forge imports another to build it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from phasegate.config.cartridge import Cartridge
from phasegate.forge.base import Forge
from phasegate.forge.local import LocalForge
from phasegate.git.workspace import Workspace
from phasegate.store import Store

__all__ = ["make_forge"]


def make_forge(
    cartridge: Cartridge,
    repo: Path,
    store: Store,
    workspace: Workspace,
    secrets: Sequence[str],
    environ: Mapping[str, str] | None = None,
) -> Forge:
    """The forge ``cartridge.forge`` names: a LocalForge for ``kind = "local"``, a
    GitHubForge for ``kind = "github"`` (repository from the cartridge, else the
    origin remote; credentials from ``forge_auth``), a GitLabForge or a GiteaForge
    likewise. ``secrets`` are redacted from everything it sends. Raises ForgeError /
    ForgeAuthError (see those functions)."""
    settings = cartridge.forge
    if settings.kind == "local":
        return LocalForge(store, repo, workspace, secrets)
    if settings.kind == "gitlab":
        from phasegate.forge.gitlab.forge import open_gitlab

        return open_gitlab(settings, repo, workspace, secrets, environ)
    if settings.kind == "gitea":
        from phasegate.forge.gitea.forge import open_gitea

        return open_gitea(settings, repo, workspace, secrets, environ)
    # Here, not at the top: githubkit and httpx cost every local run a fifth of its start.
    from phasegate.forge.github.auth import forge_auth, repository_from_origin
    from phasegate.forge.github.forge import GitHubForge

    repository = settings.repository or repository_from_origin(repo, settings.base_url)
    auth = forge_auth(settings, repo, repository, environ)
    return GitHubForge(repository, auth, repo, workspace, settings, secrets)
