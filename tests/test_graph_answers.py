"""Whether the graph could use an answer (``graph.answer_problem``), and the shells that
ask again when it could not: a workflow's (AgentService garbage retries) and ``propose``'s.

The calls are the real graph's, captured with ScriptedAnswers; every verdict on a
text is checked against what the graph itself does with that text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from phasegate import operations
from phasegate.agents import ScriptedRunner
from phasegate.config.cartridge import Cartridge, load_cartridge
from phasegate.graph import (
    GRAPH_ROLES,
    AgentCall,
    Answer,
    GraphRules,
    ScriptedAnswers,
    TierRule,
    answer_problem,
    run_lifecycle,
)
from phasegate.phases.graph_mode.harness import RunnerAnswers, replay_check
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store

from conftest import git, make_repo, phasegate_cli, scripted_cartridge

TICKET = "Add multiply() to calc\n\ncalc.multiply(a, b) returns a * b, with a test."
APPROVE = "Correct and tested.\nVERDICT: approve"
CHANGES = "Missing a test for zero.\nVERDICT: request_changes"
NO_VERDICT = "Looks right to me."
CALC_DIFF = (
    "--- /dev/null\n+++ b/calc.py\n@@ -0,0 +1,2 @@\n+def multiply(a, b):\n+    return a * b\n"
)
BUILT = f"Adds multiply().\n\n```diff\n{CALC_DIFF}```\n"
REVIEW_MISSING = "no VERDICT: approve|request_changes line"

#: Every role bound, review at tier 2 (adversary and arbitrator always), the plan
#: attacked and revised by its author (plan_alternative, the second plan, was chosen).
RULES = GraphRules(
    bound_roles=frozenset(GRAPH_ROLES), tier_rules=(TierRule(2, min_files=1),), fix_attempts=0
)
GOOD: dict[str, list[str | Answer]] = {
    "scope_epic": ["SUBTASK: Add multiply() with its test"],
    "plan": ["1. Add multiply() to calc.py"],
    "plan_alternative": [
        "1. Add multiply() as operator.mul",
        "1. Add multiply() as operator.mul\n2. Test zero",
    ],
    "plan_arbitrate": ["CHOICE: second\nPRICE: one import more"],
    "plan_adversary": ["OBJECTION: zero is untested\nVERDICT: revise"],
    "build": [BUILT],
    "review": [APPROVE],
    "review_adversary": [APPROVE],
    "arbitrate": [APPROVE],
}
#: (node, role) of every call the graph makes under RULES, in order.
ASKED = [
    ("scope", "scope_epic"),
    ("plan", "plan"),
    ("plan_alternative", "plan_alternative"),
    ("plan_arbitrate", "plan_arbitrate"),
    ("plan_adversary", "plan_adversary"),
    ("plan_adversary", "plan_alternative"),  # the revision, asked of the chosen plan's author
    ("build", "build"),
    ("review", "review"),
    ("adversary", "review_adversary"),
    ("arbitrate", "arbitrate"),
]


def drive_graph(source: Callable[[AgentCall], Answer]) -> dict[str, Any]:
    return run_lifecycle(source, run_id="r1", date="2026-01-01", cartridge=RULES, ticket=TICKET)


@pytest.fixture(scope="module")
def calls() -> dict[tuple[str, str], AgentCall]:
    """The real graph's calls, by (node, role), from a run every node approved of."""
    source = ScriptedAnswers(GOOD)
    record = drive_graph(source)
    assert record["stopped"] is None and record["fix_loop"]["approved_attempt"] == 1
    assert [(c.node, c.role) for c in source.calls] == ASKED
    return {(c.node, c.role): c for c in source.calls}


