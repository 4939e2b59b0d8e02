"""Forges: where issues, pull requests and merges live.

``LocalForge`` (the store and the repository), ``GitHubForge`` (githubkit) and,
in their own subpackages, GitLab's (python-gitlab) and Gitea's (its REST API);
``make_forge`` picks the one the cartridge's ``[forge]`` names. Each name loads
its module on first use: the forge's protocol alone (``Forge``) must not import
githubkit, which a command that never talks to GitHub does not need.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from phasegate.forge.base import (
        Check,
        Comment,
        Forge,
        ForgeAuthError,
        ForgeError,
        ForgeNotFound,
        ForgeUnavailable,
        Issue,
        Labelled,
        PullRequest,
    )
    from phasegate.forge.factory import make_forge
    from phasegate.forge.github.auth import ForgeAuth, forge_auth, repository_from_origin
    from phasegate.forge.github.forge import GitHubForge
    from phasegate.forge.local import LocalForge

#: Where each public name lives.
_HOMES = {
    "Check": "phasegate.forge.base",
    "Comment": "phasegate.forge.base",
    "Forge": "phasegate.forge.base",
    "ForgeAuthError": "phasegate.forge.base",
    "ForgeError": "phasegate.forge.base",
    "ForgeNotFound": "phasegate.forge.base",
    "ForgeUnavailable": "phasegate.forge.base",
    "Issue": "phasegate.forge.base",
    "Labelled": "phasegate.forge.base",
    "PullRequest": "phasegate.forge.base",
    "ForgeAuth": "phasegate.forge.github.auth",
    "forge_auth": "phasegate.forge.github.auth",
    "make_forge": "phasegate.forge.factory",
    "repository_from_origin": "phasegate.forge.github.auth",
    "GitHubForge": "phasegate.forge.github.forge",
    "LocalForge": "phasegate.forge.local",
}

__all__ = [
    "Check",
    "Comment",
    "Forge",
    "ForgeAuth",
    "ForgeAuthError",
    "ForgeError",
    "ForgeNotFound",
    "ForgeUnavailable",
    "GitHubForge",
    "Issue",
    "Labelled",
    "LocalForge",
    "PullRequest",
    "forge_auth",
    "make_forge",
    "repository_from_origin",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value
