"""Whether the graph could use an answer, asked before the shell hands it over.

A node that cannot use its answer (a reviewer without a ``VERDICT:`` line, a
build without a diff) stops the graph at once (``garbage``, or
``handoff_incomplete`` for a build). The graph never retries: it is pure and
replays byte for byte from the answers it was given. The shell does, as the
AgentService does outside the graph: it asks ``answer_problem`` about each
answer and asks the role again, within ``limits.agent_retries``, while the
node could not use it::

    problem = answer_problem(call, text)   # None: the node that asked can go on

It reads the text with the very readers and words the nodes use
(``parse``, ``facts.extract_patch``, ``nodes.handoff``, ``nodes.plan_choice``),
so the two cannot drift. Only what is missing is a problem; what the node
decides from a usable answer (a ``request_changes`` verdict, a merged plan
without its text, which stops as ``merged_without_plan``, a patch too like
the last one) is the graph's to decide.
"""

from __future__ import annotations

from phasegate.graph.calls import AgentCall
from phasegate.graph.facts import change_facts, extract_patch
from phasegate.graph.nodes import (
    PLAN_AUTHORS,
    PLAN_CHOICES,
    PLAN_VERDICTS,
    handoff,
    plan_choice,
)
from phasegate.graph.parse import REVIEW_VERDICTS, items, verdict

__all__ = ["EMPTY_ANSWER", "answer_problem"]

#: The problem of a blank answer, whichever node asked.
EMPTY_ANSWER = "empty answer"

#: The nodes that need a reviewer's verdict, by the role each asks.
_JUDGES = {"review": "review", "adversary": "review_adversary", "arbitrate": "arbitrate"}
#: The roles plan_adversary asks for a revision of the plan (free text).
_PLAN_AUTHOR_ROLES = frozenset(role for role, _thread in PLAN_AUTHORS.values())


def answer_problem(call: AgentCall, text: str) -> str | None:
    """What the node that asked ``call`` would miss in ``text``, or None when it can use it.

    By ``call.node`` and ``call.role``: scope needs a ``SUBTASK:`` line;
    plan, plan_alternative and a plan's revision (asked of its author on node
    plan_adversary) any text; plan_arbitrate a ``CHOICE:`` of first, second
    or merged; plan_adversary a ``VERDICT:`` of proceed or revise; build a
    unified diff that changes at least one line; review, adversary and
    arbitrate a ``VERDICT:`` of approve or request_changes (or a synonym,
    ``parse.REVIEW_VERDICTS``). A blank answer is a problem for every node; a
    call this graph does not make is not judged (None).
    """
    if not text.strip():
        return EMPTY_ANSWER
    node, role = call.node, call.role
    if node == "scope" and role == "scope_epic":
        return None if items(text, "subtask") else "no SUBTASK line"
    if node == "plan_arbitrate" and role == "plan_arbitrate":
        return None if plan_choice(text) else f"no CHOICE of {'/'.join(PLAN_CHOICES)}"
    if node == "plan_adversary" and role == "plan_adversary":
        if verdict(text, PLAN_VERDICTS) is None:
            return f"no VERDICT: {'|'.join(PLAN_VERDICTS)} line"
        return None
    if node == "plan_adversary" and role in _PLAN_AUTHOR_ROLES:
        return None  # the author's revised plan: free text
    if node == "build" and role == "build":
        patch, summary = extract_patch(text)
        ready = handoff(patch, summary, change_facts(patch))
        return None if ready.complete else ready.reason
    if _JUDGES.get(node) == role:
        if verdict(text, REVIEW_VERDICTS) is None:
            return f"no VERDICT: {'|'.join(dict.fromkeys(REVIEW_VERDICTS.values()))} line"
        return None
    return None  # plan and plan_alternative: free text; a call the graph does not make