#: (node, role), an answer, and what answer_problem says of it.
CASES: list[tuple[tuple[str, str], str, str | None]] = [
    (("scope", "scope_epic"), "SUBTASK: Add multiply()", None),
    (("scope", "scope_epic"), "- **SUBTASK**: one\n- SUBTASK: two", None),
    (("scope", "scope_epic"), "One piece of work: multiply().", "no SUBTASK line"),
    (("scope", "scope_epic"), "SUBTASK:   ", "no SUBTASK line"),
    (("plan", "plan"), "1. Do it", None),
    (("plan", "plan"), " \n\t", "empty answer"),
    (("plan_alternative", "plan_alternative"), "1. Do it otherwise", None),
    (("plan_alternative", "plan_alternative"), "", "empty answer"),
    (("plan_arbitrate", "plan_arbitrate"), "CHOICE: second\nPRICE: none", None),
    (("plan_arbitrate", "plan_arbitrate"), "**CHOICE**: First", None),
    (("plan_arbitrate", "plan_arbitrate"), "CHOICE: merged\nPLAN:\n1. Both, tested", None),
    # a merge without its plan stops the graph by its own name, not as garbage
    (("plan_arbitrate", "plan_arbitrate"), "CHOICE: merged", None),
    (
        ("plan_arbitrate", "plan_arbitrate"),
        "The second plan is better.",
        "no CHOICE of first/second/merged",
    ),
    (("plan_arbitrate", "plan_arbitrate"), "CHOICE: third", "no CHOICE of first/second/merged"),
    (("plan_adversary", "plan_adversary"), "VERDICT: proceed", None),
    (("plan_adversary", "plan_adversary"), "OBJECTION: x\n**VERDICT**: Revise", None),
    (
        ("plan_adversary", "plan_adversary"),
        "OBJECTION: zero is untested",
        "no VERDICT: proceed|revise line",
    ),
    # a reviewer's word is not a plan adversary's
    (("plan_adversary", "plan_adversary"), "VERDICT: approve", "no VERDICT: proceed|revise line"),
    # the author's revision is free text, whatever it says
    (("plan_adversary", "plan_alternative"), "1. Revised: test zero too", None),
    (("plan_adversary", "plan_alternative"), "VERDICT: revise", None),
    (("plan_adversary", "plan_alternative"), "  ", "empty answer"),
    (("build", "build"), BUILT, None),
    (("build", "build"), f"Adds multiply().\n\n{CALC_DIFF}", None),
    (
        ("build", "build"),
        "I added multiply() to calc.py.",
        "the build answered without a unified diff",
    ),
    (
        ("build", "build"),
        "No change needed.\n\n--- a/calc.py\n+++ b/calc.py\n",
        "the diff changes no line of any file",
    ),
    (("review", "review"), APPROVE, None),
    (("review", "review"), CHANGES, None),
    (("review", "review"), "Fine.\n- **VERDICT**: ship", None),
    (("review", "review"), NO_VERDICT, REVIEW_MISSING),
    (("review", "review"), "VERDICT: maybe", REVIEW_MISSING),
    (("adversary", "review_adversary"), "OBJECTION: zero\nVERDICT: reject", None),
    (("adversary", "review_adversary"), "OBJECTION: zero is untested", REVIEW_MISSING),
    (("arbitrate", "arbitrate"), "The reviewer is right.\nVERDICT: approve", None),
    (("arbitrate", "arbitrate"), "The adversary is right.", REVIEW_MISSING),
]


@pytest.mark.parametrize(("asked", "text", "problem"), CASES)
def test_answer_problem_says_what_the_node_would_miss(
    calls: dict[tuple[str, str], AgentCall], asked: tuple[str, str], text: str, problem: str | None
) -> None:
    assert answer_problem(calls[asked], text) == problem


@pytest.mark.parametrize("asked", ASKED)
def test_an_empty_answer_is_a_problem_for_every_node(
    calls: dict[tuple[str, str], AgentCall], asked: tuple[str, str]
) -> None:
    assert answer_problem(calls[asked], "") == "empty answer"
    assert answer_problem(calls[asked], "\n  \n") == "empty answer"


def test_a_call_the_graph_does_not_make_is_not_judged() -> None:
    assert answer_problem(AgentCall("retro", "retro", "retro", "Look back."), "anything") is None


@pytest.mark.parametrize(
    ("asked", "text"), [(asked, text) for asked, text, _ in CASES] + [(a, "") for a in ASKED]
)
def test_answer_problem_agrees_with_the_graph(
    calls: dict[tuple[str, str], AgentCall], asked: tuple[str, str], text: str
) -> None:
    """The graph, answered ``text`` at that call (and well everywhere else), stops right
    there as garbage (or, for a build, as handoff_incomplete) exactly when
    answer_problem names a problem."""
    index = ASKED.index(asked)
    script = ScriptedAnswers(GOOD)

    def source(call: AgentCall) -> Answer:
        if len(script.calls) == index:
            assert (call.node, call.role) == asked and call == calls[asked]
            script.calls.append(call)
            return Answer(text)
        return script(call)

    record = drive_graph(source)
    stop = record["stopped"]
    unusable = (
        stop is not None
        and len(record["calls"]) == index + 1
        and (stop["node"], stop["reason"])
        in {(asked[0], "garbage"), ("handoff", "handoff_incomplete")}
    )
    assert (answer_problem(calls[asked], text) is not None) == unusable, stop


