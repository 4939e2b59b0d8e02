"""AgentService: how phases call agents.

It binds roles to runners, retries within bounds, records every call's usage
and keeps one provider session per line.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from phasegate.agents import make_runner
from phasegate.agents.base import AgentRequest, AgentResult, Runner, Violation
from phasegate.agents.budgets import calendar_budget, stop_reason
from phasegate.agents.env import cartridge_secrets, files_with_secrets, redact, secret_values
from phasegate.agents.output import OutputLog
from phasegate.agents.ports import port_env
from phasegate.agents.slots import CallSlots
from phasegate.config.cartridge import READ_ONLY_ROLES, ROLE_SESSION_LINES, Cartridge
from phasegate.core.contract import (
    EventWrite,
    PhasegateError,
    WorkflowContext,
    WorkflowPaused,
)
from phasegate.git import guard
from phasegate.git.command import changes, note_change
from phasegate.git.workspace import GitError, Workspace, git
from phasegate.journal import ProcessJournal
from phasegate.proc.sandbox import agent_confinement
from phasegate.store import AgentRunRecord, Fence, FenceLost, Store

__all__ = [
    "AgentFailed",
    "AgentService",
    "AnswerError",
    "Answer",
    "CheckoutSeen",
    "answer_limit_of",
    "oversized_answer",
    "secret_in_diff_answer",
    "violation_event",
]

T = TypeVar("T")


@dataclass(frozen=True)
class CheckoutSeen:
    """What phasegate last saw of one workflow's checkout at ``path``: ``healthy``
    (the self-heal's check passed), ``clean`` (git's status listed nothing), when
    ``_git.changes()`` was ``changes``, under the lease ``fence``. It holds while
    that lease is held and nothing that may write a checkout has run since (any
    thread's: ``_git.note_change``); a new advance takes a new lease, so what a
    person did between two advances is looked at again."""

    path: Path
    fence: Fence
    changes: int
    healthy: bool
    clean: bool


class AnswerError(PhasegateError):
    """An agent answered, but not in the form the phase needs (garbage)."""


class AgentFailed(PhasegateError):
    """A role failed every try it was allowed. ``kind`` is the last error kind;
    ``reason`` is the whole pause reason when the failure composed its own (a
    spent daily or monthly budget: ``Budget.reason``), else None."""

    def __init__(
        self, role: str, tries: int, kind: str, detail: str, *, reason: str | None = None
    ) -> None:
        if reason is not None:
            super().__init__(reason)
        elif tries == 0:
            super().__init__(f"{role} agent not run: {kind}: {detail}")
        else:
            super().__init__(f"{role} agent failed {tries} time(s); last: {kind}: {detail}")
        self.role = role
        self.kind = kind
        self.reason = reason


@dataclass(frozen=True)
class Answer:
    """A successful call: the raw result and what ``parse`` made of its text."""

    result: AgentResult
    parsed: Any

    @property
    def text(self) -> str:
        return self.result.text


class AgentService:
    """Calls roles for the phases of one workflow engine.

    ``runners`` overrides the cartridge's bindings by role name (tests inject
    fakes here); ``cancel`` is the engine's shutdown flag. ``fences`` maps a
    workflow id to the lease it is advanced under (the engine keeps it): no
    agent starts, and no finished call is recorded, once that lease is lost.
    """

    def __init__(
        self,
        store: Store,
        cartridge: Cartridge,
        repo: Path,
        cancel: threading.Event,
        runners: Mapping[str, Runner] | None = None,
        emit: Callable[[str, EventWrite], None] | None = None,
    ) -> None:
        self.store = store
        self.cartridge = cartridge
        self.repo = repo
        self.cancel = cancel
        self._runners: dict[str, Runner] = dict(runners or {})
        self._making = threading.Lock()
        self._emit = emit or (lambda _wf, _ev: None)
        self.fences: dict[str, Fence] = {}
        self.slots = CallSlots(store, cartridge, cancel, self._emit, self.fences)
        # Per workflow, never shared between them: a concurrent worker runs many.
        self._seen: dict[str, CheckoutSeen] = {}

    def seen(self, workflow_id: str, path: Path) -> CheckoutSeen | None:
        """What phasegate saw of ``workflow_id``'s checkout at ``path`` that still
        holds (``CheckoutSeen``), or None: look again."""
        seen = self._seen.get(workflow_id)
        if seen is None:
            return None
        fence = self.fences.get(workflow_id)
        if (
            fence is not seen.fence
            or fence.lost.is_set()
            or seen.changes != changes()
            or seen.path != Path(os.path.realpath(path))
        ):
            self._seen.pop(workflow_id, None)
            return None
        return seen

    def saw(self, workflow_id: str, path: Path, at: int, *, healthy: bool, clean: bool) -> None:
        """Remember what a look at ``workflow_id``'s checkout at ``path`` found; ``at``
        is ``_git.changes()`` taken before the look. Nothing is kept outside a
        lease (no fence: an advance this engine does not hold)."""
        fence = self.fences.get(workflow_id)
        if fence is not None:
            self._seen[workflow_id] = CheckoutSeen(
                Path(os.path.realpath(path)), fence, at, healthy, clean
            )

    def _check_fence(self, workflow_id: str) -> None:
        """Raise FenceLost when the workflow's lease was taken over from this worker."""
        fence = self.fences.get(workflow_id)
        if fence is not None:
            fence.check()

    def runner(self, role: str) -> Runner:
        # The worker's threads share the service: one runner per role, made once.
        with self._making:
            if role not in self._runners:
                self._runners[role] = make_runner(self.cartridge.role(role), self.repo)
            return self._runners[role]

    def ask(
        self,
        ctx: WorkflowContext,
        phase: str,
        role: str,
        prompt: str,
        cwd: Path,
        *,
        round: int = 0,
        attempt: int = 0,
        pass_number: int = 1,
        parse: Callable[[str], Any] | None = None,
        retries: int | None = None,
        session_line: str | None = None,
        read_only: bool | None = None,
        garbage_limit: int | None = None,
    ) -> Answer:
        """Call ``role`` until it answers and ``parse`` accepts the answer.

        Tries ``1 + retries`` times (default ``limits.agent_retries``), and
        stops after ``garbage_limit`` answers ``parse`` refused (None: no such
        cap; a review role's ``limits.max_review_parse_failures``); every
        try is recorded in ``agent_runs`` with its usage, its text and error
        with every secret value redacted. While the agent runs, what it prints
        is written as throttled, redacted, bounded ``agent_output`` events
        (``agents.output.OutputLog``). ``session_line`` (default: the
        role's, ROLE_SESSION_LINES) names the provider session the call
        resumes; ``read_only`` (default: whether the role is in
        READ_ONLY_ROLES) overrides the role's access, as the development graph
        does for its build, which answers with a diff. ``pass_number`` above 1 (a
        later review of the same round's change) goes into the ``agent_started``
        event as ``pass``. Every try is guarded
        (``phasegate.git.guard``): refs, HEADs, the git config, hooks and ``info/``
        the agent changed are restored and the try fails with
        ``ref_violation``/``git_dir_violation``, like any failed call. Raises AgentFailed when
        all tries fail (exit code, timeout, garbage, ...) or at once when a
        spend cap is reached (kind ``budget``); WorkflowPaused when shutdown
        interrupts a call, or when the lease's deadline stopped it
        (``self_fenced``, not recorded), or shutdown ends its wait for a slot
        under the queue's caps (``agents.slots``); FenceLost before a call, or
        after one without recording it, once the workflow's lease was taken over
        (``fences``).
        """
        binding = self.cartridge.role(role)
        runner = self.runner(role)
        line = session_line or ROLE_SESSION_LINES.get(role, "fresh")
        if read_only is None:
            read_only = role in READ_ONLY_ROLES
        secrets = sorted({*secret_values(binding), *cartridge_secrets(self.cartridge)})
        # No secret reaches an agent, whoever wrote it into the text: a person's
        # comment, a ticket, a check's output.
        prompt = redact(prompt, secrets)
        answer_limit = answer_limit_of(self.cartridge, role, read_only)
        tries = 1 + (self.cartridge.limits.agent_retries if retries is None else retries)
        kind, detail = "runner_error", "not run"
        made = 0  # calls that ran: what the failure message counts
        reason: str | None = None  # a spent daily or monthly budget's pause reason
        garbage = 0  # answers parse refused
        for _ in range(tries):
            if self.cancel.is_set():
                raise WorkflowPaused(f"shutdown before the {role} agent ran")
            self._check_fence(ctx.id)
            budget = self.budget_left(ctx.id, role)
            if budget is not None and budget <= 0:
                moment = f"before the {role} agent ran" + (" again" if made else "")
                spent = stop_reason(self.store, self.cartridge, ctx.id, moment)
                if made == 0:
                    why = spent or "the spend cap is reached before the call"
                    raise AgentFailed(role, 0, "budget", why, reason=spent)
                kind, detail = "budget", f"the spend cap is reached after: {detail or 'a call'}"
                reason = spent
                break
            state_dir = self.repo / ".phasegate" / "agents" / ctx.id
            output = OutputLog(
                lambda event: self._emit_live(ctx.id, event),
                secrets,
                role=role,
                phase=phase,
                round=round,
            )
            request = AgentRequest(
                workflow_id=ctx.id,
                phase=phase,
                role=role,
                session_line=line,
                prompt=prompt,
                cwd=cwd,
                timeout_s=binding.timeout,
                read_only=read_only,
                call_index=self.store.count_agent_runs(ctx.id, role),
                session_id=self.store.provider_session(ctx.id, line),
                state_dir=state_dir,
                budget_usd=budget,
                env=port_env(self.store, self.cartridge, ctx.id),
                confinement=agent_confinement(
                    binding.sandbox,
                    network=binding.network,
                    cwd=cwd,
                    state_dir=state_dir,
                    repo=self.repo,
                ),
                on_output=output.feed,
            )
            # The status phasegate took of the checkout since its last change (the
            # self-heal's, the previous read-only run's) is its status now.
            known = self.seen(ctx.id, cwd)
            clean_before = request.read_only and (
                (known is not None and known.clean) or checkout_state(cwd) == ""
            )
            confined = request.confinement is not None and request.confinement.confined
            note_change()  # an agent in this process (scripted, api) writes too
            started = {"role": role, "phase": phase, "round": round, "runner": runner.name}
            if pass_number > 1:
                started["pass"] = pass_number
            with (
                # a slot under each cap it counts against, given back as its process ends
                self.slots.held(ctx.id, role, phase, EventWrite("agent_started", started)) as held,
                output,
                guard.watch(cwd, ctx.id, role=role, phase=phase, confined=confined) as watched,
            ):
                result = self._run_journaled(ctx, phase, runner, request, round)
            result = watched.apply(result)  # refs and .git as they were
            note_change()
            for earlier in watched.recovered:  # what a killed run left, undone now
                self._emit(ctx.id, violation_event(*earlier, secrets, round=ctx.dev_round))
            made += 1
            # The worker that took over owns the workflow's rows now: its
            # reconciliation settled this call's process; write nothing of it.
            self._check_fence(ctx.id)
            fenced = result.error if result.error_kind == "self_fenced" else None
            if clean_before:
                at = changes()
                if checkout_state(cwd) != "":
                    result = read_only_violation(cwd, role, result)
                else:
                    self._saw_clean_after(ctx, cwd, at, known)
            if result.error_kind == "interrupted":
                raise WorkflowPaused(f"shutdown while the {role} agent ran")
            if fenced is not None:
                # The lease is still this worker's (checked above), but it was not
                # renewed in time: the phase starts again from its last commit.
                raise WorkflowPaused(f"the {role} agent was stopped: {fenced}")
            result = oversized_answer(result, answer_limit)
            if role == "build" and read_only:
                result = secret_in_diff_answer(result, secrets)
            # A NUL can go neither into the next agent's environment nor into a
            # PostgreSQL text column, so an answer never carries one further.
            result = replace(
                result,
                text=redact(result.text, secrets).replace("\x00", "\ufffd"),
                error=redact(result.error, secrets).replace("\x00", "\ufffd")
                if result.error
                else None,
            )
            parsed, outcome = None, "ok"
            kind, detail = result.error_kind or "", result.error or ""
            if result.ok and parse is not None:
                try:
                    parsed = parse(result.text)
                except AnswerError as exc:
                    outcome, kind, detail = "garbage", "garbage", str(exc)
            elif not result.ok:
                outcome = "failed"
            self._record(
                ctx, phase, role, line, runner.name, round, attempt, outcome, kind, detail, result,
                model=binding.model or "", started_at=held.since,
            )  # fmt: skip
            for violation in result.violations:
                self._emit(
                    ctx.id, violation_event(role, phase, violation, secrets, round=ctx.dev_round)
                )
            self._emit(
                ctx.id,
                EventWrite(
                    "agent_finished", {"role": role, "outcome": outcome, "error": detail or None}
                ),
            )
            if outcome == "ok":
                return Answer(result, parsed)
            if kind == "budget":  # the runner's own stop: another try would only spend more
                moment = f"while the {role} agent ran"
                reason = stop_reason(self.store, self.cartridge, ctx.id, moment)
                break
            garbage += outcome == "garbage"
            if garbage_limit is not None and garbage >= garbage_limit:
                break  # the phase pauses on it: another unreadable answer would only cost
        raise AgentFailed(role, made, kind, detail, reason=reason)

    def _emit_live(self, workflow_id: str, event: EventWrite) -> None:
        """An event written while an agent runs (its output), as the journal writes
        a side effect: only after a look that this worker still holds the lease (a
        worker stopped for a while finds it taken over and writes nothing, for
        the worker that took over owns the rows). Raises StoreUnavailable."""
        fence = self.fences.get(workflow_id)
        if fence is not None:
            try:
                fence.check()
            except FenceLost:
                return  # the call's own check says so, after the run
        self._emit(workflow_id, event)

    def _saw_clean_after(
        self, ctx: WorkflowContext, cwd: Path, at: int, known: CheckoutSeen | None
    ) -> None:
        """A read-only run left its checkout clean: remember so. Healthy still, when
        it was before: the guard put refs and HEADs back, a clean status means no
        tracked file is missing, and git's files (the ``.git`` file, the git dir,
        HEAD: read, no git) are checked again here, for status ran wherever the
        ``.git`` file led it."""
        healthy = (
            known is not None
            and known.healthy
            and ctx.branch_name is not None
            and Workspace().checkout_health(cwd, ctx.branch_name, ask_git=False)[0] is None
        )
        self.saw(ctx.id, cwd, at, healthy=healthy, clean=True)

    def budget_left(self, workflow_id: str, role: str) -> float | None:
        """USD this role may still spend in the workflow: the least of what its
        ``budget_usd``, ``limits.workflow_budget_usd`` and the daily and monthly
        budgets of its repository and of the store leave (``agents.budgets``);
        None when uncapped."""
        left: list[float] = []
        role_cap = self.cartridge.role(role).budget_usd
        if role_cap is not None:
            left.append(role_cap - self.store.usage_totals(workflow_id, role=role).cost_usd)
        workflow_cap = self.cartridge.limits.workflow_budget_usd
        if workflow_cap is not None:
            left.append(workflow_cap - self.store.usage_totals(workflow_id).cost_usd)
        spent = calendar_budget(self.store, self.cartridge, workflow_id)
        if spent is not None:
            left.append(spent.left_usd)
        return min(left) if left else None

    def _run_journaled(
        self, ctx: WorkflowContext, phase: str, runner: Runner, request: AgentRequest, round: int
    ) -> AgentResult:
        """Run the call with an ``agent_process`` milestone for the process it spawns.

        The milestone is evidence written before the agent works: a restarted
        worker reads it to stop an agent its dead predecessor left running
        (``SideEffects.reconcile``). It is settled when the call returns.
        """
        journal = ProcessJournal(self.store, ctx.id, fence=self.fences.get(ctx.id))
        with journal.spawning(
            phase, "agent_process", round=round, attempt=request.call_index
        ) as spawned:
            return runner.run(
                request,
                self.cancel,
                lambda pid: spawned(pid, f"{request.role} agent", request.role),
            )

    def _record(
        self,
        ctx: WorkflowContext,
        phase: str,
        role: str,
        line: str,
        runner: str,
        round: int,
        attempt: int,
        outcome: str,
        kind: str,
        detail: str,
        result: AgentResult,
        *,
        model: str = "",
        started_at: datetime | None = None,
    ) -> None:
        self.store.record_agent_run(
            AgentRunRecord(
                workflow_id=ctx.id,
                phase=phase,
                role=role,
                session_line=line,
                runner=runner,
                round=round,
                attempt=attempt,
                outcome=outcome,
                error_kind=kind or None,
                error=detail[:4000] or None,
                input_tokens=result.input_tokens,
                output_tokens=result.output_tokens,
                cost_usd=result.cost_usd,
                duration_s=round_s(result.duration_s),
                session_id=result.session_id,
                model=model,
                started_at=started_at,
            )
        )
        if result.session_id:
            self.store.bind_provider_session(ctx.id, line, runner, result.session_id)


