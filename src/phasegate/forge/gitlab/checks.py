"""GitLab's CI: a commit's pipeline and statuses, what a merge requires, phasegate's own status.

``checks`` reads what CI said of a commit: its newest CI pipeline (one check
named PIPELINE_CHECK) and its commit statuses, a pipeline's jobs and external
statuses alike. ``required_checks`` is ``forge.required_checks`` and, while
the project lets a merge request merge only once its pipeline succeeded
(``only_allow_merge_if_pipeline_succeeds``), the pipeline itself.
``set_commit_status`` posts phasegate's own status (name ``phasegate``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from phasegate.forge.base import OWN_CHECK, Check, CheckState, ForgeAuthError
from phasegate.forge.gitlab.api import GitLabAPI, cap
from phasegate.forge.gitlab.faults import GitLabRefused

__all__ = ["PIPELINE_CHECK", "SETTINGS_TTL_S", "GitLabChecks"]

log = logging.getLogger(__name__)

#: The check a commit's newest CI pipeline is reported as.
PIPELINE_CHECK = "pipeline"
#: Seconds the project's merge settings are kept before GitLab is asked again.
SETTINGS_TTL_S = 300.0
#: What GitLab keeps of a commit status's description.
_DESCRIPTION_CHARS = 255

_PASSED = frozenset({"success", "skipped", "manual"})
_FAILED = frozenset({"failed", "canceled", "canceling"})
_OWN_STATES = {"pending": "pending", "success": "success", "failure": "failed"}


def _state(status: str, allow_failure: bool = False) -> CheckState:
    if status in _PASSED or (allow_failure and status in _FAILED):
        return "success"
    return "failure" if status in _FAILED else "pending"


class GitLabChecks(GitLabAPI):
    """The CI half of ``GitLabForge``."""

    #: Set once GitLab refused phasegate's own status (403): it is not asked again.
    _statuses_refused = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._merge_rules: tuple[float, bool] | None = None

    def checks(self, sha: str) -> list[Check]:
        """The newest pipeline of ``sha`` that CI ran (not an external one, which
        only gathers posted statuses) as PIPELINE_CHECK, then each commit status of
        ``sha``, the latest per name: success, skipped and manual are success; failed
        and canceled are failure (success where the job may fail); the rest pending."""
        project = self._project()
        found: list[Check] = []
        pipelines = self._call(
            lambda: [
                p.attributes
                for p in project.pipelines.list(sha=sha, order_by="id", sort="desc", per_page=20)
            ]
        )
        statuses = self._list(project.commits.get(sha, lazy=True).statuses)
        ran = [p for p in pipelines if p.get("source") != "external"]
        if ran:
            newest = ran[0]
            state = _state(str(newest["status"]))
            # phasegate's own status may have joined the pipeline (GitLab adds a
            # status to the commit's newest pipeline): it must not hold it pending.
            jobs = [
                s for s in statuses if s.get("pipeline_id") == newest.get("id")
                and s.get("name") != OWN_CHECK
            ]  # fmt: skip
            if state == "pending" and jobs:
                states = {_state(str(s["status"]), bool(s.get("allow_failure"))) for s in jobs}
                if "pending" not in states:
                    state = "failure" if "failure" in states else "success"
            said = f"pipeline {newest.get('id')} {newest.get('status')}"
            found.append(Check(PIPELINE_CHECK, state, said, newest.get("web_url")))
        for status in statuses:
            state = _state(str(status["status"]), bool(status.get("allow_failure")))
            said = cap(status.get("description") or "")
            found.append(Check(str(status["name"]), state, said, status.get("target_url")))
        return found

    def required_checks(self, branch: str, *, fresh: bool = False) -> list[str]:
        """``forge.required_checks``, and PIPELINE_CHECK while the project merges only
        what a succeeded pipeline passed; sorted. The project's setting is kept
        SETTINGS_TTL_S, unless ``fresh``: a merge GitLab refused reads it again."""
        known = None if fresh else self._merge_rules
        if known is None or time.monotonic() - known[0] >= SETTINGS_TTL_S:
            if fresh or known is not None:
                self._project_info = None
            strict = bool(self.project_info().get("only_allow_merge_if_pipeline_succeeds"))
            known = self._merge_rules = (time.monotonic(), strict)
        names = set(self.settings.required_checks)
        if known[1]:
            names.add(PIPELINE_CHECK)
        return sorted(names)

    def set_commit_status(self, sha: str, state: CheckState, description: str) -> None:
        """Post phasegate's own commit status (name OWN_CHECK) on ``sha``. GitLab's
        400 for a status already in that state is no error. A token that may not
        post statuses (403) is logged once and not raised: the status is a courtesy
        to the project's rules, never what phasegate itself relies on."""
        if self._statuses_refused:
            return
        data = {
            "state": _OWN_STATES[state],
            "name": OWN_CHECK,
            "description": description[:_DESCRIPTION_CHARS],
        }
        commit = self._project().commits.get(sha, lazy=True)
        try:
            self._call(lambda: commit.statuses.create(data))
        except GitLabRefused as exc:
            if exc.status != 400 or "Cannot transition status" not in exc.gitlab_message:
                raise
            log.debug("phasegate's status on %s is %s already", sha[:12], state)
        except ForgeAuthError as exc:
            self._statuses_refused = True
            log.warning(
                "phasegate's own commit status is not posted on %s: %s (the token needs "
                "the Developer role)",
                self.repository,
                exc,
            )
