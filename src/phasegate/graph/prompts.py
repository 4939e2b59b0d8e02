"""The prompts the graph's nodes send.

Plain templates: a prompt is a pure function of the run's data, so a replay
sends byte-identical prompts and their hashes match the record.
"""

from __future__ import annotations

from collections.abc import Sequence

from phasegate.graph.facts import ChangeFacts

__all__ = [
    "adversary_prompt",
    "arbitrate_prompt",
    "build_prompt",
    "plan_adversary_prompt",
    "plan_alternative_prompt",
    "plan_arbitrate_prompt",
    "plan_prompt",
    "plan_revision_prompt",
    "review_prompt",
    "scope_prompt",
]

_READ_ONLY = "Do not modify any file."


def scope_prompt(ticket: str) -> str:
    return f"""Scope the ticket below before anyone plans it. {_READ_ONLY}
List the independent pieces of work it needs (each one a change a single
developer would ship and review on its own), one per line:
SUBTASK: <title>
A ticket that is one piece of work has exactly one SUBTASK line. When a piece
needs earlier pieces merged first, name them after its title by their place in
your list (1 is the first), and only pieces listed before it:
SUBTASK: <title> [after 1, 2]

## Ticket

{ticket}
"""


def plan_prompt(ticket: str) -> str:
    return f"""Plan the change the ticket below asks for. {_READ_ONLY}
Write a numbered list of concrete steps: the files to change, the functions to
add or alter, and how the change is tested. Name only files and signatures you
have checked exist, or say that a step creates them.

## Ticket

{ticket}
"""


def plan_alternative_prompt(ticket: str, first: str) -> str:
    return f"""Write a second plan for the ticket below, different from the first. {_READ_ONLY}
Another planner wrote the plan shown after the ticket. It is shown only so that
you do not repeat it: do not critique it, do not improve it, take another
approach. Write your plan as a numbered list of concrete steps: the files to
change, the functions to add or alter, and how the change is tested.

## Ticket

{ticket}

## The first plan (do not repeat it)

{first}
"""


def plan_arbitrate_prompt(ticket: str, first: str, second: str) -> str:
    return f"""Two plans compete for the ticket below; only one is built. {_READ_ONLY}
Pick the plan to build, or merge them into one, and name the price of your
choice: what it gives up. Answer with the lines
CHOICE: first   or   CHOICE: second   or   CHOICE: merged
PRICE: <what the choice gives up, one line>
and, only when you merge, a line PLAN: followed by the whole merged plan.
A pick builds the chosen plan exactly as written.

## Ticket

{ticket}

## The first plan

{first}

## The second plan

{second}
"""


def plan_adversary_prompt(ticket: str, plan: str) -> str:
    return f"""Attack the plan below before anything is built. {_READ_ONLY}
Look for the claims it cannot back: a file it assumes exists, a signature it
assumes, a step that cannot be checked without doing the next one. Write each
claim that fails as one line
OBJECTION: <the claim, and why it fails>
and end with one line:  VERDICT: proceed   or   VERDICT: revise

## Ticket

{ticket}

## The plan

{plan}
"""


def plan_revision_prompt(ticket: str, plan: str, objections: str) -> str:
    return f"""Your plan for the ticket below was attacked before build. {_READ_ONLY}
Revise it once so that every objection falls, and answer with the whole
revised plan, as a numbered list of concrete steps.

## Ticket

{ticket}

## Your plan

{plan}

## The objections, verbatim

{objections}
"""


def build_prompt(
    ticket: str,
    plan: str,
    attempt: int,
    previous_patch: str | None = None,
    critique: str = "",
    standing: Sequence[str] = (),
) -> str:
    text = f"""Implement the plan below for the ticket below (attempt {attempt}).
Answer with a unified diff of every change (---/+++ headers and @@ hunks,
paths relative to the repository root) in one ```diff block. The diff is
applied for you: change no file yourself. Before the block, say in a few
lines what the change does and how it is tested.

## Ticket

{ticket}

## Plan

{plan}
"""
    if previous_patch is not None:
        text += f"""
## Your previous patch was sent back

```diff
{previous_patch.rstrip(chr(10))}
```

## The reviewers' critique

{critique}
"""
    if standing:
        text += "\n## Standing objections: every one must actually fall\n\n"
        text += "".join(f"- {claim}\n" for claim in standing)
    return text


def _facts_lines(facts: ChangeFacts) -> str:
    governance = ", ".join(facts.governance_paths) or "none"
    return (
        f"files: {facts.files}; insertions: {facts.insertions}; deletions: {facts.deletions}\n"
        f"paths: {', '.join(facts.paths)}\n"
        f"governance paths touched: {governance}"
    )


def _change(
    ticket: str, plan: str, attempt: int, brief: str, patch: str, facts: ChangeFacts
) -> str:
    return f"""## Ticket

{ticket}

## Plan

{plan}

## The builder's brief (attempt {attempt})

{brief}

## Change facts (counted from the patch)

{_facts_lines(facts)}

## Patch

```diff
{patch.rstrip(chr(10))}
```
"""


def _standing_section(standing: Sequence[str]) -> str:
    if not standing:
        return ""
    return (
        "\n## Standing objections from earlier attempts\n\n"
        "The change was sent back with these; judge whether each one has fallen.\n\n"
        + "".join(f"- {claim}\n" for claim in standing)
    )


def review_prompt(
    ticket: str,
    plan: str,
    attempt: int,
    brief: str,
    patch: str,
    facts: ChangeFacts,
    standing: Sequence[str],
) -> str:
    return (
        f"""Review the change below against its ticket and plan. {_READ_ONLY}
Check that it resolves the ticket, follows the plan, is correct, and is tested.
Write each finding on its own line, and end with one line:
VERDICT: approve   or   VERDICT: request_changes

"""
        + _change(ticket, plan, attempt, brief, patch, facts)
        + _standing_section(standing)
    )


def adversary_prompt(
    ticket: str,
    plan: str,
    attempt: int,
    brief: str,
    patch: str,
    facts: ChangeFacts,
    standing: Sequence[str],
    review_verdict: str,
    review_findings: str,
) -> str:
    return (
        f"""Argue against the change below: find what its reviewer missed. {_READ_ONLY}
The reviewer said {review_verdict}. Write each claim you can back as one line
OBJECTION: <the claim>
and end with one line:  VERDICT: approve   or   VERDICT: request_changes

## The reviewer's findings

{review_findings or "(none)"}

"""
        + _change(ticket, plan, attempt, brief, patch, facts)
        + _standing_section(standing)
    )


def arbitrate_prompt(
    ticket: str,
    plan: str,
    attempt: int,
    brief: str,
    patch: str,
    facts: ChangeFacts,
    standing: Sequence[str],
    review: str,
    adversary: str,
) -> str:
    return (
        f"""A reviewer and an adversary judged the change below; you decide. {_READ_ONLY}
Weigh each objection against the patch, give your reasoning, and end with one
line:  VERDICT: approve   or   VERDICT: request_changes

## The reviewer

{review}

## The adversary

{adversary}

"""
        + _change(ticket, plan, attempt, brief, patch, facts)
        + _standing_section(standing)
    )
