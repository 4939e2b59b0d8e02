"""Forges: where issues, pull requests and merges live."""

from phasegate.forge.base import Forge, ForgeError, Issue, PullRequest
from phasegate.forge.local import LocalForge

__all__ = ["Forge", "ForgeError", "Issue", "LocalForge", "PullRequest"]
