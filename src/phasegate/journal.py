"""The side-effect journal: every irreversible effect is evidence before it happens.

For each effect (issue, branch, push, PR, PR update, PR close, comment, merge,
issue close, an epic's piece filed as a ticket) the journal
(docs/contracts/lifecycle.md: journaled side effects):

1. returns the recorded result if the effect's milestone is ``completed``;
2. otherwise, when an earlier try left the row ``in_progress`` or ``failed``,
   looks the effect up on the forge or in git, in case that try did it and
   died or raised (a timeout) before settling the row;
3. writes the milestone ``in_progress`` with its idempotency key, in its own
   transaction, *before* the call;
4. makes the call, and settles the row ``completed`` (or ``failed``) in place.

``reconcile()`` runs at the top of ``advance()``: it settles every row a dead
process left ``in_progress``, by the same lookups.

Processes are journaled too (``ProcessJournal``): each agent and check
process has an ``in_progress`` milestone (``agent_process``,
``check_process``) naming its supervisor by host, boot, pgid and start ticks
while it runs, so a restarted worker stops what a dead one left running.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from phasegate.core.contract import EventWrite, MilestoneView, MilestoneWrite, PhasegateError
from phasegate.forge import Forge
from phasegate.forge.base import (
    OWN_PENDING,
    ForgeAuthError,
    ForgeError,
    ForgeNotFound,
    ForgeUnavailable,
    SubIssues,
)
from phasegate.git import guard
from phasegate.git.workspace import Workspace
from phasegate.proc.host import host_name
from phasegate.proc.process import boot_id, kill_orphan_group, start_ticks
from phasegate.store import Fence, FenceLost, Store

__all__ = ["COMMENT_DROPPED", "EFFECT_KINDS", "PROCESS_KINDS", "ProcessJournal", "SideEffects"]

log = logging.getLogger(__name__)

EFFECT_KINDS = frozenset(
    {
        "issue_created",
        "branch_created",
        "branch_pushed",
        "pr_created",
        "pr_updated",
        "pr_closed",
        "comment_posted",
        "merge_completed",
        "issue_closed",
        "ticket_filed",
        "sub_issue_linked",
    }
)

# Milestones that name a running process (its supervisor); reconcile stops them.
PROCESS_KINDS = frozenset({"agent_process", "check_process"})

Result = dict[str, Any]

#: The event of a best-effort comment the forge refused (``SideEffects.comment``).
COMMENT_DROPPED = "comment_dropped"

# A best-effort comment is never dropped for these: they stop every other call too.
_NOT_FORGIVEN = (ForgeUnavailable, ForgeAuthError, ForgeNotFound)


def _then(call: Callable[[], None], result: Result) -> Callable[[], Result]:
    """``call``, then ``result``: an effect whose forge call returns nothing."""

    def run() -> Result:
        call()
        return result

    return run


class ProcessJournal:
    """The journal of the processes one workflow starts: agents and checks.

    The one implementation of "journal a spawned process": used by
    ``AgentService`` (``agent_process``) and ``PhaseDeps.run_checks``
    (``check_process``), read back by ``SideEffects.reconcile``.
    """

    def __init__(self, store: Store, workflow_id: str, *, fence: Fence | None = None) -> None:
        self.store = store
        self.workflow_id = workflow_id
        self.fence = fence

    def _fence_held(self) -> bool:
        if self.fence is None:
            return True
        try:
            self.fence.check()
        except FenceLost:
            return False
        return True

    @contextmanager
    def spawning(
        self, phase: str, kind: str, *, round: int = 0, attempt: int = 0
    ) -> Iterator[Callable[[int, str, str], None]]:
        """Yield ``spawned(pid, what, key)``: call it with each started process's
        supervisor pid, what runs ("build agent", "check 'pytest'") and a key
        unique within (phase, ``kind``, ``round``, ``attempt``).

        Each call writes an ``in_progress`` milestone of ``kind`` (must be in
        PROCESS_KINDS) with data ``host``, ``boot``, ``pgid`` and ``ticks``, in
        its own transaction, before the process works; each is settled
        ``completed`` when the block ends, however it ends, unless ``fence``
        (the lease the workflow is advanced under) was lost meanwhile.
        """
        if kind not in PROCESS_KINDS:
            raise ValueError(f"{kind!r} is not a process milestone kind")
        rows: list[tuple[MilestoneView, str]] = []

        def spawned(pid: int, what: str, key: str) -> None:
            write = MilestoneWrite(
                kind,
                status="in_progress",
                round=round,
                attempt=attempt,
                key=key,
                summary=f"{what} running (pid {pid})",
                data={
                    "host": host_name(),
                    "boot": boot_id(),
                    "pgid": pid,
                    "ticks": start_ticks(pid),
                    "what": what,
                },
            )
            rows.append((self.store.write_milestone(self.workflow_id, phase, write), what))

        try:
            yield spawned
        finally:
            # Once the lease was taken over the rows are the new holder's: its
            # reconciliation settles them; a stale worker writes nothing more.
            if rows and self._fence_held():
                for row, what in rows:
                    self.store.settle_milestone(row, "completed", summary=f"{what} exited")


class SideEffects:
    """The journaled effects of one workflow. Each method is idempotent on its key.

    With a ``fence`` (the lease the workflow is advanced under) every effect
    checks it first and raises FenceLost, writing nothing, once another worker
    took the lease over.
    """

    def __init__(
        self,
        store: Store,
        forge: Forge,
        workspace: Workspace,
        workflow_id: str,
        repo: Path,
        *,
        fence: Fence | None = None,
    ) -> None:
        self.fence = fence
        self.store = store
        self.forge = forge
        self.workspace = workspace
        self.workflow_id = workflow_id
        self.repo = repo

    # -- the effects ------------------------------------------------------------

    def create_issue(self, phase: str, title: str, body: str) -> int:
        marker = f"phasegate:workflow:{self.workflow_id}"
        params = {"title": title, "marker": marker}
        result = self._journaled(
            phase,
            "issue_created",
            "issue",
            params,
            lambda: {"number": self.forge.create_issue(title, body, marker)},
        )
        return int(result["number"])

    def file_ticket(self, phase: str, key: str, title: str, body: str) -> int:
        """File one more ticket (an epic's piece: docs/epics.md) once per ``key``;
        its issue number. Its marker names this workflow, so it is found again."""
        marker = f"phasegate:workflow:{self.workflow_id}:{key}"
        params = {"title": title, "marker": marker}
        result = self._journaled(
            phase,
            "ticket_filed",
            key,
            params,
            lambda: {"number": self.forge.create_issue(title, body, marker)},
        )
        return int(result["number"])

    def link_sub_issue(self, phase: str, key: str, parent: int, child: int) -> bool:
        """File issue ``child`` under issue ``parent`` once per ``key``, where the forge
        has sub-issues (``SubIssues``); False where it has none (nothing journaled)."""
        forge = self.forge
        if not isinstance(forge, SubIssues):
            return False
        params = {"parent": parent, "child": child}
        link = _then(lambda: forge.link_sub_issue(parent, child), {"parent": parent})
        self._journaled(phase, "sub_issue_linked", key, params, link)
        return True

    def create_branch(self, phase: str, branch: str, base: str) -> str:
        params = {"branch": branch, "base": base}
        result = self._journaled(
            phase,
            "branch_created",
            branch,
            params,
            lambda: {"sha": self.workspace.create_branch(self.repo, branch, base)},
        )
        return str(result["sha"])

    def push_branch(self, phase: str, branch: str, sha: str) -> None:
        """Publish ``branch`` at ``sha`` once, and mark ``sha`` pending with phasegate's
        own status: no head phasegate pushed passes it before it was reviewed and checked."""

        def push() -> None:
            self.forge.publish_branch(branch)
            self.forge.set_commit_status(sha, "pending", OWN_PENDING)

        self._journaled(
            phase,
            "branch_pushed",
            f"{branch}@{sha}",
            {"branch": branch, "sha": sha},
            _then(push, {"sha": sha}),
        )

    def open_pull_request(self, phase: str, head: str, base: str, title: str, body: str) -> int:
        params = {"head": head, "base": base}
        result = self._journaled(
            phase,
            "pr_created",
            head,
            params,
            lambda: {"number": self.forge.create_pull_request(head, base, title, body)},
        )
        return int(result["number"])

    def update_pull_request(self, phase: str, number: int, body: str, key: str) -> None:
        self._journaled(
            phase,
            "pr_updated",
            f"pr{number}:{key}",
            {"number": number, "body": body},
            _then(lambda: self.forge.update_pull_request(number, body), {"number": number}),
        )

    def close_pull_request(self, phase: str, number: int) -> None:
        """Close pull request ``number`` once (a cancelled workflow's own: the
        caller judges whose it is)."""
        self._journaled(
            phase,
            "pr_closed",
            f"pr{number}",
            {"number": number},
            _then(lambda: self.forge.close_pull_request(number), {"number": number}),
        )

    def comment(
        self, phase: str, issue: int, body: str, key: str, *, best_effort: bool = False
    ) -> bool:
        """Post ``body`` once per ``key``; True when it is on the forge.

        ``best_effort`` forgives only the forge's refusal of this comment itself
        (it answered, and would answer the same again: GitHub's 422 on a body it
        will not take). That is logged and a ``COMMENT_DROPPED`` event says so
        (``{key, issue, phase, reason}``); the phase goes on and False is
        returned. What would fail the workflow's other calls too is raised
        whatever ``best_effort`` says, so nothing is dropped unseen:
        ForgeUnavailable (the engine pauses the workflow ``forge_unavailable``; the
        phase posting again looks the comment up by its marker first, so it is
        posted once), ForgeAuthError, ForgeNotFound, FenceLost, StoreUnavailable.
        """
        marker = f"phasegate:{self.workflow_id}:{key}"
        params = {"issue": issue, "marker": marker}
        try:
            self._journaled(
                phase,
                "comment_posted",
                key,
                params,
                lambda: {"id": self.forge.comment(issue, f"{body}\n\n<!-- {marker} -->", marker)},
            )
        except ForgeError as exc:
            if not best_effort or isinstance(exc, _NOT_FORGIVEN):
                raise
            log.warning("comment %s on #%s not posted: %s", key, issue, exc)
            said = {"key": key, "issue": issue, "phase": phase, "reason": str(exc)}
            self.store.add_event(self.workflow_id, EventWrite(COMMENT_DROPPED, said))
            return False
        return True

    def merge(self, phase: str, number: int, message: str, head: str | None = None) -> str:
        """Merge pull request ``number`` once; with ``head``, only that head."""
        result = self._journaled(
            phase,
            "merge_completed",
            f"pr{number}",
            {"number": number},
            lambda: {"sha": self.forge.merge_pull_request(number, message, head)},
        )
        return str(result["sha"])

    def close_issue(self, phase: str, number: int) -> None:
        self._journaled(
            phase,
            "issue_closed",
            f"issue{number}",
            {"number": number},
            _then(lambda: self.forge.close_issue(number), {"number": number}),
        )

    # -- lookups: has the effect already happened? ------------------------------

    def _lookup(self, kind: str, params: Mapping[str, Any]) -> Result | None:
        forge = self.forge
        if kind in ("issue_created", "ticket_filed"):
            number = forge.find_issue(params["marker"])
            return None if number is None else {"number": number}
        if kind == "sub_issue_linked":
            found = forge.parent_issue(params["child"]) if isinstance(forge, SubIssues) else None
            return {"parent": found} if found == params["parent"] else None
        if kind == "branch_created":
            if not self.workspace.branch_exists(self.repo, params["branch"]):
                return None
            return {"sha": self.workspace.rev(self.repo, params["branch"])}
        if kind == "branch_pushed":
            return None  # publishing again is harmless; let it run
        if kind == "pr_created":
            number = forge.find_pull_request(params["head"])
            return None if number is None else {"number": number}
        if kind == "pr_updated":
            pr = forge.pull_request(params["number"])
            return {"number": pr.number} if pr.body == params["body"] else None
        if kind == "pr_closed":
            pr = forge.pull_request(params["number"])
            return {"number": pr.number} if pr.state != "open" else None
        if kind == "comment_posted":
            found = forge.find_comment(params["issue"], params["marker"])
            return None if found is None else {"id": found}
        if kind == "merge_completed":
            sha = forge.find_merge(params["number"])
            return None if sha is None else {"sha": sha}
        if kind == "issue_closed":
            issue = forge.issue(params["number"])
            return {"number": issue.number} if issue.state == "closed" else None
        raise PhasegateError(f"no lookup for effect {kind!r}")

    # -- the journal ------------------------------------------------------------

    def _journaled(
        self,
        phase: str,
        kind: str,
        key: str,
        params: Mapping[str, Any],
        call: Callable[[], Result],
    ) -> Result:
        write = MilestoneWrite(
            kind,
            status="in_progress",
            key=key,
            data={"params": dict(params)},
            summary=f"{key}: in progress",
        )
        if self.fence is not None:
            self.fence.check()
        dedupe_key = self.store.dedupe_key(self.workflow_id, phase, write)
        existing = self.store.milestone_by_key(dedupe_key)
        if existing is not None and existing.status == "completed":
            return dict(existing.data.get("result", {}))
        # A failed row is as uncertain as an in_progress one: a call that raised
        # (a forge timeout) may still have had its effect, so look before repeating.
        if existing is not None and existing.status in ("in_progress", "failed"):
            found = self._lookup(kind, params)
            if found is not None:
                self._settle(existing, found, "found after restart")
                return found
        row = self.store.write_milestone(self.workflow_id, phase, write)
        if self.fence is not None:
            self.fence.check()  # again, right before the effect: the row is evidence either way
        try:
            result = call()
        except Exception as exc:
            self.store.settle_milestone(row, "failed", summary=f"{kind}: {exc}")
            raise
        self._settle(row, result, "done")
        return result

    def _settle(self, row: MilestoneView, result: Result, how: str) -> None:
        label = row.dedupe_key.rsplit(":a0:", 1)[-1]
        shown = ", ".join(f"{k} {str(v)[:12] if k == 'sha' else v}" for k, v in result.items())
        self.store.settle_milestone(
            row, "completed", summary=f"{label}: {shown} ({how})", data={"result": result}
        )

    def reconcile(self) -> list[str]:
        """Settle every milestone a dead process left ``in_progress``; returns what was done.

        An effect found on the forge or in git is settled ``completed`` with
        what was found; one not found is ``cancelled`` (the phase repeats it
        under the same key). An agent process left running by a dead worker
        or a check (PROCESS_KINDS) left running by a dead worker is stopped,
        with every descendant it had. Other in-progress rows (a verifier that was running) are
        ``cancelled`` as interrupted.
        """
        if self.fence is not None:  # a stale worker would stop the live one's agents
            self.fence.check()
        notes = []
        for row in self.store.in_progress_milestones(self.workflow_id):
            if row.kind in EFFECT_KINDS:
                found = self._lookup(row.kind, row.data.get("params", {}))
                if found is not None:
                    self._settle(row, found, "found after restart")
                    notes.append(f"{row.kind}: found, settled completed")
                    continue
                self.store.settle_milestone(
                    row, "cancelled", summary=f"{row.kind}: interrupted, not found"
                )
                notes.append(f"{row.kind}: not found, will be repeated")
            elif row.kind in PROCESS_KINDS:
                notes.append(self._stop_orphan(row))
            else:
                self.store.settle_milestone(row, "cancelled", summary=f"{row.kind}: interrupted")
                notes.append(f"{row.kind}: interrupted")
        # What an agent run a dead process never checked left in refs and .git
        for role, _phase, violation in guard.recover(self.repo, self.workflow_id):
            notes.append(f"{violation.name} of a killed {role} run undone: {violation.detail}")
        return notes

    def _stop_orphan(self, row: MilestoneView) -> str:
        """Stop an agent or check a dead worker left running, so it cannot edit the
        worktree under the one that replaces it. Only a process on this host, in
        this boot, can be reached; one from an earlier boot is gone."""
        data = row.data
        if data.get("host") != host_name():
            how = (
                f"on host {data.get('host')}, not reachable from here "
                "(its supervisor stops it at the lease's deadline)"
            )
        elif data.get("boot", boot_id()) != boot_id():
            how = "already gone (the machine restarted)"
        elif kill_orphan_group(int(data["pgid"]), data.get("ticks")):
            how = "stopped"
        else:
            how = "already gone"
        self.store.settle_milestone(row, "cancelled", summary=f"{row.summary}: interrupted, {how}")
        noun = "check" if row.kind == "check_process" else "agent"
        return f"orphaned {noun} (pgid {data.get('pgid')}): {how}"