# -- propose's shell: RunnerAnswers --------------------------------------------------------------


def answers_for(
    tmp_path: Path, call: AgentCall, script: list[dict[str, Any]], **limits: Any
) -> RunnerAnswers:
    """RunnerAnswers in a clean repository, ``call.role`` answered from ``script``."""
    role = {"runner": "scripted", "script": "unused.toml"}
    cartridge = Cartridge.model_validate(
        {"roles": {"plan": role, "build": role, "review": role}, "limits": limits}
    )
    runner = ScriptedRunner({call.role: script})
    return RunnerAnswers(
        cartridge, make_repo(tmp_path / "repo"), "run-1", runners={call.role: runner}
    )


def test_runner_answers_ask_again_until_the_node_can_use_the_answer(
    calls: dict[tuple[str, str], AgentCall], tmp_path: Path
) -> None:
    review = calls[("review", "review")]
    answers = answers_for(
        tmp_path,
        review,
        [
            {"text": NO_VERDICT, "input_tokens": 5, "cost_usd": 0.1},
            {"text": APPROVE, "input_tokens": 7},
        ],
    )
    answer = answers(review)
    # the accepted text; the usage of both tries, as for a failed try
    assert (answer.ok, answer.text, answer.input_tokens, answer.cost_usd) == (
        True,
        APPROVE,
        12,
        0.1,
    )


def test_runner_answers_give_the_graph_the_last_garbage_when_every_try_was(
    calls: dict[tuple[str, str], AgentCall], tmp_path: Path
) -> None:
    build = calls[("build", "build")]
    answers = answers_for(
        tmp_path,
        build,
        [{"text": "I wrote it.", "input_tokens": 5}, {"text": "Done.", "input_tokens": 5}],
        agent_retries=1,
    )
    answer = answers(build)
    # 1 + agent_retries tries; the graph gets the last answer and stops by its own reason
    assert (answer.ok, answer.text, answer.input_tokens) == (True, "Done.", 10)


def test_a_spend_cap_stops_the_retry_of_garbage_and_the_graph_gets_it(
    calls: dict[tuple[str, str], AgentCall], tmp_path: Path
) -> None:
    review = calls[("review", "review")]
    answers = answers_for(
        tmp_path,
        review,
        [{"text": NO_VERDICT, "cost_usd": 0.5}, {"text": APPROVE}],
        workflow_budget_usd=0.5,
    )
    answer = answers(review)
    assert (answer.ok, answer.text, answer.cost_usd) == (True, NO_VERDICT, 0.5)


PROPOSE_ANSWERS = f'''
[[plan]]
text = "1. Add multiply() to calc.py"

[[build]]
text = """{BUILT}"""

[[review]]
text = "{NO_VERDICT}"
input_tokens = 30

[[review]]
text = "Correct and small.\\nVERDICT: approve"
input_tokens = 20
'''


def propose_repo(tmp_path: Path, answers: str) -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# calc\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(answers)
    (repo / "phasegate.toml").write_text(scripted_cartridge())
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


def propose(repo: Path) -> tuple[int, dict[str, Any], dict[str, Any]]:
    """``phasegate propose`` on ``repo``: its exit code, JSON summary and stored record."""
    proc = phasegate_cli("propose", "Add multiply() to calc", "--repo", str(repo), "--json")
    out = json.loads(proc.stdout)
    store = open_store(load_cartridge(repo).store_url(repo))
    try:
        record = store.run(out["run_id"])["record"]
    finally:
        store.close()
    return proc.returncode, out, record


def test_propose_asks_a_reviewer_without_a_verdict_again(tmp_path: Path) -> None:
    code, out, record = propose(propose_repo(tmp_path, PROPOSE_ANSWERS))
    assert code == 0, out
    assert out["stopped"] is None and out["fix_loop"]["approved_attempt"] == 1
    [review] = [c for c in record["calls"] if c["role"] == "review"]
    assert review["response"] == "Correct and small.\nVERDICT: approve"
    assert review["input_tokens"] == 50  # both tries
    assert replay_check(record).identical


def test_propose_with_a_reviewer_that_never_gives_a_verdict_stops_as_garbage(
    tmp_path: Path,
) -> None:
    never = PROPOSE_ANSWERS.split("[[review]]")[0] + f'[[review]]\ntext = "{NO_VERDICT}"\n'
    code, out, record = propose(propose_repo(tmp_path, never + "input_tokens = 30\n"))
    assert (code, out["proposals"]) == (1, [])
    # the graph's own stop, on the last of 1 + agent_retries (2) tries
    assert out["stopped"] == {
        "node": "review",
        "reason": "garbage",
        "detail": "review: no VERDICT: approve|request_changes",
    }
    [review] = [c for c in record["calls"] if c["role"] == "review"]
    assert (review["response"], review["input_tokens"]) == (NO_VERDICT, 90)


