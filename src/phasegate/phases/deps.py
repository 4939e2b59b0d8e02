"""PhaseDeps, and helpers every phase module shares: paths and answer parsing."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from phasegate.agents.env import cartridge_secrets, check_env
from phasegate.agents.ports import port_env
from phasegate.agents.service import AgentFailed, AgentService, AnswerError
from phasegate.clock import Clock
from phasegate.config.cartridge import Cartridge
from phasegate.core.contract import PR_REVIEW, MilestoneWrite, PhaseResult, WorkflowContext
from phasegate.core.state import WorkflowState
from phasegate.forge import Forge
from phasegate.git.workspace import CheckResult, Workspace
from phasegate.journal import ProcessJournal, SideEffects
from phasegate.proc.process import start_ticks
from phasegate.proc.sandbox import check_confinement
from phasegate.store import Store

__all__ = [
    "PhaseDeps",
    "Verdict",
    "agent_failure",
    "developed",
    "failure_result",
    "review_failure",
    "review_failure_result",
    "verdict_parser",
    "worktree_of",
]


@dataclass
class PhaseDeps:
    """Every side-effecting service a phase may use (docs/contracts/lifecycle.md: phase
    handlers)."""

    store: Store
    cartridge: Cartridge
    forge: Forge
    workspace: Workspace
    agents: AgentService
    effects: SideEffects
    clock: Clock
    shutdown: threading.Event

    def run_checks(self, cwd: Path) -> list[CheckResult]:
        """The cartridge's checks in ``cwd``, stopped by shutdown, each journaled.

        They see PATH, HOME, the locale, ``landing_areas.pass_env`` and the
        workflow's ports (``port_env``), never a key, and every secret value of
        phasegate's environment and of the cartridge's bindings is redacted (raw
        or encoded) from their output: a test that prints the environment must
        not carry a token into the store, a reason, or the next agent's prompt. Each
        check process has a ``check_process`` milestone while it runs
        (``ProcessJournal``), so a restarted worker stops what this one left
        running if it dies. Raises WorkflowPaused on shutdown, and when the
        lease's deadline stopped a check (``phasegate.proc.deadline``).
        """
        areas = self.cartridge.landing_areas
        workflow_id = self.effects.workflow_id
        phase = self.store.load_context(workflow_id).current_phase
        # A stale worker's check rows are the new holder's to settle, as its agents' are.
        journal = ProcessJournal(self.store, workflow_id, fence=self.effects.fence)
        with journal.spawning(phase, "check_process") as spawned:
            return self.workspace.run_checks(
                areas.checks,
                cwd,
                areas.check_timeout,
                self.shutdown,
                env={**check_env(areas.pass_env), **self.port_env()},
                secrets=cartridge_secrets(self.cartridge),
                confinement=check_confinement(areas.sandbox, network=areas.network),
                # Unique per run: the pid and start ticks of its supervisor.
                on_spawn=lambda command, pid: spawned(
                    pid, f"check {command!r}", f"{pid}.{start_ticks(pid)}"
                ),
            )

    def port_env(self) -> dict[str, str]:
        """The workflow's ports as variables (``agents.ports.port_env``): reserved on first
        use, empty when ``landing_areas.ports`` is 0. Raises PortsUnavailable."""
        return port_env(self.store, self.cartridge, self.effects.workflow_id)

    @property
    def limits(self):  # noqa: ANN201 - the cartridge's Limits
        return self.cartridge.limits


def agent_failure(
    exc: AgentFailed, *, milestones: tuple[MilestoneWrite, ...] = (), **result: Any
) -> PhaseResult:
    """The result of a role that failed every try: failed, or paused when a spend
    cap stopped the work (reason ``budget: ...``; a person raises the cap and
    resumes), never a crash."""
    return failure_result(exc.kind, str(exc), milestones=milestones, **result)


def review_failure(
    exc: AgentFailed, limit: int, *, milestones: tuple[MilestoneWrite, ...] = (), **result: Any
) -> PhaseResult:
    """``agent_failure`` for a review role (plan_review, review): one that gave no
    verdict it could read pauses the workflow, as an unreadable verifier does
    (``review_failure_result``)."""
    return review_failure_result(
        exc.role, exc.kind, str(exc), limit, milestones=milestones, **result
    )


def review_failure_result(
    role: str,
    kind: str,
    message: str,
    limit: int,
    *,
    milestones: tuple[MilestoneWrite, ...] = (),
    **result: Any,
) -> PhaseResult:
    """``failure_result`` for the review role ``role``: an error of kind
    ``garbage`` (no verdict it could read, ``limit`` times: the cartridge's
    ``limits.max_review_parse_failures``) pauses, naming the role and the cap;
    a person fixes the role's binding or prompt and resumes, and the phase
    asks again. Any other kind is ``failure_result``'s."""
    if kind != "garbage":
        return failure_result(kind, message, milestones=milestones, **result)
    reason = (
        f"{role} gave no verdict it could read, and stopped at the cap "
        f"(limits.max_review_parse_failures = {limit}): {message}; fix roles.{role} "
        "(its model, command or prompt), then `phasegate resume`"
    )
    return PhaseResult("pause", reason=reason, milestones=milestones, **result)


