"""The progress report: one structured payload, rendered in English or Chinese.

The payload is the single source of truth (docs/contracts/lifecycle.md: report);
rendering is a pure function of it and ``content_language``, so the Chinese
report says what the English one says with other labels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["LABELS", "MR_NUMBERS", "render_report", "shown_number"]

#: GitLab numbers merge requests apart from issues: merge request ``!N`` is this plus N
#: here, so one number names one thing on every forge.
MR_NUMBERS = 1_000_000


def shown_number(number: int) -> str:
    """A pull request's or issue's number as people read it on its forge: ``#12``,
    or ``!3`` for GitLab's merge request !3 (number MR_NUMBERS + 3 here)."""
    return f"!{number - MR_NUMBERS}" if number > MR_NUMBERS else f"#{number}"


LABELS: Mapping[str, Mapping[str, str]] = {
    "en": {
        "title": "Progress report",
        "round": "Development round",
        "plan": "Plan",
        "plan_rounds": "rounds",
        "one_round": "round",
        "passes": "passes",
        "approved": "approved",
        "not_approved": "accepted after the round limit",
        "changes": "Changes",
        "file": "file",
        "files": "files",
        "checks": "Checks",
        "passed": "passed",
        "failed": "failed",
        "attempts": "attempts",
        "review": "Review",
        "pr": "Pull request",
        "usage": "Agent usage",
        "tokens": "tokens",
        "next": "Next",
        "next_merge": "merging automatically (auto_merge)",
        "next_wait": "waiting for `phasegate approve-merge` or `phasegate feedback`",
        "none": "none",
        "limits": "Limits that ran out",
        "found": "what the last round found",
        "feedback": "Feedback this round answers",
        "since": "Changed since the last report",
        "unchanged": "Nothing changed since the last report: the head is still",
        "since_unknown": "What changed since the last report is unknown",
    },
    "zh": {
        "title": "进度报告",
        "round": "开发轮次",
        "plan": "计划",
        "plan_rounds": "轮",
        "one_round": "轮",
        "passes": "遍",
        "approved": "已批准",
        "not_approved": "达到轮次上限后采用",
        "changes": "变更",
        "file": "个文件",
        "files": "个文件",
        "checks": "检查",
        "passed": "通过",
        "failed": "失败",
        "attempts": "次尝试",
        "review": "评审",
        "pr": "拉取请求",
        "usage": "代理用量",
        "tokens": "令牌",
        "next": "下一步",
        "next_merge": "自动合并（auto_merge）",
        "next_wait": "等待 `phasegate approve-merge` 或 `phasegate feedback`",
        "none": "无",
        "limits": "已用尽的上限",
        "found": "最后一轮的发现",
        "feedback": "本轮回应的反馈",
        "since": "自上次报告以来的变更",
        "unchanged": "自上次报告以来没有任何变更：头提交仍是",
        "since_unknown": "无法得知自上次报告以来的变更",
    },
}


def _number(value: object) -> str:
    return shown_number(value) if isinstance(value, int) else f"#{value}"


def _review_count(review: Mapping[str, Any], w: Mapping[str, str]) -> str:
    """ "2 rounds", or "1 round, 3 passes" when a round's change was reviewed again."""
    rounds, passes = int(review.get("rounds", 0)), int(review.get("passes", 0))
    said = f"{rounds} {w['one_round'] if rounds == 1 else w['plan_rounds']}"
    return f"{said}, {passes} {w['passes']}" if passes > rounds else said


