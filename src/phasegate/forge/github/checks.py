"""GitHub's CI: a commit's checks, the base's required checks, phasegate's own status.

``checks`` reads what CI said of a commit, ``required_checks`` what the base
branch's protection requires before a merge, and ``set_commit_status`` posts
phasegate's own commit status (context ``phasegate``) so that a team can make
it a required check (docs/github.md: branch protection).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from phasegate.forge.base import OWN_CHECK, Check, CheckState, ForgeAuthError, ForgeNotFound
from phasegate.forge.github.api import PAGE, GitHubAPI, cap

__all__ = ["PROTECTION_TTL_S", "GitHubChecks"]

log = logging.getLogger(__name__)

#: A commit status's state as a check's (any other is a failure: error, failure).
_COMBINED_STATES: dict[str, CheckState] = {"success": "success", "pending": "pending"}
#: Seconds a branch's required checks are kept before GitHub is asked again.
PROTECTION_TTL_S = 300.0
#: What GitHub keeps of a commit status's description.
_DESCRIPTION_CHARS = 140


class GitHubChecks(GitHubAPI):
    """The CI half of ``GitHubForge``."""

    #: Set once GitHub refused phasegate's own status (403): it is not asked again.
    _statuses_refused = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # branch → (when read, its required checks): see required_checks
        self._protection: dict[str, tuple[float, tuple[str, ...]]] = {}

    def checks(self, sha: str) -> list[Check]:
        """Check runs (the latest per name, as GitHub lists them) and the combined
        status's statuses of ``sha``: a run not completed is pending; success, neutral
        and skipped are success; every other conclusion, and a status of error or
        failure, is failure. Output is title, summary and text, capped at 8 KB."""
        runs = self._list(
            lambda rest: rest.checks.list_for_ref,
            self.owner,
            self.name,
            sha,
            map_func=lambda response: response.json()["check_runs"],
        )
        found = []
        state: CheckState
        for run in runs:
            if run["status"] != "completed":
                state = "pending"
            elif run.get("conclusion") in ("success", "neutral", "skipped"):
                state = "success"
            else:
                state = "failure"
            out = run.get("output") or {}
            said = "\n\n".join(
                x for x in (out.get("title"), out.get("summary"), out.get("text")) if x
            )
            url = run.get("html_url") or run.get("details_url")
            found.append(Check(run["name"], state, cap(said), url))
        combined = self._get(
            lambda rest: rest.repos.get_combined_status_for_ref(
                self.owner, self.name, sha, per_page=PAGE
            )
        )
        for status in combined.get("statuses") or ():
            state = _COMBINED_STATES.get(status["state"], "failure")
            said = cap(status.get("description") or "")
            found.append(Check(status["context"], state, said, status.get("target_url")))
        return found

    def required_checks(self, branch: str, *, fresh: bool = False) -> list[str]:
        """The check names ``branch``'s protection requires before a merge (its
        required status checks' contexts), sorted; [] when the branch is not
        protected or GitHub does not show its protection to this token. Kept for
        PROTECTION_TTL_S (every look at CI asks, and a rule changes seldom), unless
        ``fresh``: a merge GitHub refused reads it again."""
        known = None if fresh else self._protection.get(branch)
        if known is not None and time.monotonic() - known[0] < PROTECTION_TTL_S:
            return list(known[1])
        try:
            found = self._get(lambda rest: rest.repos.get_branch(self.owner, self.name, branch))
        except ForgeNotFound:
            found = {}
        rules = (found.get("protection") or {}).get("required_status_checks") or {}
        names = set(rules.get("contexts") or ())
        names.update(c["context"] for c in rules.get("checks") or () if c.get("context"))
        self._protection[branch] = (time.monotonic(), tuple(sorted(names)))
        return sorted(names)

    def set_commit_status(self, sha: str, state: CheckState, description: str) -> None:
        """Post phasegate's own commit status (context OWN_CHECK) on ``sha``. A token
        that may not post statuses (403) is logged once and not raised: the status
        is a courtesy to branch protection, never what phasegate itself relies on."""
        if self._statuses_refused:
            return
        said = description[:_DESCRIPTION_CHARS]
        data = {"state": state, "context": OWN_CHECK, "description": said}
        try:
            self._api(
                lambda rest: rest.repos.create_commit_status(self.owner, self.name, sha, data=data)
            )
        except ForgeAuthError as exc:
            self._statuses_refused = True
            log.warning(
                "phasegate's own commit status is not posted on %s: %s (the token needs "
                "commit statuses: write)",
                self.repository,
                exc,
            )
