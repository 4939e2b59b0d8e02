"""The development graph (docs/contracts/graph.md), driven by scripted answers: no process,
no disk."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

import phasegate
from phasegate.config.cartridge import (
    CARTRIDGE_FILE,
    GRAPH_OPTIONAL_ROLES,
    CartridgeError,
    load_cartridge,
)
from phasegate.graph import (
    FIX_LOOP_STOPS,
    GOVERNANCE_PATHS,
    GRAPH_ROLES,
    NO_PROGRESS_SIMILARITY,
    PROPOSAL_KINDS,
    RUN_RECORD_KEYS,
    Answer,
    GraphError,
    GraphRules,
    ReplayDivergence,
    ScriptedAnswers,
    TierRule,
    canonical_json,
    change_facts,
    extract_patch,
    prompt_hash,
    replay,
    run_lifecycle,
    similarity,
)

TICKET = "Add multiply() to calc\n\ncalc.multiply(a, b) returns a * b, with a test."
BASE_ROLES = frozenset({"plan", "build", "review"})
#: The roles tier 1 or more needs: the adversary, and the arbitrator when the two disagree.
REVIEWERS = ("review_adversary", "arbitrate")
APPROVE = "Correct and tested.\nVERDICT: approve"
CHANGES = "Missing a test for zero.\nVERDICT: request_changes"


def rules(*roles: str, **settings: Any) -> GraphRules:
    return GraphRules(bound_roles=BASE_ROLES | set(roles), **settings)


def new_file(path: str, *lines: str) -> str:
    body = "".join(f"+{line}\n" for line in lines)
    return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"


def built(patch: str, summary: str = "Adds multiply(); test_calc covers it.") -> str:
    return f"{summary}\n\n```diff\n{patch}```\n"


CALC = new_file("calc.py", "def multiply(a, b):", "    return a * b")
CALC_AND_TEST = CALC + new_file(
    "test_calc.py",
    "from calc import multiply",
    "def test_zero():",
    "    assert multiply(0, 5) == 0",
)
OTHER = new_file("mul.py", "import operator", "multiply = operator.mul")


def run(
    answers: dict[str, list[str | Answer]], graph_rules: GraphRules, **kwargs: Any
) -> tuple[dict[str, Any], ScriptedAnswers]:
    source = ScriptedAnswers(answers)
    record = run_lifecycle(
        source, run_id="run-1", date="2025-05-01", cartridge=graph_rules, ticket=TICKET, **kwargs
    )
    json.dumps(record)  # every value is JSON
    return record, source


def roles_called(source: ScriptedAnswers) -> list[str]:
    return [c.role for c in source.calls]


def evidence_kinds(proposal: dict[str, Any]) -> list[str]:
    return [row["kind"] for row in proposal["evidence"]]


# -- purity ------------------------------------------------------------------------------

SRC = Path(phasegate.__file__).parent
PURE_MODULES = [
    *sorted((SRC / "graph").glob("*.py")),
    SRC / "core" / "autonomy.py",
    SRC / "core" / "profiles.py",
]
#: Standard modules that reach disk, clock, processes, network or randomness.
IMPURE_MODULES = frozenset(
    {
        "os",
        "pathlib",
        "shutil",
        "subprocess",
        "time",
        "datetime",
        "io",
        "sqlite3",
        "sqlalchemy",
        "alembic",
        "socket",
        "tempfile",
        "glob",
        "threading",
        "multiprocessing",
        "asyncio",
        "signal",
        "random",
        "secrets",
        "uuid",
        "importlib",
        "urllib",
        "http",
        "httpx",
        "litellm",
        "tomllib",
        "logging",
        "sys",
    }
)
#: The only first-party modules a pure module may import at run time.
PURE_FIRST_PARTY = (
    "phasegate.graph",
    "phasegate.core.autonomy",
    "phasegate.core.contract",
    "phasegate.core.profiles",
    "phasegate.core.state",
)
IMPURE_CALLS = frozenset({"open", "exec", "eval", "compile", "__import__", "input", "breakpoint"})


def impurities(source: str) -> list[str]:
    """What in ``source`` imports or calls something impure (``if TYPE_CHECKING:`` aside)."""
    tree = ast.parse(source)
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            typing_only.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from phasegate import workspace` imports phasegate.git.workspace
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append(f"line {node.lineno}: a relative import (write it absolute)")
        bad = [
            name
            for name in names
            if name.split(".")[0] in IMPURE_MODULES
            or (
                name.split(".")[0] == "phasegate"
                and not any(name == ok or name.startswith(ok + ".") for ok in PURE_FIRST_PARTY)
            )
        ]
        if bad:
            found.append(f"line {node.lineno}: import {', '.join(bad)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in IMPURE_CALLS
        ):
            found.append(f"line {node.lineno}: {node.func.id}()")
    return found


def test_the_purity_check_catches_what_it_must() -> None:
    bad = (
        "import os\nfrom pathlib import Path\nimport datetime as dt\n"
        "from phasegate.store import Store\nfrom phasegate import workspace\n"
        "from subprocess import run\nfrom ..store import Store\nopen('x')\n"
    )
    assert len(impurities(bad)) == 8
    typing_only = (
        "from typing import TYPE_CHECKING\nfrom phasegate.core.contract import PhasegateError\n"
        "if TYPE_CHECKING:\n    from phasegate.config.cartridge import Cartridge\n"
    )
    assert impurities(typing_only) == []


@pytest.mark.parametrize("module", PURE_MODULES, ids=lambda p: p.name)
def test_graph_and_autonomy_import_no_disk_clock_process_or_git(module: Path) -> None:
    assert impurities(module.read_text(encoding="utf-8")) == []


def test_every_pure_module_is_checked() -> None:
    names = {p.name for p in PURE_MODULES}
    assert {"__init__.py", "lifecycle.py", "facts.py", "autonomy.py", "profiles.py"} <= names


# -- review tiers ----------------------------------------------------------------------


def test_tier_0_is_reviewed_once_and_proposes_a_draft_pr() -> None:
    record, source = run(
        {"plan": ["1. Add multiply"], "build": [built(CALC)], "review": [APPROVE]}, rules()
    )
    assert list(record) == list(RUN_RECORD_KEYS)
    assert roles_called(source) == ["plan", "build", "review"]
    assert [c.thread for c in source.calls] == ["plan", "build", "review"]
    assert record["review"]["tier"] == 0
    assert record["review"]["adversary"] is None and record["review"]["arbitrate"] is None
    assert record["plan_competition"] is None and record["plan_attack"] is None
    assert record["stopped"] is None
    assert record["fix_loop"] == {
        "attempts": 1,
        "fix_attempts": 2,
        "stop": None,
        "approved_attempt": 1,
        "rounds": [
            {
                "attempt": 1,
                "outcome": "reviewed",
                "similarity": None,
                "tier": 0,
                "decision": "approve",
                "repeated_objections": [],
            }
        ],
    }
    [proposal] = record["proposals"]
    assert proposal["kind"] == "draft_pr_create"
    assert proposal["id"] == "run-1/draft_pr_create/1"
    assert proposal["payload"]["patch"] == CALC
    assert proposal["attempts"] == 1 and proposal["self_modification"] is False
    assert evidence_kinds(proposal) == ["change_facts", "review", "attempts"]
    assert proposal["evidence"][-1]["data"]["approved_attempt"] == 1
    # the record holds every call, hashed as sent
    assert [c["prompt_sha256"] for c in record["calls"]] == [
        prompt_hash(c.prompt) for c in source.calls
    ]
    assert record["change_facts"]["paths"] == ["calc.py"]


def test_tier_1_adds_the_adversary_and_skips_arbitration_when_they_agree() -> None:
    graph_rules = rules(*REVIEWERS, tier_rules=(TierRule(1, min_files=2),))
    record, source = run(
        {
            "plan": ["1. Add multiply and its test"],
            "build": [built(CALC_AND_TEST)],
            "review": [APPROVE],
            "review_adversary": ["Nothing the reviewer missed.\nVERDICT: approve"],
        },
        graph_rules,
    )
    assert roles_called(source) == ["plan", "build", "review", "review_adversary"]
    assert source.of("review_adversary")[0].thread == "adversary"
    assert record["review"]["tier"] == 1
    assert record["review"]["adversary"]["agreed"] is True
    assert record["review"]["arbitrate"] is None
    assert [p["kind"] for p in record["proposals"]] == ["draft_pr_create"]


def test_tier_1_arbitrates_a_disagreement() -> None:
    graph_rules = rules("review_adversary", "arbitrate", default_tier=1)
    record, source = run(
        {
            "plan": ["1. Add multiply"],
            "build": [built(CALC)],
            "review": [APPROVE],
            "review_adversary": ["OBJECTION: no test at all\nVERDICT: request_changes"],
            "arbitrate": ["The ticket asks for a test.\nVERDICT: request_changes"],
        },
        graph_rules,
        fix_attempts=0,
    )
    assert roles_called(source) == ["plan", "build", "review", "review_adversary", "arbitrate"]
    assert source.of("arbitrate")[0].thread == "arbitrate"
    assert record["review"]["adversary"]["agreed"] is False
    assert record["review"]["decision"] == "request_changes"
    assert record["fix_loop"]["stop"] == "attempts_exhausted"
    assert record["proposals"] == []


def test_tier_2_arbitrates_even_when_reviewer_and_adversary_agree() -> None:
    graph_rules = rules(
        "review_adversary", "arbitrate", tier_rules=(TierRule(2, self_modification=True),)
    )
    cartridge_change = (
        f"--- a/{CARTRIDGE_FILE}\n+++ b/{CARTRIDGE_FILE}\n@@ -1 +1 @@\n"
        "-fix_attempts = 2\n+fix_attempts = 3\n"
    )
    record, source = run(
        {
            "plan": ["1. Raise fix_attempts"],
            "build": [built(cartridge_change)],
            "review": [APPROVE],
            "review_adversary": ["VERDICT: approve"],
            "arbitrate": ["Both agree and the change is one line.\nVERDICT: approve"],
        },
        graph_rules,
    )
    assert roles_called(source)[-3:] == ["review", "review_adversary", "arbitrate"]
    assert record["review"]["tier"] == 2
    assert record["review"]["adversary"]["agreed"] is True
    assert record["review"]["arbitrate"]["verdict"] == "approve"
    assert record["change_facts"]["governance_paths"] == [CARTRIDGE_FILE]
    [proposal] = record["proposals"]
    assert proposal["self_modification"] is True
    assert proposal["paths"] == [CARTRIDGE_FILE]


def test_a_tier_without_its_roles_is_refused() -> None:
    with pytest.raises(GraphError, match="roles.review_adversary and roles.arbitrate are not"):
        rules(default_tier=1)
    with pytest.raises(GraphError, match="; roles.arbitrate is not"):
        rules("review_adversary", tier_rules=(TierRule(2, min_lines=100),))
    # Tier 1 needs the arbitrator too: a disagreement of the two reviewers goes to it.
    with pytest.raises(GraphError, match="; roles.arbitrate is not"):
        rules("review_adversary", default_tier=1)
    with pytest.raises(GraphError, match="; roles.review_adversary is not"):
        rules("arbitrate", tier_rules=(TierRule(1, min_files=2),))
    assert rules(*REVIEWERS, default_tier=1).default_tier == 1


# -- plans compete ------------------------------------------------------------------------

FIRST_PLAN = "1. Add multiply() to calc.py\n2. Test it in test_calc.py"
SECOND_PLAN = "  1. Use operator.mul in a new mul.py\n\n  2. Re-export it from calc  \n"
COMPETITION = ("plan_alternative", "plan_arbitrate")


def test_the_arbiter_picks_second_and_the_builder_gets_it_verbatim() -> None:
    record, source = run(
        {
            "plan": [FIRST_PLAN],
            "plan_alternative": [SECOND_PLAN],
            "plan_arbitrate": [
                "CHOICE: second\nPRICE: one more module to keep\nPLAN:\nthe arbiter's own idea"
            ],
            "build": [built(OTHER)],
            "review": [APPROVE],
        },
        rules(*COMPETITION),
    )
    assert roles_called(source) == ["plan", "plan_alternative", "plan_arbitrate", "build", "review"]
    alternative, arbiter = source.of("plan_alternative")[0], source.of("plan_arbitrate")[0]
    assert (alternative.thread, arbiter.thread) == ("plan_alternative", "plan_arbitrate")
    assert FIRST_PLAN in alternative.prompt and "do not repeat it" in alternative.prompt
    assert FIRST_PLAN in arbiter.prompt and SECOND_PLAN in arbiter.prompt
    assert f"## Plan\n\n{SECOND_PLAN}\n" in source.of("build")[0].prompt
    assert "the arbiter's own idea" not in source.of("build")[0].prompt  # a pick is verbatim
    assert record["plan"] == SECOND_PLAN
    competition = record["plan_competition"]
    assert competition["choice"] == "second"
    assert competition["price"] == "one more module to keep"
    assert competition["author"] == "plan_alternative"
    assert competition["losers"] == ["first"] and competition["first"] == FIRST_PLAN
    [proposal] = record["proposals"]
    assert evidence_kinds(proposal) == ["change_facts", "review", "plan_competition", "attempts"]


def test_a_merge_without_a_plan_stops_the_graph() -> None:
    record, source = run(
        {
            "plan": [FIRST_PLAN],
            "plan_alternative": [SECOND_PLAN],
            "plan_arbitrate": ["CHOICE: merged\nPRICE: takes the best of both"],
            "build": [built(CALC)],
            "review": [APPROVE],
        },
        rules(*COMPETITION),
    )
    assert record["stopped"]["node"] == "plan_arbitrate"
    assert record["stopped"]["reason"] == "merged_without_plan"
    assert "build" not in roles_called(source)
    assert record["proposals"] == [] and record["fix_loop"]["attempts"] == 0
    assert record["plan"] is None and record["build"] is None


def test_a_merge_builds_the_arbiters_plan() -> None:
    record, source = run(
        {
            "plan": [FIRST_PLAN],
            "plan_alternative": [SECOND_PLAN],
            "plan_arbitrate": ["CHOICE: merged\nPRICE: longer\nPLAN:\n1. mul.py\n2. calc.py"],
            "build": [built(CALC)],
            "review": [APPROVE],
        },
        rules(*COMPETITION),
    )
    assert record["plan"] == "1. mul.py\n2. calc.py"
    assert record["plan_competition"]["losers"] == ["first", "second"]
    assert "## Plan\n\n1. mul.py\n2. calc.py\n" in source.of("build")[0].prompt


def test_one_competition_role_alone_runs_no_competition() -> None:
    record, source = run(
        {"plan": [FIRST_PLAN], "build": [built(CALC)], "review": [APPROVE]},
        rules("plan_alternative"),
    )
    assert "plan_alternative" not in roles_called(source)
    assert record["plan_competition"] is None


ATTACK = "OBJECTION: assumes src/calc.py exists\nOBJECTION: step 2 needs step 3\nVERDICT: revise"


@pytest.mark.parametrize(
    ("bound", "arbiter", "author"),
    [
        ((), None, "plan"),
        (COMPETITION, "CHOICE: first\nPRICE: none", "plan"),
        (COMPETITION, "CHOICE: second\nPRICE: none", "plan_alternative"),
        (COMPETITION, "CHOICE: merged\nPRICE: none\nPLAN:\nthe merged plan", "plan_arbitrate"),
    ],
    ids=["no-competition", "first", "second", "merged"],
)
def test_the_plan_adversarys_revision_is_asked_on_the_authors_thread(
    bound: tuple[str, ...], arbiter: str | None, author: str
) -> None:
    answers: dict[str, list[str | Answer]] = {
        "plan": [FIRST_PLAN],
        "plan_alternative": [SECOND_PLAN],
        "plan_arbitrate": [arbiter or ""],
        "plan_adversary": [ATTACK],
        "build": [built(CALC)],
        "review": [APPROVE],
    }
    answers[author] = [*answers[author], "REVISED PLAN"]
    record, source = run(answers, rules(*bound, "plan_adversary"))
    [attack] = source.of("plan_adversary")
    assert attack.thread == "plan_adversary"
    revision = source.calls[source.calls.index(attack) + 1]
    assert (revision.role, revision.thread) == (author, author)
    assert (
        "OBJECTION: assumes src/calc.py exists\nOBJECTION: step 2 needs step 3" in revision.prompt
    )
    assert record["plan_attack"]["attacked_plan"] in revision.prompt
    # the revision is built and not attacked again; no other planner revises
    assert "## Plan\n\nREVISED PLAN\n" in source.of("build")[0].prompt
    assert record["plan"] == "REVISED PLAN"
    assert record["plan_attack"]["revised"] is True and record["plan_attack"]["author"] == author
    others = {"plan", "plan_alternative", "plan_arbitrate"} - {author}
    assert all(len(source.of(role)) <= 1 for role in others)
    assert "plan_attack" in evidence_kinds(record["proposals"][0])


def test_a_plan_adversary_that_proceeds_asks_for_no_revision() -> None:
    record, source = run(
        {
            "plan": [FIRST_PLAN],
            "plan_adversary": ["Nothing to attack.\nVERDICT: proceed"],
            "build": [built(CALC)],
            "review": [APPROVE],
        },
        rules("plan_adversary"),
    )
    assert roles_called(source) == ["plan", "plan_adversary", "build", "review"]
    assert record["plan"] == FIRST_PLAN and record["plan_attack"]["revised"] is False


# -- the fix loop ----------------------------------------------------------------------


@pytest.mark.parametrize("fix_attempts", [0, 1, 2, 3])
def test_a_reviewer_that_always_objects_stops_within_the_cap(fix_attempts: int) -> None:
    patches = [new_file(f"calc_{i}.py", f"VALUE_{i} = {i}", f"NAME_{i} = 'v{i}'") for i in range(9)]
    record, source = run(
        {"plan": ["1. Add multiply"], "build": [built(p) for p in patches], "review": [CHANGES]},
        rules(),
        fix_attempts=fix_attempts,
    )
    assert record["fix_loop"]["stop"] == "attempts_exhausted"
    assert record["fix_loop"]["attempts"] == 1 + fix_attempts
    assert len(source.of("build")) == len(source.of("review")) == 1 + fix_attempts
    assert record["proposals"] == []
    if fix_attempts:
        retry = source.of("build")[1].prompt
        assert "Missing a test for zero." in retry and patches[0].rstrip("\n") in retry


def test_a_standing_objection_raised_again_stops_the_loop() -> None:
    record, source = run(
        {
            "plan": ["1. Add multiply"],
            "build": [built(CALC), built(CALC_AND_TEST)],
            "review": [CHANGES],
            "review_adversary": [
                "OBJECTION: No test covers zero.\nVERDICT: request_changes",
                "OBJECTION:   no test covers ZERO.  \nVERDICT: request_changes",
            ],
        },
        rules(*REVIEWERS, default_tier=1),
    )
    assert record["fix_loop"]["stop"] == "objection_standing"
    assert record["fix_loop"]["attempts"] == 2 and len(source.of("build")) == 2
    assert "## Standing objections" in source.of("build")[1].prompt
    assert "- No test covers zero." in source.of("build")[1].prompt
    assert "No test covers zero." in source.of("review")[1].prompt  # judged again, same rules
    assert record["fix_loop"]["rounds"][-1]["repeated_objections"] == ["no test covers ZERO."]
    assert record["proposals"] == []


def test_an_identical_resubmitted_diff_stops_as_no_progress_without_review() -> None:
    record, source = run(
        {"plan": ["1. Add multiply"], "build": [built(CALC)], "review": [CHANGES]}, rules()
    )
    assert record["fix_loop"]["stop"] == "no_progress"
    assert record["fix_loop"]["attempts"] == 2
    assert len(source.of("build")) == 2 and len(source.of("review")) == 1
    assert record["fix_loop"]["rounds"][-1] == {
        "attempt": 2,
        "outcome": "no_progress",
        "similarity": 1.0,
    }
    assert record["build"]["attempt"] == 1 and record["review"]["attempt"] == 1


def test_a_near_identical_diff_is_no_progress_too() -> None:
    lines = [f"line_{i} = {i}" for i in range(60)]
    before = new_file("big.py", *lines)
    after = new_file("big.py", *lines[:-1], "line_59 = 'fifty-nine'")
    assert NO_PROGRESS_SIMILARITY <= similarity(before, after) < 1.0
    assert similarity(CALC, OTHER) < NO_PROGRESS_SIMILARITY
    record, source = run(
        {"plan": ["1."], "build": [built(before), built(after)], "review": [CHANGES]}, rules()
    )
    assert record["fix_loop"]["stop"] == "no_progress" and len(source.of("review")) == 1


def test_a_budget_stop_keeps_the_last_reviewed_patch() -> None:
    spent = Answer("", error_kind="budget", error="error_max_budget_usd: the cap is reached")
    record, source = run(
        {"plan": ["1. Add multiply"], "build": [built(CALC), spent], "review": [CHANGES]}, rules()
    )
    assert record["fix_loop"]["stop"] == "budget"
    assert record["fix_loop"]["attempts"] == 2  # the attempt is spent
    assert record["build"]["attempt"] == 1 and record["build"]["patch"] == CALC
    assert record["review"]["attempt"] == 1 and record["review"]["decision"] == "request_changes"
    assert record["change_facts"]["paths"] == ["calc.py"]
    assert record["stopped"] is None and record["proposals"] == []
    assert set(FIX_LOOP_STOPS) == {
        "no_progress",
        "objection_standing",
        "attempts_exhausted",
        "budget",
    }


def test_a_retry_is_reviewed_under_the_same_rules_and_the_proposal_says_which_attempt() -> None:
    graph_rules = rules(*REVIEWERS, tier_rules=(TierRule(1, min_files=2),))
    record, source = run(
        {
            "plan": ["1. Add multiply"],
            "build": [built(CALC), built(CALC_AND_TEST)],
            "review": [CHANGES, APPROVE],
            "review_adversary": ["VERDICT: approve"],
        },
        graph_rules,
    )
    rounds = record["fix_loop"]["rounds"]
    assert [(r["attempt"], r["tier"], r["decision"]) for r in rounds] == [
        (1, 0, "request_changes"),
        (2, 1, "approve"),  # facts recounted, tier recomputed
    ]
    assert record["change_facts"]["files"] == 2 and record["review"]["attempt"] == 2
    [proposal] = record["proposals"]
    assert proposal["attempts"] == 2
    attempts = proposal["evidence"][-1]
    assert attempts == {
        "kind": "attempts",
        "data": {"attempts": 2, "approved_attempt": 2, "fix_attempts": 2, "first_attempt": False},
    }


def test_an_incomplete_handoff_stops_before_review() -> None:
    record, source = run(
        {"plan": ["1. Add multiply"], "build": ["I could not find calc.py."], "review": [APPROVE]},
        rules(),
    )
    assert record["stopped"]["reason"] == "handoff_incomplete"
    assert "review" not in roles_called(source)
    assert record["build"]["patch"] == "" and record["build"]["handoff"]["complete"] is False
    assert record["proposals"] == []


def test_a_failed_first_build_stops_the_graph_by_name() -> None:
    record, _ = run(
        {"plan": ["1."], "build": [Answer("", error_kind="timeout", error="killed")]}, rules()
    )
    assert record["stopped"]["node"] == "build"
    assert record["stopped"]["reason"] == "agent_failed"
    assert record["fix_loop"]["stop"] is None


def test_a_reviewer_without_a_verdict_stops_as_garbage() -> None:
    record, _ = run({"plan": ["1."], "build": [built(CALC)], "review": ["Looks fine."]}, rules())
    assert record["stopped"] == {
        "node": "review",
        "reason": "garbage",
        "detail": "review: no VERDICT: approve|request_changes",
    }


# -- change facts -------------------------------------------------------------------------


def test_a_diff_missing_its_final_newline_counts_the_same() -> None:
    patch = (
        "--- a/calc.py\n+++ b/calc.py\n@@ -1,3 +1,3 @@\n"
        " def add(a, b):\n-    return a+b\n+    return a + b\n x = 1"
    )
    with_newline = change_facts(patch + "\n")
    without = change_facts(patch)
    assert without == with_newline
    assert (without.files, without.insertions, without.deletions) == (1, 1, 1)
    assert without.paths == ("calc.py",)
    last_line_added = "--- a/n.txt\n+++ b/n.txt\n@@ -1 +1 @@\n-old\n+new"
    assert change_facts(last_line_added).insertions == 1
    # through the graph: a raw diff answer, no fence, no final newline
    record, _ = run(
        {"plan": ["1."], "build": [f"Tidy add().\n{patch}"], "review": [APPROVE]}, rules()
    )
    assert record["change_facts"]["insertions"] == 1
    assert record["change_facts"]["deletions"] == 1
    assert record["build"]["patch"] == patch and record["build"]["summary"] == "Tidy add()."


def test_change_facts_are_counted_from_the_patch() -> None:
    patch = (
        "diff --git a/src/a.py b/src/a.py\nindex 1..2 100644\n--- a/src/a.py\n+++ b/src/a.py\n"
        "@@ -1,3 +1,3 @@\n keep\n--- a removed line that looks like a header\n"
        "+++ an added line that looks like a header\n keep\n"
        "--- src/old.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-x\n-y\n"
        "--- /dev/null\n+++ .ci/run\n@@ -0,0 +1 @@\n+echo\n"
        "\\ No newline at end of file\n"
    )
    facts = change_facts(patch, governance_paths=("src/old.py",))
    assert facts.paths == (".ci/run", "src/a.py", "src/old.py")
    assert (facts.files, facts.insertions, facts.deletions) == (3, 2, 3)
    assert facts.governance_paths == (".ci/run", "src/old.py")
    assert facts.self_modification
    assert GOVERNANCE_PATHS == (CARTRIDGE_FILE, ".ci/")


def test_extract_patch_reads_fenced_and_raw_answers() -> None:
    assert extract_patch(built(CALC)) == (CALC, "Adds multiply(); test_calc covers it.")
    assert extract_patch("no diff here") == ("", "no diff here")
    assert extract_patch(f"Done.\n{CALC}") == (CALC, "Done.")


# -- scope --------------------------------------------------------------------------------


def test_scope_files_a_single_ticket_and_goes_on_to_build() -> None:
    record, source = run(
        {
            "scope_epic": ["SUBTASK: add multiply with its test"],
            "plan": ["1."],
            "build": [built(CALC)],
            "review": [APPROVE],
        },
        rules("scope_epic"),
    )
    assert source.calls[0].role == "scope_epic" and source.calls[0].thread == "scope"
    assert [p["kind"] for p in record["proposals"]] == ["item_create", "draft_pr_create"]
    item = record["proposals"][0]
    assert item["payload"]["shape"] == "single" and item["payload"]["route"] == "build"
    assert evidence_kinds(item) == ["epic_threshold", "work_routing"]


def test_scope_routes_a_parent_ticket_away_from_this_build() -> None:
    record, source = run(
        {"scope_epic": ["SUBTASK: a\nSUBTASK: b\n- SUBTASK: c"], "plan": ["1."]},
        rules("scope_epic"),
    )
    assert roles_called(source) == ["scope_epic"]
    assert record["stopped"]["reason"] == "routed"
    [item] = record["proposals"]
    assert item["kind"] == "item_create"
    assert item["payload"]["subtasks"] == ["a", "b", "c"]
    assert item["evidence"][0]["data"] == {
        "pieces": 3,
        "parent_at": 2,
        "epic_at": 5,
        "shape": "parent",
    }
    assert item["evidence"][1]["data"]["route"] == "breakdown"


# -- replay -------------------------------------------------------------------------------


def rich_run() -> dict[str, Any]:
    graph_rules = rules(
        "scope_epic",
        *COMPETITION,
        "plan_adversary",
        "review_adversary",
        "arbitrate",
        tier_rules=(TierRule(1, min_files=2), TierRule(2, paths=("test_*.py",))),
    )
    record, _ = run(
        {
            "scope_epic": [Answer("SUBTASK: multiply", 10, 5, 0.001, 1.5)],
            "plan": [FIRST_PLAN],
            "plan_alternative": [SECOND_PLAN, "REVISED: operator.mul"],
            "plan_arbitrate": ["CHOICE: second\nPRICE: a module more"],
            "plan_adversary": [ATTACK],
            "build": [Answer(built(CALC), 1000, 400, 0.0123, 30.0), built(CALC_AND_TEST)],
            "review": [CHANGES, APPROVE],
            "review_adversary": ["OBJECTION: zero\nVERDICT: request_changes", "VERDICT: approve"],
            "arbitrate": ["Zero is covered now.\nVERDICT: approve"],
        },
        graph_rules,
    )
    return record


def test_replay_reproduces_the_proposals_byte_for_byte() -> None:
    record = json.loads(json.dumps(rich_run()))  # as stored
    assert [p["kind"] for p in record["proposals"]] == ["item_create", "draft_pr_create"]
    assert record["fix_loop"]["approved_attempt"] == 2
    assert record["usage"]["input_tokens"] == 1010
    replayed = replay(record)
    assert canonical_json(replayed["proposals"]) == canonical_json(record["proposals"])
    assert canonical_json(replayed) == canonical_json(record)


def test_a_replay_that_asks_something_else_diverges() -> None:
    record = rich_run()
    tampered = json.loads(json.dumps(record))
    tampered["calls"][3]["prompt_sha256"] = "0" * 64
    with pytest.raises(ReplayDivergence, match="call 3"):
        replay(tampered)
    longer = json.loads(json.dumps(record))
    longer["calls"].append(dict(longer["calls"][-1], index=len(longer["calls"])))
    with pytest.raises(ReplayDivergence, match="asked"):
        replay(longer)


# -- the cartridge ---------------------------------------------------------------------------

ROLE = 'runner = "scripted"\nscript = "answers.toml"\n'


def test_graph_rules_come_from_the_cartridge(tmp_path: Path) -> None:
    (tmp_path / CARTRIDGE_FILE).write_text(
        "".join(f"[roles.{r}]\n{ROLE}" for r in ("plan", "build", "review", *REVIEWERS))
        + '[graph]\nfix_attempts = 1\ngovernance_paths = ["policy/"]\n'
        + "[[graph.review_tiers.rules]]\ntier = 1\nmin_files = 3\n"
        + '[graph.work_routing]\nparent = "build"\n'
        + '[autonomy]\ngraduation_streak = 5\npolicy = { item_create = "auto" }\n'
    )
    graph_rules = GraphRules.from_cartridge(load_cartridge(tmp_path))
    assert graph_rules.bound_roles == {"plan", "build", "review", *REVIEWERS}
    assert graph_rules.fix_attempts == 1 and graph_rules.governance_paths == ("policy/",)
    assert graph_rules.tier_rules == (TierRule(1, min_files=3),)
    assert graph_rules.work_routing == {"single": "build", "parent": "build", "epic": "roadmap"}
    assert GraphRules.from_dict(json.loads(json.dumps(graph_rules.as_dict()))) == graph_rules


def test_the_graph_asks_only_roles_a_cartridge_can_bind() -> None:
    assert set(GRAPH_ROLES) == {"plan", "build", "review", *GRAPH_OPTIONAL_ROLES}


def test_a_cartridge_without_graph_tables_keeps_the_defaults(tmp_path: Path) -> None:
    (tmp_path / CARTRIDGE_FILE).write_text(f"[roles.plan]\n{ROLE}")
    cartridge = load_cartridge(tmp_path)
    assert cartridge.graph.fix_attempts == 2 and cartridge.graph.review_tiers.rules == []
    assert cartridge.autonomy.graduation_streak == 3


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("[graph.review_tiers]\ndefault = 1\n", "roles.review_adversary"),
        ("[[graph.review_tiers.rules]]\ntier = 1\n", "needs a condition"),
        ("[graph]\nfix_attempts = -1\n", "graph.fix_attempts"),
        ("[graph.epic_threshold]\nparent_at = 4\nepic_at = 3\n", "epic_at must be greater"),
        ('[autonomy]\npolicy = { merge = "sometimes" }\n', "autonomy.policy.merge"),
        (
            '[autonomy]\npolicy = { draft_pr_creat = "auto" }\n',
            "autonomy.policy.draft_pr_creat: unknown proposal kind; expected one of "
            "item_create, draft_pr_create, merge",
        ),
        ("[graph]\nfix_attemps = 1\n", "graph.fix_attemps: unknown key"),
    ],
)
def test_a_bad_graph_table_is_an_error_naming_the_key(
    tmp_path: Path, table: str, message: str
) -> None:
    (tmp_path / CARTRIDGE_FILE).write_text(f"[roles.plan]\n{ROLE}{table}")
    with pytest.raises(CartridgeError, match=message):
        load_cartridge(tmp_path)


def _load(tmp_path: Path, text: str) -> str:
    """The error ``load_cartridge`` raises on ``text`` (it must raise)."""
    (tmp_path / CARTRIDGE_FILE).write_text(text)
    with pytest.raises(CartridgeError) as caught:
        load_cartridge(tmp_path)
    return str(caught.value)


@pytest.mark.parametrize(
    ("bound", "table", "key", "unbound"),
    [
        (
            ("review_adversary",),
            "[graph.review_tiers]\ndefault = 1\n",
            "graph.review_tiers.default",
            "[roles.arbitrate] is not bound",
        ),
        (
            ("review_adversary",),
            "[[graph.review_tiers.rules]]\ntier = 0\npaths = ['a/']\n"
            "[[graph.review_tiers.rules]]\ntier = 1\nmin_files = 3\n",
            "graph.review_tiers.rules.1.tier",
            "[roles.arbitrate] is not bound",
        ),
        (
            ("arbitrate",),
            "[graph.review_tiers]\ndefault = 1\n",
            "graph.review_tiers.default",
            "[roles.review_adversary] is not bound",
        ),
        (
            (),
            "[[graph.review_tiers.rules]]\ntier = 2\nself_modification = true\n",
            "graph.review_tiers.rules.0.tier",
            "[roles.review_adversary] and [roles.arbitrate] are not bound",
        ),
    ],
)
def test_a_tier_of_1_or_more_without_its_reviewers_is_refused_naming_the_key(
    tmp_path: Path, bound: tuple[str, ...], table: str, key: str, unbound: str
) -> None:
    # Tier 1 asks the arbitrator whenever the reviewer and the adversary disagree: a
    # cartridge without it is refused when it is read, before any workflow runs, not
    # mid-run with "roles.arbitrate is not bound".
    roles = "".join(f"[roles.{r}]\n{ROLE}" for r in ("plan", "build", "review", *bound))
    message = _load(tmp_path, roles + "[graph]\nenabled = true\n" + table)
    assert message.startswith(f"{tmp_path / CARTRIDGE_FILE}: {key}: tier ")
    assert "needs [roles.review_adversary] and [roles.arbitrate]" in message
    assert message.endswith(f"; {unbound}")
    assert "(top level)" not in message


def test_tier_1_without_the_arbitrator_is_refused_in_words(tmp_path: Path) -> None:
    roles = "".join(f"[roles.{r}]\n{ROLE}" for r in ("plan", "build", "review_adversary"))
    message = _load(tmp_path, roles + "[graph.review_tiers]\ndefault = 1\n")
    assert message == (
        f"{tmp_path / CARTRIDGE_FILE}: graph.review_tiers.default: tier 1 needs "
        "[roles.review_adversary] and [roles.arbitrate] (the arbitrator decides when the "
        "reviewer and the adversary disagree); [roles.arbitrate] is not bound"
    )


def test_tier_1_with_both_reviewers_bound_loads(tmp_path: Path) -> None:
    roles = "".join(f"[roles.{r}]\n{ROLE}" for r in ("plan", "build", "review", *REVIEWERS))
    (tmp_path / CARTRIDGE_FILE).write_text(roles + "[graph.review_tiers]\ndefault = 1\n")
    assert GraphRules.from_cartridge(load_cartridge(tmp_path)).default_tier == 1


def test_the_autonomy_policy_knows_every_proposal_kind_and_only_those(tmp_path: Path) -> None:
    policy = ", ".join(f'{kind} = "auto"' for kind in PROPOSAL_KINDS)
    (tmp_path / CARTRIDGE_FILE).write_text(
        f"[roles.plan]\n{ROLE}[autonomy]\npolicy = {{ {policy} }}\n"
    )
    assert set(load_cartridge(tmp_path).autonomy.policy) == set(PROPOSAL_KINDS)
    message = _load(
        tmp_path, f'[roles.plan]\n{ROLE}[autonomy]\npolicy = {{ draft_pr_creat = "auto" }}\n'
    )
    assert message == (
        f"{tmp_path / CARTRIDGE_FILE}: autonomy.policy.draft_pr_creat: unknown proposal kind; "
        f"expected one of {', '.join(PROPOSAL_KINDS)}"
    )
    # The cartridge checks against the graph's own list: no copy to drift from it.
    assert phasegate.config.cartridge.PROPOSAL_KINDS is PROPOSAL_KINDS


def test_a_model_level_error_reads_without_a_top_level_prefix(tmp_path: Path) -> None:
    message = _load(tmp_path, f'[roles.plan]\n{ROLE}[workflow]\nprofile = "nope"\n')
    assert message.startswith(f"{tmp_path / CARTRIDGE_FILE}: workflow.profile: unknown profile")
    assert "(top level)" not in message
