"""The shell around the development graph (docs/contracts/graph.md: the harness): it
answers the graph's agent calls with the cartridge's runners, records the run and
its proposals, and checks a recorded run by replaying it offline.

    answers = RunnerAnswers(cartridge, repo, run_id)
    record, rows = propose(store, cartridge, answers, ticket=..., run_id=..., date=...)
    check = replay_check(store.run(run_id)["record"])   # check.identical

Every role runs read-only in the repository's checkout, build included: the
graph's build answers with a unified diff. Given ``repo``, the shell's check arm
applies each draft_pr_create patch in a detached worktree of HEAD it creates
(never the person's checkout), runs ``landing_areas.checks`` there and attaches
the results as a ``checks`` evidence row before anything is gated; the record's
``proposals`` stay the graph's own (a replay reproduces them) and the machine
evidence is kept beside them, under the record's ``harness`` key. Landing the
patch is the apply arm's work, after the gate. ``run_id`` and ``date`` come
from the caller; the graph has no clock.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from phasegate.agents import make_runner
from phasegate.agents.base import AgentRequest, AgentResult, Runner
from phasegate.agents.env import (
    cartridge_secrets,
    check_env,
    redact,
    secret_values,
)
from phasegate.agents.service import (
    AgentFailed,
    AgentService,
    AnswerError,
    answer_limit_of,
    checkout_state,
    oversized_answer,
    read_only_violation,
    secret_in_diff_answer,
)
from phasegate.config.cartridge import REVIEW_ROLES, Cartridge
from phasegate.core.autonomy import AutonomyPolicy
from phasegate.core.contract import PhasegateError, WorkflowContext, WorkflowPaused
from phasegate.git import guard
from phasegate.git.workspace import CheckResult, GitError, PatchError, Workspace
from phasegate.graph import (
    AgentCall,
    Answer,
    GraphError,
    answer_problem,
    canonical_json,
    replay,
    run_lifecycle,
)
from phasegate.graph.calls import asked_as, call_row, recorded_answer
from phasegate.graph.proposals import Evidence
from phasegate.proc.sandbox import agent_confinement, check_confinement
from phasegate.store import Store

__all__ = [
    "ProposeInterrupted",
    "ReplayCheck",
    "RunnerAnswers",
    "WorkflowAnswers",
    "build_manifest",
    "check_proposals",
    "first_difference",
    "propose",
    "replay_check",
    "with_harness",
]


class ProposeInterrupted(PhasegateError):
    """Shutdown was asked while an agent of the run worked; nothing is recorded."""


class RunnerAnswers:
    """Answers the graph's calls with the runners the cartridge binds.

    Each call runs ``role``'s runner in ``repo`` read-only, on a provider
    session of its own per graph thread, up to ``1 + limits.agent_retries``
    tries (a spend cap stops at once). A try whose answer the node that asked
    could not use (``graph.answer_problem``: no verdict, no diff, ...) is
    tried again like a failed one; when every try was such garbage, or the
    spend cap stops the retry of one, the last answer goes to the graph as it
    is and the node stops the graph by its own reason. The Answer sums the
    tries' tokens (counts), cost (USD) and seconds; a role that failed every
    try answers with its last ``error_kind`` (``phasegate.agents.ERROR_KINDS``).
    Spend caps: the role's ``budget_usd`` and ``limits.workflow_budget_usd``,
    counted over this run. A read-only role that changed the checkout fails with
    ``read_only_violation`` (and is undone when the checkout was clean); one
    that moved a ref or changed the git directory, with ``ref_violation`` or
    ``git_dir_violation`` (restored, ``phasegate.git.guard``).
    Text and errors are redacted of the role's secret values.

    ``runners`` overrides bindings by role (tests); ``on_call(call, answer)``
    hears each call twice, before it runs (``answer`` None) and with its
    answer; a set ``cancel`` raises ProposeInterrupted.
    """

    def __init__(
        self,
        cartridge: Cartridge,
        repo: Path,
        run_id: str,
        *,
        cancel: threading.Event | None = None,
        runners: Mapping[str, Runner] | None = None,
        on_call: Callable[[AgentCall, Answer | None], None] | None = None,
    ) -> None:
        self.cartridge = cartridge
        self.repo = repo
        self.run_id = run_id
        self.cancel = cancel or threading.Event()
        self.on_call = on_call
        self._runners: dict[str, Runner] = dict(runners or {})
        self._tries: dict[str, int] = {}
        self._spent: dict[str, float] = {}
        self._sessions: dict[str, str] = {}

    def runner(self, role: str) -> Runner:
        if role not in self._runners:
            self._runners[role] = make_runner(self.cartridge.role(role), self.repo)
        return self._runners[role]

    def budget_left(self, role: str) -> float | None:
        """USD ``role`` may still spend in this run, or None when uncapped."""
        left: list[float] = []
        role_cap = self.cartridge.role(role).budget_usd
        if role_cap is not None:
            left.append(role_cap - self._spent.get(role, 0.0))
        run_cap = self.cartridge.limits.workflow_budget_usd
        if run_cap is not None:
            left.append(run_cap - sum(self._spent.values()))
        return min(left) if left else None

    def __call__(self, call: AgentCall) -> Answer:
        if self.cancel.is_set():
            raise ProposeInterrupted(f"stopped before the {call.role} agent ran")
        binding = self.cartridge.role(call.role)
        runner = self.runner(call.role)
        secrets = sorted({*secret_values(binding), *cartridge_secrets(self.cartridge)})
        if self.on_call is not None:
            self.on_call(call, None)
        results: list[AgentResult] = []
        for _ in range(1 + self.cartridge.limits.agent_retries):
            if self.cancel.is_set():
                raise ProposeInterrupted(f"stopped before the {call.role} agent ran")
            budget = self.budget_left(call.role)
            if budget is not None and budget <= 0:
                if results and results[-1].ok:
                    break  # no retry of an unusable answer: the graph gets it as it is
                results.append(
                    AgentResult("", error_kind="budget", error="the spend cap is reached")
                )
                break
            result = self._try(call, runner, binding.timeout, budget)
            results.append(result)
            self._spent[call.role] = self._spent.get(call.role, 0.0) + result.cost_usd
            if result.session_id:
                self._sessions[call.thread] = result.session_id
            if result.error_kind == "interrupted" or self.cancel.is_set():
                raise ProposeInterrupted(f"stopped while the {call.role} agent ran")
            if result.ok and answer_problem(call, redact(result.text, secrets)) is None:
                break
            if result.error_kind == "budget":
                break
        last = results[-1]
        answer = Answer(
            redact(last.text, secrets),
            input_tokens=sum(r.input_tokens for r in results),
            output_tokens=sum(r.output_tokens for r in results),
            cost_usd=round(sum(r.cost_usd for r in results), 6),
            duration_s=round(sum(r.duration_s for r in results), 3),
            error_kind=last.error_kind,
            error=redact(last.error, secrets)[:4000] if last.error else None,
        )
        if self.on_call is not None:
            self.on_call(call, answer)
        return answer

    def _try(
        self, call: AgentCall, runner: Runner, timeout_s: float, budget: float | None
    ) -> AgentResult:
        index = self._tries.get(call.role, 0)
        self._tries[call.role] = index + 1
        binding = self.cartridge.role(call.role)
        request = AgentRequest(
            workflow_id=self.run_id,
            phase=call.node,
            role=call.role,
            session_line=call.thread,
            prompt=call.prompt,
            cwd=self.repo,
            timeout_s=timeout_s,
            read_only=True,  # build too: the graph's build returns a diff, nothing is applied
            call_index=index,
            session_id=self._sessions.get(call.thread),
            state_dir=self.repo / ".phasegate" / "agents" / self.run_id,
            budget_usd=budget,
            confinement=agent_confinement(
                binding.sandbox,
                network=binding.network,
                cwd=self.repo,
                state_dir=self.repo / ".phasegate" / "agents" / self.run_id,
                repo=self.repo,
            ),
        )
        before = checkout_state(self.repo)
        confined = request.confinement is not None and request.confinement.confined
        with guard.watch(
            self.repo, self.run_id, role=call.role, phase=call.node, confined=confined
        ) as watched:
            result = runner.run(request, self.cancel)
        result = watched.apply(result)  # refs and .git as they were
        if before is not None and checkout_state(self.repo) != before:
            result = read_only_violation(self.repo, call.role, result, undo=before == "")
        result = oversized_answer(result, answer_limit_of(self.cartridge, call.role, True))
        if call.role == "build":  # it answers with a diff: the proposal's patch to be
            binding = self.cartridge.role(call.role)
            secrets = sorted({*secret_values(binding), *cartridge_secrets(self.cartridge)})
            result = secret_in_diff_answer(result, secrets)
        return result


class WorkflowAnswers:
    """Answers the graph run ``run_id`` of a workflow, surviving restarts.

    The calls already kept for the run (``Store.graph_calls``) answer the
    graph while it asks them again, in order, with the same prompt; the first
    call that is new (or asked differently: the kept tail is stale) and every
    one after it goes to the workflow's AgentService (``phase``, ``round``;
    agent_runs, spend caps, retries, redaction, the read-only guard) in
    ``cwd``, and each answer is kept before it is returned. An answer the
    node that asked could not use (``graph.answer_problem``) is garbage to
    the service: recorded in agent_runs and asked again within
    ``limits.agent_retries`` (a review role's within
    ``limits.max_review_parse_failures``); only the accepted answer is kept,
    and a role that answered garbage every time answers with error kind
    ``garbage``.
    The graph is pure, so a phase killed at any moment is re-driven from its
    kept answers and asks the agents only what it never got an answer to (or
    what failed: a run resumed after a spend cap was raised asks that call
    again).

    Every role runs read-only, build included (the graph's build answers with
    a diff); each graph thread resumes its own provider session, named
    ``{session_tag}:{thread}``. A role that failed every try answers with
    its error kind (``budget`` when a spend cap stopped it), never raises;
    shutdown raises WorkflowPaused. ``replayed`` and ``asked`` count the
    calls answered each way.
    """

    def __init__(
        self,
        agents: AgentService,
        ctx: WorkflowContext,
        run_id: str,
        *,
        phase: str,
        cwd: Path,
        round: int = 0,
        session_tag: str = "g",
    ) -> None:
        self.agents = agents
        self.ctx = ctx
        self.run_id = run_id
        self.phase = phase
        self.cwd = cwd
        self.round = round
        self.session_tag = session_tag
        self.kept = agents.store.graph_calls(run_id)
        self.replayed = 0
        self.asked = 0

    def __call__(self, call: AgentCall) -> Answer:
        seq = self.replayed + self.asked
        if seq < len(self.kept) and self.asked == 0:
            # A kept failure is asked again: whoever resumed the run fixed its cause.
            if asked_as(call, self.kept[seq]) and not self.kept[seq]["error_kind"]:
                self.replayed += 1
                return recorded_answer(self.kept[seq])
            del self.kept[seq:]  # asked differently now: the kept tail is stale
        answer = self._ask(call)
        self.agents.store.add_graph_call(
            self.run_id, seq, call_row(seq, call, answer), workflow_id=self.ctx.id
        )
        self.asked += 1
        return answer

    def _ask(self, call: AgentCall) -> Answer:
        try:
            asked = self.agents.ask(
                self.ctx,
                self.phase,
                call.role,
                call.prompt,
                self.cwd,
                round=self.round,
                session_line=f"{self.session_tag}:{call.thread}"[:32],
                read_only=True,
                parse=_usable_for(call),
                garbage_limit=(
                    self.agents.cartridge.limits.max_review_parse_failures
                    if call.role in REVIEW_ROLES
                    else None
                ),
            )
        except AgentFailed as exc:
            return Answer("", error_kind=exc.kind, error=str(exc)[:4000])
        result = asked.result
        return Answer(
            asked.text,
            input_tokens=result.input_tokens,
            output_tokens=result.output_tokens,
            cost_usd=result.cost_usd,
            duration_s=round(result.duration_s, 3),
        )


def _usable_for(call: AgentCall) -> Callable[[str], str]:
    """An AgentService ``parse`` for ``call``: the text, or AnswerError (garbage,
    retried) when the node that asked could not use it."""

    def parse(text: str) -> str:
        problem = answer_problem(call, text)
        if problem is not None:
            raise AnswerError(problem)
        return text

    return parse


def propose(
    store: Store,
    cartridge: Cartridge,
    answers: Callable[[AgentCall], Answer],
    *,
    ticket: str,
    run_id: str,
    date: str,
    workflow_id: str | None = None,
    repo: Path | None = None,
    workspace: Workspace | None = None,
    cancel: threading.Event | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run the development graph on ``ticket`` and record it; return (record, proposal rows).

    With ``repo``, each draft_pr_create patch is first checked
    (``check_proposals``): its ``checks`` evidence is added to the stored
    proposal row and kept in the record under ``harness``; the record's
    ``proposals`` are the graph's, untouched. The record and its proposals are
    stored in one transaction, each proposal with the mode the cartridge's
    autonomy policy gives it. Raises GraphError when the cartridge cannot
    drive the graph (plan, build or review unbound, a tier without its roles),
    ProposeInterrupted (nothing recorded).
    """
    record = run_lifecycle(answers, run_id=run_id, date=date, cartridge=cartridge, ticket=ticket)
    extra: dict[str, list[Evidence]] = {}
    if repo is not None:
        if cancel is None and isinstance(answers, RunnerAnswers):
            cancel = answers.cancel
        checked = check_proposals(
            cartridge, repo, run_id, record["proposals"], workspace=workspace, cancel=cancel
        )
        if checked:
            record = with_harness(record, checked)
            extra = {pid: [Evidence("checks", data)] for pid, data in checked.items()}
    rows = store.record_run(
        record,
        policy=AutonomyPolicy.from_cartridge(cartridge),
        workflow_id=workflow_id,
        extra_evidence=extra,
    )
    return record, rows


