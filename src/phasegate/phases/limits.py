"""What a bounded loop that ran out passes on to the next prompt and the report.

Plan review rounds, PR review rounds and development retries each end at a
cap; the last round's findings then go into a ``limit_reached`` milestone
(the report lists them), into the next prompt (state.carried_findings) and
into the reason ``show`` prints and the decision record keeps.
"""

from __future__ import annotations

from phasegate.core.contract import MilestoneWrite

__all__ = ["limit_reached", "reason_with"]


def limit_reached(
    loop: str, setting: str, rounds: int, findings: str, *, round: int, key: str = ""
) -> MilestoneWrite:
    """The evidence that a bounded loop ended at its cap, with what its last round
    found. ``data``: loop, setting, rounds, findings (at most
    4000 characters) and ``carried``: the text the next prompt carries."""
    findings = findings.strip()[-4000:]
    carried = f"The {loop} ran out after {rounds} round(s) ({setting}). What the last one found:"
    return MilestoneWrite(
        "limit_reached",
        status="failed",
        round=round,
        key=key or loop.replace(" ", "_"),
        summary=f"{loop}: {rounds} ({setting}); {findings[:200]}",
        data={
            "loop": loop,
            "setting": setting,
            "rounds": rounds,
            "findings": findings,
            "carried": f"{carried}\n\n{findings}",
        },
    )


def reason_with(reason: str, findings: str, limit: int = 400) -> str:
    """``reason`` and the first ``limit`` characters of ``findings``, for the reason
    a person reads (``show``) and the decision record."""
    text = " ".join(findings.split())
    if not text:
        return reason
    return f"{reason}; the last round found: {text[:limit]}" + ("…" if len(text) > limit else "")