# -- a workflow's shell: WorkflowAnswers through the AgentService ---------------------------------

WORKFLOW_ANSWERS = f'''
[[plan]]
text = "1. Create feature.txt holding 'the feature'."

[[build]]
text = """Adds feature.txt.

```diff
--- /dev/null
+++ b/feature.txt
@@ -0,0 +1 @@
+the feature
```
"""

[[review]]
text = "{NO_VERDICT}"

[[review]]
text = "Correct.\\nVERDICT: approve"

[[verification]]
text = "VERDICT: confirmed"
'''


def workflow_repo(tmp_path: Path, answers: str) -> Path:
    """A repository whose workflows run through the graph, every role scripted."""
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(answers)
    settings = '[graph]\nenabled = true\n\n[autonomy]\npolicy = { draft_pr_create = "auto" }\n'
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(checks=["test -f feature.txt"], extra=settings)
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    return repo


def test_a_workflow_asks_a_reviewer_without_a_verdict_again_and_completes(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = workflow_repo(tmp_path, WORKFLOW_ANSWERS)
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row
    assert git(repo, "show", "main:feature.txt") == "the feature"

    reviews = [r for r in store.agent_runs(workflow_id) if r["role"] == "review"]
    assert [(r["phase"], r["outcome"]) for r in reviews] == [
        ("development", "garbage"),
        ("development", "ok"),
    ]
    assert reviews[0]["error_kind"] == "garbage"
    assert reviews[0]["error"] == REVIEW_MISSING
    # the run record holds the accepted answer only, and replays
    run = store.run(f"{workflow_id}-g1")["record"]
    [review] = [c for c in run["calls"] if c["role"] == "review"]
    assert (review["response"], review["error_kind"]) == ("Correct.\nVERDICT: approve", None)
    assert [c["role"] for c in run["calls"]] == ["plan", "build", "review"]
    assert replay_check(run).identical


def test_a_workflow_reviewer_that_never_gives_a_verdict_stops_the_graph_and_pauses_at_the_cap(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    never = WORKFLOW_ANSWERS.replace('[[review]]\ntext = "Correct.\\nVERDICT: approve"\n', "")
    repo = workflow_repo(tmp_path, never)
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)
    # Paused for a person at limits.max_review_parse_failures (2), as an unreadable
    # verifier is, not failed after 1 + limits.agent_retries (3) tries.
    assert (row["current_phase"], row["status"]) == ("development", "paused"), row
    assert row["error"].startswith("review gave no verdict it could read"), row["error"]
    assert "limits.max_review_parse_failures = 2" in row["error"]
    assert "review agent failed 2 time(s); last: garbage: " + REVIEW_MISSING in row["error"]

    reviews = [r for r in store.agent_runs(workflow_id) if r["role"] == "review"]
    assert [r["outcome"] for r in reviews] == ["garbage"] * 2
    # the graph stopped at review on the role's failure, named garbage; nothing proposed
    [graph_run] = [m for m in store.milestones(workflow_id) if m.kind == "graph_run"]
    stopped = graph_run.data["stopped"]
    assert (stopped["node"], stopped["reason"]) == ("review", "agent_failed")
    assert "garbage" in stopped["detail"]
    kept = store.graph_calls(f"{workflow_id}-g1")
    assert [(c["role"], c["error_kind"]) for c in kept] == [
        ("plan", None),
        ("build", None),
        ("review", "garbage"),
    ]
    assert store.proposals(workflow_id=workflow_id) == []


def test_a_workflow_paused_on_a_reviewer_without_a_verdict_resumes_the_same_run(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    twice = WORKFLOW_ANSWERS.replace(
        f'[[review]]\ntext = "{NO_VERDICT}"\n',
        f'[[review]]\ntext = "{NO_VERDICT}"\n\n[[review]]\ntext = "{NO_VERDICT}"\n',
    )
    repo = workflow_repo(tmp_path, twice)
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("development", "paused"), row

    operations.resume(engine, workflow_id, by="ana")
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row
    reviews = [r["outcome"] for r in store.agent_runs(workflow_id) if r["role"] == "review"]
    assert reviews == ["garbage", "garbage", "ok"]
    # the same run went on: its plan and build were not asked again
    assert [r["role"] for r in store.agent_runs(workflow_id)].count("build") == 1
