"""Forges: where issues, pull requests and merges live.

``LocalForge`` (the store and the repository) and ``GitHubForge`` (githubkit);
``make_forge`` picks the one the cartridge's ``[forge]`` names.
"""

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
