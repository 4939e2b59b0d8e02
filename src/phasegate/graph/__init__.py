"""The development graph (spec 002, DESIGN.md §2): pure, no disk, no clock, no git.

One ticket in; a run record with reviewed work and proposals out::

    from phasegate.graph import GraphRules, ScriptedAnswers, run_lifecycle

    record = run_lifecycle(
        answers,                      # AgentCall -> Answer: the shell, or data
        run_id="r1", date="2025-01-01", cartridge=GraphRules.from_cartridge(c),
        ticket="Add multiply()",
    )
    record["proposals"]               # item_create, draft_pr_create, as data

The graph is a generator that yields ``AgentCall(node, role, thread, prompt)``
and is sent ``Answer``s (``lifecycle_propose``); ``drive`` runs it against any
answer source; ``replay`` re-runs a record from its own answers and gives
byte-identical proposals. The harness, not the graph, applies a patch, runs
checks and gates proposals; ``phasegate.core.autonomy`` says which proposals a
person gates.

Modules: ``calls`` (the request/answer seam, scripted and recorded answers),
``facts`` (change facts, similarity, governance paths), ``rules`` (what the
graph reads of the cartridge, review tiers), ``parse`` (reading answers),
``answers`` (whether a node could use an answer: the shell's retry check),
``prompts``, ``nodes``, ``proposals``, ``lifecycle`` (the graph, fix loop, emit).
"""

from __future__ import annotations

from phasegate.graph.answers import answer_problem
from phasegate.graph.calls import (
    AgentCall,
    Answer,
    AnswerSource,
    Graph,
    GraphError,
    RecordedAnswers,
    ReplayDivergence,
    ScriptedAnswers,
    drive,
    prompt_hash,
)
from phasegate.graph.facts import (
    GOVERNANCE_PATHS,
    NO_PROGRESS_SIMILARITY,
    ChangeFacts,
    change_facts,
    extract_patch,
    governance_touched,
    similarity,
)
from phasegate.graph.lifecycle import (
    FIX_LOOP_STOPS,
    RUN_RECORD_KEYS,
    canonical_json,
    lifecycle_propose,
    plan_propose,
    replay,
    run_lifecycle,
)
from phasegate.graph.nodes import STOP_REASONS
from phasegate.graph.proposals import PROPOSAL_KINDS, Evidence, Proposal
from phasegate.graph.rules import GRAPH_ROLES, EpicThreshold, GraphRules, TierRule, review_tier

__all__ = [
    "FIX_LOOP_STOPS",
    "GOVERNANCE_PATHS",
    "GRAPH_ROLES",
    "NO_PROGRESS_SIMILARITY",
    "PROPOSAL_KINDS",
    "RUN_RECORD_KEYS",
    "STOP_REASONS",
    "AgentCall",
    "Answer",
    "AnswerSource",
    "ChangeFacts",
    "EpicThreshold",
    "Evidence",
    "Graph",
    "GraphError",
    "GraphRules",
    "Proposal",
    "RecordedAnswers",
    "ReplayDivergence",
    "ScriptedAnswers",
    "TierRule",
    "answer_problem",
    "canonical_json",
    "change_facts",
    "drive",
    "extract_patch",
    "governance_touched",
    "lifecycle_propose",
    "plan_propose",
    "prompt_hash",
    "replay",
    "review_tier",
    "run_lifecycle",
    "similarity",
]