def failure_result(
    kind: str, message: str, *, milestones: tuple[MilestoneWrite, ...] = (), **result: Any
) -> PhaseResult:
    """``agent_failure`` for a failure known by its error ``kind`` and ``message``."""
    if kind == "budget":
        # A spent daily or monthly budget's message is a whole reason already, its
        # remedy named (agents.budgets: Budget.reason).
        reason = (
            message
            if message.startswith("budget: ")
            else f"budget: {message}; raise budget_usd or limits.workflow_budget_usd in "
            "phasegate.toml (commit it), then `phasegate resume`"
        )
        return PhaseResult("pause", reason=reason, milestones=milestones, **result)
    return PhaseResult("failed", reason=message, milestones=milestones, **result)


def developed(
    head: str,
    milestones: tuple[MilestoneWrite, ...],
    *,
    updates: dict[str, Any] | None = None,
    state: WorkflowState | None = None,
) -> PhaseResult:
    """development's success (docs/contracts/lifecycle.md: development): on to pr_review
    with ``head`` published, the round and the retry counters cleared;
    ``updates``/``state`` add to that."""
    return PhaseResult.advance(
        PR_REVIEW,
        updates={**(updates or {}), "current_round": 0, "user_feedback": None},
        state={
            **(state or {}),
            "test_retries": 0,
            "last_check_failure": None,
            "review_feedback": None,
            "ci_failure": None,
            "head_sha": head,
            "sync_base": False,
        },
        milestones=milestones,
    )


def worktree_of(ctx: WorkflowContext) -> Path:
    """The workflow's worktree path; raises ValueError before preparation set it."""
    if not ctx.worktree_path:
        raise ValueError(f"workflow {ctx.id} has no worktree yet")
    return Path(ctx.worktree_path)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    comments: str


_VERDICT_LINE = re.compile(r"^\s*\**\s*verdict\s*\**\s*[:=]\s*\**\s*([a-z_\-]+)", re.I | re.M)


def verdict_parser(allowed: Iterable[str]) -> Callable[[str], Verdict]:
    """A parser for answers that end in a verdict.

    Accepts a ``VERDICT: <word>`` line or a JSON object with ``verdict`` (and
    optionally ``comments``). Anything else, or a verdict outside ``allowed``,
    is an AnswerError: garbage, retried within the phase's bounds.
    """
    choices = tuple(allowed)

    def parse(text: str) -> Verdict:
        found: str | None = None
        comments = text.strip()
        for match in re.finditer(r"\{.*?\}", text, re.S):
            try:
                obj = json.loads(match.group(0))
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and isinstance(obj.get("verdict"), str):
                found = obj["verdict"]
                comments = str(obj.get("comments", "")) or comments
        lines = _VERDICT_LINE.findall(text)
        if lines:
            found = lines[-1]
            comments = _VERDICT_LINE.sub("", text).strip()
        if found is None:
            raise AnswerError(
                f"no verdict in the answer (expected a line 'VERDICT: {'|'.join(choices)}'); "
                f"got: {text.strip()[:200]!r}"
            )
        found = found.strip().lower().replace("-", "_")
        if found not in choices:
            raise AnswerError(f"verdict {found!r} is not one of {', '.join(choices)}")
        return Verdict(found, comments)

    return parse


def non_empty(text: str) -> str:
    """Parser for free-text answers: anything but blank."""
    if not text.strip():
        raise AnswerError("the answer is empty")
    return text.strip()