def checkout_state(cwd: Path) -> str | None:
    """``git status --porcelain -uall`` of the checkout at ``cwd`` ("" when clean),
    None outside git."""
    try:
        return git(["status", "--porcelain", "-uall"], cwd)
    except (GitError, OSError):
        return None


def read_only_violation(
    cwd: Path, role: str, result: AgentResult, *, undo: bool = True
) -> AgentResult:
    """A read-only role changed its checkout: fail the call (``read_only_violation``).

    With ``undo`` the change is put back first: only when the checkout was
    clean before the call, so resetting it loses nothing of anyone else's and
    the change cannot leak into the next phase's commit.
    """
    changed = [line[3:] for line in git(["status", "--porcelain", "-uall"], cwd).splitlines()]
    if undo:
        git(["reset", "--hard", "-q"], cwd)
        git(["clean", "-ffdq"], cwd)  # -ff: a repository nested in it goes too
    done = "undone" if undo else "left as they are (the checkout had edits before)"
    error = f"the read-only {role} role changed {len(changed)} path(s), {done}: " + ", ".join(
        changed[:5]
    )
    return replace(
        result,
        error_kind="read_only_violation",
        error=error,
        violations=(
            *result.violations,
            Violation("read_only_violation", error, tuple(changed)),
        ),
    )


