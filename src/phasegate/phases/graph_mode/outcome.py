"""What a graph run's record means for its phase: the milestones it leaves, its one-line
summaries, and the result when an agent's failure ended it.

``graph_mode.run`` drives the runs; these read a run's record (``graph.drive``)
and the harness's checks of its draft, and change nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from phasegate.config.cartridge import REVIEW_ROLES
from phasegate.core.contract import MilestoneWrite, PhaseResult, WorkflowContext
from phasegate.core.state import WorkflowState
from phasegate.phases.deps import failure_result, review_failure_result

__all__ = [
    "agents_failed",
    "check_failure",
    "plan_failed",
    "plan_summary",
    "run_summary",
    "tests_run",
    "why_nothing",
]


def plan_failed(
    run: Mapping[str, Any], key: str, why: str, stop: Mapping[str, Any], kind: str = "plan_failed"
) -> MilestoneWrite:
    """The milestone of a planning the graph stopped (``kind``: ``plan_failed``, failed;
    another kind is completed), saying why and where the run stopped."""
    return MilestoneWrite(
        kind,
        status="failed" if kind == "plan_failed" else "completed",
        round=1,
        key=key,
        summary=why[:500],
        data={"run_id": run["graph_run"], "stopped": dict(stop)},
    )


def plan_summary(planned: Mapping[str, Any]) -> str:
    """One line for the plan's milestone: which plan won, what the adversary did."""
    parts = ["planned by the development graph"]
    if planned["plan_competition"]:
        competition = planned["plan_competition"]
        parts.append(f"{competition['choice']} plan chosen")
    if planned["plan_attack"]:
        attack = planned["plan_attack"]
        parts.append("revised after the adversary" if attack["revised"] else "adversary: proceed")
    return "; ".join(parts)


def check_failure(checked: Mapping[str, Any]) -> str:
    """What failed, for the next run's ticket: the patch's apply error or each failing
    check's command, exit code and output tail."""
    if checked.get("error"):
        return f"the patch did not apply to the branch ({checked['error']})"
    parts = []
    for check in checked.get("results") or []:
        if not check.get("passed"):
            how = "timed out" if check.get("timed_out") else f"exit code {check.get('exit_code')}"
            parts.append(
                f"$ {check.get('command')}  ({how})\n{str(check.get('output', ''))[-1500:]}"
            )
    return "the checks failed:\n" + ("\n\n".join(parts) or "(no output)")


def agents_failed(
    record: Mapping[str, Any],
    *,
    state: WorkflowState,
    milestones: tuple[MilestoneWrite, ...],
    updates: dict[str, Any] | None = None,
    review_limit: int = 0,
) -> PhaseResult | None:
    """The result of a run an agent's failure ended, as outside graph mode: a spend cap
    reached pauses (``budget: ...``), a review role without a readable verdict
    ``review_limit`` times (``limits.max_review_parse_failures``) pauses, any other
    role that failed every try fails the workflow. None when the run ended for
    another reason (a verdict, a fix loop stop)."""
    stopped = record.get("stopped") or {}
    loop = record.get("fix_loop") or {}
    if stopped.get("reason") != "agent_failed" and loop.get("stop") != "budget":
        return None
    failures = [c for c in record["calls"] if c.get("error_kind")]
    if not failures:
        return None
    last = failures[-1]
    message = str(last.get("error") or f"{last['role']}: {last['error_kind']}")
    if last["role"] in REVIEW_ROLES:
        return review_failure_result(
            str(last["role"]),
            str(last["error_kind"]),
            message,
            review_limit,
            state=state,
            milestones=milestones,
            updates=dict(updates or {}),
        )
    return failure_result(
        str(last["error_kind"]),
        message,
        state=state,
        milestones=milestones,
        updates=dict(updates or {}),
    )


def tests_run(
    ctx: WorkflowContext, draft: Mapping[str, Any], checked: Mapping[str, Any], key: str
) -> MilestoneWrite:
    """The ``tests_run`` milestone of the harness's checks of proposal ``draft``."""
    results: Sequence[Mapping[str, Any]] = checked.get("results") or []
    passed = bool(checked.get("passed"))
    summary = f"{sum(bool(r.get('passed')) for r in results)}/{len(results)} checks passed"
    if checked.get("error"):
        summary = f"the patch did not apply: {str(checked['error'])[:200]}"
    return MilestoneWrite(
        "tests_run",
        round=ctx.dev_round,
        key=key,
        status="completed" if passed else "failed",
        summary=f"{summary} on proposal {draft['id']}",
        data={
            "checks": list(results),
            "passed": passed,
            "base": checked.get("base"),
            "proposal": draft["id"],
            "attempt": draft["attempts"],
        },
    )


def run_summary(record: Mapping[str, Any], draft: Mapping[str, Any] | None) -> str:
    """One line for ``show``: the run (what ``replay`` takes) and what it proposed."""
    loop = record["fix_loop"]
    if draft is not None:
        return (
            f"run {record['run_id']}: draft PR {draft['id']} proposed ({draft['mode']}), "
            f"attempt {loop['approved_attempt']} of {loop['attempts']} approved"
        )
    return f"run {record['run_id']}: {why_nothing(record)}"[:500]


def why_nothing(record: Mapping[str, Any]) -> str:
    """Why the run proposed nothing: where the graph stopped, or why the fix loop
    stopped, with the standing objections and the last review's findings."""
    stopped = record.get("stopped")
    if stopped:
        return f"the graph stopped at {stopped['node']}: {stopped['reason']}: {stopped['detail']}"
    loop = record["fix_loop"]
    meaning = {
        "no_progress": "the builder resubmitted a near-identical diff",
        "objection_standing": "the adversary raised an objection already standing",
        "attempts_exhausted": "no attempt was approved within graph.fix_attempts",
        "budget": "a spend cap stopped a retry",
    }.get(str(loop["stop"]), "")
    said = f": {meaning}" if meaning else ""
    last = record.get("review") or {}
    adversary = last.get("adversary") or {}
    objections = "; ".join(str(o) for o in (adversary.get("objections") or [])[:5])
    if objections:
        said += f"; standing objections: {objections}"
    findings = str((last.get("review") or {}).get("findings") or "").strip()
    if findings:
        said += f"; the last review: {findings[:400]}"
    return f"the fix loop stopped ({loop['stop']}) after {loop['attempts']} attempt(s){said}"
