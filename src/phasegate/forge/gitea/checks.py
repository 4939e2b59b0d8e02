"""Gitea's CI: a commit's statuses, the base's required status checks, phasegate's own status.

CI on Gitea (Gitea Actions, Woodpecker, Drone, Jenkins …) reports commit
statuses, each under a context. ``checks`` reads the latest status per context
of a commit, ``required_checks`` the contexts the base branch's protection
requires before a merge (``enable_status_check``), and ``set_commit_status``
posts phasegate's own status (context ``phasegate``) so that a team can
require it (docs/gitea.md: branch protection).
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from phasegate.forge.base import OWN_CHECK, Check, CheckState, ForgeAuthError, ForgeNotFound
from phasegate.forge.gitea.api import GiteaAPI, GiteaForbidden, cap

__all__ = ["PROTECTION_TTL_S", "GiteaChecks"]

log = logging.getLogger(__name__)

#: A commit status's state as a check's: error, failure and warning fail.
_STATES: dict[str, CheckState] = {"success": "success", "skipped": "success", "pending": "pending"}
#: Seconds a branch's required checks are kept before Gitea is asked again.
PROTECTION_TTL_S = 300.0
#: What phasegate sends of its own status's description.
_DESCRIPTION_CHARS = 140
_GLOB = frozenset("*?[")


class GiteaChecks(GiteaAPI):
    """The CI half of ``GiteaForge``."""

    #: Set once Gitea refused phasegate's own status (403): it is not asked again.
    _statuses_refused = False
    #: Set once Gitea refused to show the branch protections (403): said once.
    _protection_refused = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # branch → (when read, its required checks): see required_checks
        self._protection: dict[str, tuple[float, tuple[str, ...]]] = {}

    def checks(self, sha: str) -> list[Check]:
        """The latest status of each context on ``sha`` (``GET …/commits/{sha}/status``,
        every page): pending is pending; success and skipped succeed; error, failure
        and warning fail. Output is the status's description, capped at 8 KB; the
        url its target_url. A commit Gitea does not know has no checks yet."""
        found: dict[str, Check] = {}
        page = 1
        while True:
            try:
                combined = self.get(f"{self.base}/commits/{sha}/status", page=page, limit=50)
            except ForgeNotFound:
                return []
            statuses = (combined or {}).get("statuses") or []
            for status in statuses:
                context = str(status.get("context") or "")
                # Gitea's CommitStatus names its state "status"; "state" is GitHub's word
                said = str(status.get("status") or status.get("state") or "")
                if context and context not in found:
                    found[context] = Check(
                        context,
                        _STATES.get(said, "failure"),
                        cap(status.get("description") or ""),
                        status.get("target_url") or None,
                    )
            total = (combined or {}).get("total_count")
            if not statuses or not isinstance(total, int) or len(found) >= total:
                return list(found.values())
            page += 1

    def required_checks(self, branch: str, *, fresh: bool = False) -> list[str]:
        """The contexts ``branch``'s protection requires before a merge
        (``status_check_contexts`` of the rule that protects it, when
        ``enable_status_check``), sorted; [] when no rule protects it or Gitea does
        not show the rules to this token (a repository administrator's only).

        A rule names a branch or a glob (``release/*``): a rule naming the branch
        itself wins, else the first glob that matches, in Gitea's priority order. A
        required context that is a glob names no one check: it is left out (logged);
        Gitea still holds the merge until one matching it passed. Kept for
        PROTECTION_TTL_S unless ``fresh``: a merge Gitea refused reads it again."""
        known = None if fresh else self._protection.get(branch)
        if known is not None and time.monotonic() - known[0] < PROTECTION_TTL_S:
            return list(known[1])
        try:
            rules = self.get(f"{self.base}/branch_protections") or []
        except ForgeNotFound:
            rules = []
        except GiteaForbidden as exc:
            if not self._protection_refused:
                log.warning(
                    "the branch protections of %s are not readable (%s): phasegate "
                    "waits only for forge.required_checks; make the token's account an "
                    "administrator of the repository to read them",
                    self.repository,
                    exc,
                )
            self._protection_refused = True
            rules = []
        rule = _rule_for(branch, rules)
        names: set[str] = set()
        if rule is not None and rule.get("enable_status_check"):
            for context in rule.get("status_check_contexts") or ():
                if _GLOB.intersection(context):
                    log.warning(
                        "%s's protection requires status checks matching %r: phasegate "
                        "waits for named checks only (name them in forge.required_checks)",
                        branch,
                        context,
                    )
                else:
                    names.add(str(context))
        self._protection[branch] = (time.monotonic(), tuple(sorted(names)))
        return sorted(names)

    def set_commit_status(self, sha: str, state: CheckState, description: str) -> None:
        """Post phasegate's own commit status (context OWN_CHECK) on ``sha``
        (``POST …/statuses/{sha}``). A token that may not post statuses (403) is
        logged once and not raised: the status is a courtesy to branch protection,
        never what phasegate itself relies on."""
        if self._statuses_refused:
            return
        said = self._clean(description)[:_DESCRIPTION_CHARS]
        data = {"state": state, "context": OWN_CHECK, "description": said}
        try:
            self.call("POST", f"{self.base}/statuses/{sha}", json=data)
        except ForgeAuthError as exc:
            self._statuses_refused = True
            log.warning(
                "phasegate's own commit status is not posted on %s: %s (the token needs "
                "the repository scope: write)",
                self.repository,
                exc,
            )


def _rule_for(branch: str, rules: Any) -> dict[str, Any] | None:
    """The protection rule Gitea applies to ``branch``: the one named after it,
    else the first (by ``priority``, then as listed) whose glob matches it."""
    listed = [r for r in rules if isinstance(r, dict)] if isinstance(rules, list) else []
    for rule in listed:
        if (rule.get("rule_name") or rule.get("branch_name")) == branch:
            return rule
    ordered = sorted(
        enumerate(listed), key=lambda pair: (int(pair[1].get("priority") or 0), pair[0])
    )
    for _, rule in ordered:
        name = str(rule.get("rule_name") or rule.get("branch_name") or "")
        if _GLOB.intersection(name) and _glob_match(branch, name):
            return rule
    return None


def _glob_match(branch: str, pattern: str) -> bool:
    """Gitea's rule glob: ``*`` and ``?`` stay within one path segment, ``**``
    crosses them; anything else is itself."""
    regex, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            regex.append(".*")
            i += 2
            continue
        char = pattern[i]
        regex.append("[^/]*" if char == "*" else "[^/]" if char == "?" else re.escape(char))
        i += 1
    return re.fullmatch("".join(regex), branch) is not None
