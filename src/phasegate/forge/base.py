"""The Forge seam: issues, comments, pull requests and merges.

Every create call has a ``find`` twin: the side-effect journal looks for an
existing result before it repeats a call (DESIGN.md §1), so the lookups must
be exact: by marker for issues and comments, by head branch for pull requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

__all__ = ["Forge", "ForgeError", "Issue", "PullRequest"]

from phasegate.contract import PhasegateError


class ForgeError(PhasegateError):
    """The forge refused or failed a call."""


@dataclass(frozen=True)
class Issue:
    number: int
    title: str
    body: str
    state: str  # open | closed


@dataclass(frozen=True)
class PullRequest:
    number: int
    head: str
    base: str
    title: str
    body: str
    state: str  # open | merged | closed
    merge_sha: str | None


class Forge(Protocol):
    def create_issue(self, title: str, body: str, marker: str) -> int: ...
    def find_issue(self, marker: str) -> int | None: ...
    def issue(self, number: int) -> Issue: ...
    def close_issue(self, number: int) -> None: ...

    def comment(self, issue_number: int, body: str, marker: str) -> int: ...
    def find_comment(self, issue_number: int, marker: str) -> int | None: ...

    def publish_branch(self, branch: str) -> None:
        """Make ``branch`` visible to the forge (a push); a no-op where they share the repo."""
        ...

    def create_pull_request(self, head: str, base: str, title: str, body: str) -> int: ...
    def find_pull_request(self, head: str) -> int | None: ...
    def pull_request(self, number: int) -> PullRequest: ...
    def update_pull_request(self, number: int, body: str) -> None: ...

    def merge_pull_request(self, number: int, message: str) -> str:
        """Merge the pull request; return the merge commit SHA."""
        ...

    def find_merge(self, number: int) -> str | None:
        """The merge SHA if the pull request was merged (even if the forge has not recorded it)."""
        ...