#: What is kept of an oversized answer: its head, then this marker.
OVERSIZED_MARKER = "\n[... answer truncated by phasegate: {size} bytes > limit {limit} ...]"
_OVERSIZED_HEAD = 2000  # characters


def answer_limit_of(cartridge: Cartridge, role: str, read_only: bool) -> int:
    """Bytes an answer of ``role`` may hold: ``limits.max_answer_bytes``, or
    ``limits.max_diff_bytes`` for the graph's build (it answers with a diff:
    ``build`` asked read-only)."""
    limits = cartridge.limits
    if role == "build" and read_only:
        return max(limits.max_answer_bytes, limits.max_diff_bytes)
    return limits.max_answer_bytes


def oversized_answer(result: AgentResult, limit: int) -> AgentResult:
    """``result`` unchanged when its text is at most ``limit`` bytes (UTF-8); else a
    failed call (error kind ``oversized``, an ``oversized`` violation naming the
    size) whose text is the answer's first 2000 characters and a marker: an
    answer above the limit is never kept, parsed or stored whole."""
    if len(result.text) <= limit // 4:
        return result  # at most 4 bytes a character: within the limit, no encoding needed
    size = len(result.text.encode("utf-8", errors="replace"))
    if size <= limit:
        return result
    detail = f"the answer is {size} bytes > limit {limit} (limits.max_answer_bytes); refused"
    return replace(
        result,
        text=result.text[:_OVERSIZED_HEAD] + OVERSIZED_MARKER.format(size=size, limit=limit),
        error_kind="oversized",
        error=detail,
        violations=(*result.violations, Violation("oversized", detail)),
    )