def render_report(payload: Mapping[str, Any], language: str) -> str:
    """Markdown for ``payload`` in ``language`` ("en" or "zh"; anything else is English)."""
    w = LABELS.get(language, LABELS["en"])
    plan = payload.get("plan", {})
    changes = payload.get("changes", {})
    checks = payload.get("checks", {})
    review = payload.get("review", {})
    usage = payload.get("usage", {})
    lines = [
        f"## {w['title']}: {payload.get('title', '')}",
        "",
        f"- {w['round']}: {payload.get('dev_round')}",
        f"- {w['plan']}: {w['approved'] if plan.get('approved') else w['not_approved']}, "
        f"{plan.get('rounds', 0)} "
        f"{w['one_round'] if plan.get('rounds', 0) == 1 else w['plan_rounds']}"
        + (f" ({plan['graph_run']}: {plan['how']})" if plan.get("graph_run") else ""),
        f"- {w['changes']}: {_files(changes.get('files', 0), w)}, "
        f"+{changes.get('insertions', 0)} −{changes.get('deletions', 0)}",
        f"- {w['checks']}: {checks.get('passed', 0)}/{checks.get('total', 0)} {w['passed']}, "
        f"{checks.get('attempts', 0)} {w['attempts']}",
    ]
    for result in checks.get("results", []):
        mark = w["passed"] if result.get("passed") else w["failed"]
        lines.append(f"  - `{result.get('command')}`: {mark} ({result.get('duration_s', 0)}s)")
    lines += [
        f"- {w['review']}: {review.get('verdict') or w['none']} ({_review_count(review, w)})",
        f"- {w['pr']}: {_number(payload.get('pr'))} ({payload.get('branch')})",
        f"- {w['usage']}: {usage.get('tokens', 0)} {w['tokens']}, "
        f"${usage.get('cost_usd', 0.0):.4f}",
        f"- {w['next']}: {w['next_merge'] if payload.get('auto_merge') else w['next_wait']}",
    ]
    hold = payload.get("merge_hold")
    if hold:  # the gate's reason is phasegate's own words, in English in both languages
        lines.append(f"  - {hold['reason']}")
    lines += _feedback_lines(payload.get("feedback"), w)
    limits = payload.get("limits") or []
    if limits:
        lines += ["", f"### {w['limits']}", ""]
        for limit in limits:
            lines.append(
                f"- {limit.get('phase')}, {w['round'].lower()} {limit.get('round')}: "
                f"{limit.get('loop')} ({limit.get('rounds')}, `{limit.get('setting')}`); "
                f"{w['found']}:"
            )
            lines += [f"  > {line}" for line in str(limit.get("findings", "")).splitlines()]
    said = str(review.get("comments") or "").strip()
    if said:  # the approving review's words: the report is where they are posted
        lines += ["", f"### {w['review']}", ""]
        lines += [f"> {line}".rstrip() for line in said.splitlines()]
    if plan.get("summary"):
        lines += ["", f"### {w['plan']}", "", str(plan["summary"])]
    return "\n".join(lines) + "\n"


def _feedback_lines(feedback: Mapping[str, Any] | None, w: Mapping[str, str]) -> list[str]:
    """The section of a round a person's feedback started: the feedback quoted,
    then the files and lines changed since the head the last report described."""
    if not feedback:
        return []
    lines = ["", f"### {w['feedback']}", ""]
    for number, text in enumerate(feedback.get("texts") or ()):
        if number:
            lines.append(">")
        lines += [f"> {line}".rstrip() for line in str(text).splitlines()]
    lines.append("")
    since, head = feedback.get("since"), feedback.get("head")
    if feedback.get("changed") is None:
        lines.append(f"{w['since_unknown']}.")
    elif not feedback["changed"]:
        lines.append(f"**{w['unchanged']} `{str(head)[:12]}`.**")
    else:
        lines.append(
            f"{w['since']} (`{str(since)[:12]}` → `{str(head)[:12]}`): "
            f"{_files(feedback.get('files', 0), w)}, "
            f"+{feedback.get('insertions', 0)} −{feedback.get('deletions', 0)}"
        )
        lines += [
            f"- `{p.get('path')}`: +{p.get('insertions', 0)} −{p.get('deletions', 0)}"
            for p in feedback.get("paths") or ()
        ]
    return lines


def _files(count: Any, w: Mapping[str, str]) -> str:
    """``1 file``, ``2 files`` (in Chinese one word for both)."""
    return f"{count} {w['file'] if count == 1 else w['files']}"
