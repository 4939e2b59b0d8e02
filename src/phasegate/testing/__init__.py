"""Fakes shipped with phasegate, for its own tests and for yours.

- ``ScriptedRunner``: per-role scripted answers (see ``phasegate.agents.runners.scripted``).
- ``FixedClock``: a clock that moves only when told, for deterministic stores.
- ``InMemoryForge``: a Forge in dicts, for unit tests that need no git merge.
- ``CrashingForge``: wraps a Forge and kills the process (``os._exit``, like
  SIGKILL: no cleanup, no settle) right after a chosen call succeeds.
- ``FlakyForge``: wraps a Forge and raises ForgeError on a chosen call N times
  (a forge that times out).
- ``phasegate.testing.model_server``: the scripted model server that
  ``phasegate dry-run`` and the real-CLI tests drive agent programs with.

The rest of phasegate's test rig (the fake GitHub, the kill-torture harness,
PostgreSQL and browser helpers) lives in the repository's ``tests/support``,
not in the package.
"""

from __future__ import annotations

import dataclasses
import os
from datetime import UTC, datetime, timedelta
from typing import Any

from phasegate.agents.runners.scripted import ScriptedRunner
from phasegate.forge.base import (
    STATUS_LABEL_PREFIX,
    Check,
    CheckState,
    Comment,
    Forge,
    ForgeError,
    Issue,
    Labelled,
    PullRequest,
)

__all__ = ["CrashingForge", "FixedClock", "FlakyForge", "InMemoryForge", "ScriptedRunner"]

CRASH_EXIT_CODE = 137


class FixedClock:
    """``now()`` returns a fixed UTC time that ``advance()`` moves."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._mono = 0.0

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)
        self._mono += seconds


class InMemoryForge:
    """A Forge held in dicts. Merges record a made-up SHA; no git is touched.

    What people do is set by the test: ``said`` (number → their comments;
    ``posted`` holds phasegate's own), ``ci`` (sha → checks), ``permissions``
    (login → permission, default none),
    ``labelled`` (what ``labelled_issues`` returns); ``labels`` records the
    status labels phasegate set.
    """

    def __init__(self) -> None:
        self.issues: dict[int, Issue] = {}
        self.markers: dict[str, int] = {}
        self.posted: list[dict[str, Any]] = []  # phasegate's own comments
        self.prs: dict[int, PullRequest] = {}
        self.published: list[str] = []
        self.statuses: list[tuple[str, str, str]] = []  # (sha, state, description) posted
        self.deleted: list[str] = []  # branches deleted on the forge
        self.said: dict[int, list[Comment]] = {}
        self.ci: dict[str, list[Check]] = {}
        self.permissions: dict[str, str] = {}
        self.labelled: list[Labelled] = []
        self.labels: dict[int, set[str]] = {}
        self._next = 0

    def set_status_label(self, number: int, label: str | None) -> None:
        self.issue(number)
        kept = {x for x in self.labels.get(number, set()) if not x.startswith(STATUS_LABEL_PREFIX)}
        self.labels[number] = kept | ({label} if label else set())

    def labelled_issues(self, label: str) -> list[Labelled]:
        issues = self.issues
        return [x for x in self.labelled if issues.get(x.issue.number, x.issue).state == "open"]

    def permission(self, login: str) -> str:
        return self.permissions.get(login, "none")

    def comments(self, number: int, since: datetime | None = None) -> list[Comment]:
        said = sorted(self.said.get(number, []), key=lambda c: c.created_at)
        return [c for c in said if since is None or c.created_at > since]

    def checks(self, sha: str) -> list[Check]:
        return list(self.ci.get(sha, []))

    def _number(self) -> int:
        self._next += 1
        return self._next

    def create_issue(self, title: str, body: str, marker: str) -> int:
        number = self._number()
        self.issues[number] = Issue(number, title, body, "open")
        self.markers[marker] = number
        return number

    def find_issue(self, marker: str) -> int | None:
        return self.markers.get(marker)

    def issue(self, number: int) -> Issue:
        if number not in self.issues:
            raise ForgeError(f"no issue #{number}")
        return self.issues[number]

    def close_issue(self, number: int) -> None:
        i = self.issue(number)
        self.issues[number] = Issue(i.number, i.title, i.body, "closed")

    def comment(self, issue_number: int, body: str, marker: str) -> int:
        self.posted.append({"issue": issue_number, "body": body, "marker": marker})
        return len(self.posted)

    def find_comment(self, issue_number: int, marker: str) -> int | None:
        for i, c in enumerate(self.posted, start=1):
            if c["issue"] == issue_number and c["marker"] == marker:
                return i
        return None

    def branch_ref(self, branch: str) -> str:
        """``branch`` itself: no git here, its branches are the repository's."""
        return branch

    def publish_branch(self, branch: str) -> None:
        self.published.append(branch)

    def create_pull_request(self, head: str, base: str, title: str, body: str) -> int:
        number = self._number()
        self.prs[number] = PullRequest(number, head, base, title, body, "open", None)
        return number

    def find_pull_request(self, head: str) -> int | None:
        found = [n for n, pr in self.prs.items() if pr.head == head]
        return found[-1] if found else None

    def pull_request(self, number: int) -> PullRequest:
        if number not in self.prs:
            raise ForgeError(f"no pull request #{number}")
        return self.prs[number]

    def update_pull_request(self, number: int, body: str) -> None:
        pr = self.pull_request(number)
        self.prs[number] = PullRequest(pr.number, pr.head, pr.base, pr.title, body, pr.state, None)

    def close_pull_request(self, number: int) -> None:
        pr = self.pull_request(number)
        if pr.state == "open":
            self.prs[number] = dataclasses.replace(pr, state="closed")

    def delete_branch(self, branch: str) -> None:
        self.deleted.append(branch)

    def required_checks(self, branch: str, *, fresh: bool = False) -> list[str]:
        return []

    def set_commit_status(self, sha: str, state: CheckState, description: str) -> None:
        self.statuses.append((sha, state, description))

    def merge_pull_request(self, number: int, message: str, head: str | None = None) -> str:
        pr = self.pull_request(number)
        sha = f"{number:040x}"
        self.prs[number] = PullRequest(
            pr.number, pr.head, pr.base, pr.title, pr.body, "merged", sha
        )
        return sha

    def find_merge(self, number: int) -> str | None:
        return self.pull_request(number).merge_sha


class _Wrapper:
    def __init__(self, inner: Forge) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CrashingForge(_Wrapper):
    """Kills the process right after ``method`` returns successfully (``os._exit``)."""

    def __init__(self, inner: Forge, method: str) -> None:
        super().__init__(inner)
        self.method = method

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name != self.method:
            return attr

        def crash_after(*args: Any, **kwargs: Any) -> Any:
            attr(*args, **kwargs)
            os._exit(CRASH_EXIT_CODE)

        return crash_after


class FlakyForge(_Wrapper):
    """Raises ForgeError from ``method`` for its first ``failures`` calls."""

    def __init__(self, inner: Forge, method: str, failures: int = 1) -> None:
        super().__init__(inner)
        self.method = method
        self.failures = failures

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name != self.method:
            return attr

        def flaky(*args: Any, **kwargs: Any) -> Any:
            if self.failures > 0:
                self.failures -= 1
                raise ForgeError(f"{name}: timed out (FlakyForge)")
            return attr(*args, **kwargs)

        return flaky