def build_manifest(
    proposals: list[Mapping[str, Any]], checked: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """What the harness built, per draft_pr_create proposal it checked: its id, the
    commit the patch was applied to (``base``), the patch's SHA-256, the files it
    touches, the attempt the reviewers approved, whether it applied and whether
    the checks passed. Kept with the run (``record["harness"]["manifest"]``)
    before ``record_run`` stores it (docs/contracts/graph.md: recorded runs and replay)."""
    manifest = []
    for proposal in proposals:
        data = checked.get(str(proposal["id"]))
        if data is None:
            continue
        patch = str((proposal.get("payload") or {}).get("patch") or "")
        manifest.append(
            {
                "proposal": proposal["id"],
                "base": data.get("base"),
                "patch_sha256": hashlib.sha256(patch.encode("utf-8")).hexdigest(),
                "paths": list(proposal.get("paths") or []),
                "attempt": proposal.get("attempts"),
                "applied": bool(data.get("applied")),
                "checks_passed": bool(data.get("passed")),
            }
        )
    return manifest


def with_harness(
    record: Mapping[str, Any], checked: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """``record`` with the harness's machine evidence beside the graph's own proposals:
    ``harness.checks`` (by proposal id) and ``harness.manifest`` (``build_manifest``)."""
    manifest = build_manifest(list(record["proposals"]), checked)
    return {**record, "harness": {"checks": dict(checked), "manifest": manifest}}


def check_proposals(
    cartridge: Cartridge,
    repo: Path,
    run_id: str,
    proposals: list[Mapping[str, Any]],
    *,
    workspace: Workspace | None = None,
    cancel: threading.Event | None = None,
    run_checks: Callable[[Path], list[CheckResult]] | None = None,
) -> dict[str, dict[str, Any]]:
    """The ``checks`` evidence of each draft_pr_create proposal with a patch, by its id.

    Each patch is applied in a detached worktree of ``repo``'s HEAD at a fixed
    scratch path (``<run_id>-harness``, reclaimed if a crash left it, removed
    afterwards), and ``landing_areas.checks`` run there with the check
    environment, its timeout, and phasegate's secret values redacted from the
    output. The data: ``applied``, ``error`` (when the patch or the worktree
    failed), ``base`` (the commit checked), ``results`` (each check's command,
    exit_code, passed, duration_s, output tail, timed_out) and ``passed``
    (applied and every check passed). ``run_checks(tree)`` runs them (a
    workflow's ``PhaseDeps.run_checks``, which journals each check process);
    None runs them unjournaled, stopped by ``cancel``. Raises
    ProposeInterrupted when a shutdown stops a check.
    """
    workspace = workspace or Workspace()
    areas = cartridge.landing_areas

    def unjournaled(tree: Path) -> list[CheckResult]:
        return workspace.run_checks(
            areas.checks,
            tree,
            areas.check_timeout,
            cancel,
            env=check_env(areas.pass_env),
            secrets=cartridge_secrets(cartridge),
            confinement=check_confinement(areas.sandbox, network=areas.network),
        )

    run_checks = run_checks or unjournaled
    found: dict[str, dict[str, Any]] = {}
    for proposal in proposals:
        patch = (proposal.get("payload") or {}).get("patch")
        if proposal.get("kind") != "draft_pr_create" or not isinstance(patch, str) or not patch:
            continue
        data: dict[str, Any] = {"applied": False, "base": None, "results": [], "passed": False}
        try:
            base = workspace.rev(repo, "HEAD")
            data["base"] = base
            scratch = workspace.scratch_path(repo, f"{run_id}-harness")
            with workspace.temporary_checkout(repo, base, scratch) as tree:
                try:
                    workspace.apply_patch(tree, patch)
                except PatchError as exc:
                    data["error"] = str(exc)[:4000]
                else:
                    data["applied"] = True
                    results = run_checks(tree)
                    data["results"] = [r.as_dict() for r in results]
                    data["passed"] = all(r.passed for r in results)
        except WorkflowPaused as exc:
            raise ProposeInterrupted(f"stopped while the checks ran: {exc}") from None
        except (GitError, OSError) as exc:
            data["error"] = redact(str(exc), cartridge_secrets(cartridge))[:4000]
        found[str(proposal["id"])] = data
    return found


@dataclass(frozen=True)
class ReplayCheck:
    """What replaying a recorded run gave: ``identical`` proposals (canonical
    JSON, byte for byte), or the first ``difference`` as a sentence."""

    run_id: str
    identical: bool
    difference: str | None = None
    recorded: list[Any] = field(default_factory=list)
    replayed: list[Any] | None = None


def replay_check(record: Mapping[str, Any]) -> ReplayCheck:
    """Re-run ``record`` offline from its own answers and compare the proposals.

    A replay that diverges (a call the record does not hold) or cannot run
    (a record whose rules or calls were altered) is a difference too.
    """
    run_id = str(record.get("run_id"))
    recorded = list(record.get("proposals") or [])
    try:
        replayed = replay(dict(record))["proposals"]
    except GraphError as exc:
        return ReplayCheck(run_id, False, f"the replay diverged: {exc}", recorded)
    except (KeyError, TypeError, ValueError) as exc:
        return ReplayCheck(run_id, False, f"the record does not replay: {exc!r}", recorded)
    if canonical_json(recorded) == canonical_json(replayed):
        return ReplayCheck(run_id, True, None, recorded, replayed)
    return ReplayCheck(
        run_id, False, first_difference(recorded, replayed, "proposals"), recorded, replayed
    )


def first_difference(recorded: Any, replayed: Any, path: str = "") -> str:
    """Where two JSON values first differ (keys sorted, lists in order), as a sentence.

    Call it only for values whose ``canonical_json`` differs.
    """
    if isinstance(recorded, Mapping) and isinstance(replayed, Mapping):
        for key in sorted(set(recorded) | set(replayed)):
            here = f"{path}.{key}" if path else str(key)
            if key not in replayed:
                return f"{here}: recorded, missing from the replay"
            if key not in recorded:
                return f"{here}: in the replay, not recorded"
            if canonical_json(recorded[key]) != canonical_json(replayed[key]):
                return first_difference(recorded[key], replayed[key], here)
    if isinstance(recorded, list) and isinstance(replayed, list):
        for i, (a, b) in enumerate(zip(recorded, replayed, strict=False)):
            if canonical_json(a) != canonical_json(b):
                return first_difference(a, b, f"{path}[{i}]")
        if len(recorded) != len(replayed):
            return f"{path}: {len(recorded)} recorded, {len(replayed)} replayed"
    return f"{path}: recorded {_short(recorded)}, replayed {_short(replayed)}"


def _short(value: Any, limit: int = 120) -> str:
    text = canonical_json(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