def secret_in_diff_answer(result: AgentResult, secrets: list[str]) -> AgentResult:
    """``result`` unchanged unless its text, the graph's build answer (a unified
    diff, the proposal's patch to be), holds a secret value raw or encoded in a
    file section; then a failed call (error kind ``secret_in_change``, a
    ``secret_in_change`` violation naming the files, never the value)."""
    if not result.ok:
        return result
    files = files_with_secrets(result.text, secrets)
    if not files:
        return result
    detail = (
        f"the diff held a secret value (raw or encoded) in {len(files)} file(s): "
        + ", ".join(files[:10])
        + "; refused"
    )
    return replace(
        result,
        error_kind="secret_in_change",
        error=detail,
        violations=(*result.violations, Violation("secret_in_change", detail, tuple(files[:50]))),
    )


def violation_event(
    role: str,
    phase: str,
    violation: Violation,
    secrets: list[str] | None = None,
    *,
    round: int | None = None,
) -> EventWrite:
    """The ``violation`` event ``show`` prints: name, role, phase, the development
    round it happened in (the merge gate holds that round's merge), detail and up
    to 50 paths, each redacted of ``secrets``."""
    hide = secrets or []
    return EventWrite(
        "violation",
        {
            "name": violation.name,
            "role": role,
            "phase": phase,
            "round": round,
            "detail": redact(violation.detail, hide)[:2000],
            "paths": [redact(p, hide) for p in violation.paths[:50]],
        },
    )


def round_s(seconds: float) -> float:
    return float(f"{seconds:.3f}")
