"""Graduated autonomy: which proposals a person gates, decided from the history."""

from __future__ import annotations

from typing import Any

import pytest

from phasegate.core.autonomy import AutonomyPolicy, GateDecision, decide, streak
from phasegate.graph import GraphRules, ScriptedAnswers, run_lifecycle
from phasegate.graph.proposals import Proposal

POLICY = AutonomyPolicy(graduation_streak=3, governance_paths=("policy/",))


def proposal(
    kind: str = "draft_pr_create",
    attempts: int = 1,
    paths: tuple[str, ...] = ("src/calc.py",),
    self_modification: bool = False,
) -> Proposal:
    return Proposal(
        id=f"run/{kind}/1",
        kind=kind,
        title="Add multiply()",
        payload={},
        attempts=attempts,
        self_modification=self_modification,
        paths=paths,
    )


def approve(p: Proposal, by: Any = "person") -> GateDecision:
    return GateDecision.of(p, "approved", by=by, policy=POLICY)


def reject(p: Proposal) -> GateDecision:
    return GateDecision.of(p, "rejected", policy=POLICY)


def test_three_clean_approvals_graduate() -> None:
    history: list[GateDecision] = []
    for _ in range(3):
        assert decide(proposal(), history, POLICY).mode == "propose"
        history.append(approve(proposal()))
    graduated = decide(proposal(), history, POLICY)
    assert (graduated.mode, graduated.reason, graduated.streak) == ("auto", "graduated", 3)
    # per kind: the draft PRs' streak does not graduate item_create
    assert decide(proposal("item_create"), history, POLICY).mode == "propose"


def test_a_pass_that_needed_retries_does_not_count() -> None:
    history = [approve(proposal()), approve(proposal(attempts=2)), approve(proposal())]
    assert streak("draft_pr_create", history) == 2
    assert decide(proposal(), history, POLICY).mode == "propose"
    history.append(approve(proposal(attempts=3)))
    assert decide(proposal(), history, POLICY).mode == "propose"
    history.append(approve(proposal()))
    assert decide(proposal(), history, POLICY).mode == "auto"


def test_a_rejection_resets_the_streak() -> None:
    history = [approve(proposal()), approve(proposal()), reject(proposal())]
    assert streak("draft_pr_create", history) == 0
    history += [approve(proposal()), approve(proposal())]
    assert decide(proposal(), history, POLICY).mode == "propose"
    history.append(approve(proposal()))
    assert decide(proposal(), history, POLICY).mode == "auto"
    history.append(reject(proposal()))  # a graduated kind goes back to a person
    assert decide(proposal(), history, POLICY).mode == "propose"


@pytest.mark.parametrize(
    "governed",
    [
        proposal(paths=("phasegate.toml",)),
        proposal(paths=("src/a.py", ".ci/run")),
        proposal(paths=("policy/review.md",)),
        proposal(self_modification=True),
    ],
    ids=["cartridge", "ci", "configured", "flagged"],
)
def test_self_modification_never_graduates(governed: Proposal) -> None:
    history = [approve(governed) for _ in range(10)]
    assert all(d.self_modification for d in history)
    assert streak("draft_pr_create", history) == 0  # its approvals never extend a streak
    history += [approve(proposal()) for _ in range(5)]
    assert decide(proposal(), history, POLICY).mode == "auto"
    said = decide(governed, history, POLICY)
    assert (said.mode, said.reason) == ("propose", "self_modification")
    pinned = AutonomyPolicy(policy={"draft_pr_create": "auto"}, governance_paths=("policy/",))
    assert decide(governed, [], pinned).mode == "propose"


def test_the_policy_pins_a_kind_or_turns_graduation_off() -> None:
    pinned = AutonomyPolicy(policy={"item_create": "auto"})
    assert decide(proposal("item_create"), [], pinned).reason == "policy_auto"
    never = AutonomyPolicy(graduation_streak=0)
    history = [approve(proposal()) for _ in range(20)]
    assert decide(proposal(), history, never).reason == "no_graduation"
    # the apply arm's own approvals are not a person's judgement
    assert streak("draft_pr_create", [approve(proposal(), by="auto")] * 5) == 0
    with pytest.raises(ValueError, match="propose or auto"):
        AutonomyPolicy(policy={"merge": "always"})


def test_a_graph_proposal_carries_its_attempts_into_the_history() -> None:
    diff = "--- /dev/null\n+++ b/calc.py\n@@ -0,0 +1 @@\n+x = 1\n"
    retried = "--- /dev/null\n+++ b/calc.py\n@@ -0,0 +1,2 @@\n+x = 1\n+def multiply(a, b): ...\n"
    record = run_lifecycle(
        ScriptedAnswers(
            {
                "plan": ["1."],
                "build": [f"```diff\n{diff}```", f"```diff\n{retried}```"],
                "review": ["VERDICT: request_changes", "VERDICT: approve"],
            }
        ),
        run_id="r",
        date="2025-05-01",
        cartridge=GraphRules(bound_roles=frozenset({"plan", "build", "review"})),
        ticket="Add multiply()",
    )
    [row] = record["proposals"]
    decision = GateDecision.of(row, "approved", policy=POLICY)
    assert decision.attempts == 2 and not decision.clean
    assert decide(row, [decision] * 3, POLICY).mode == "propose"


def test_failed_checks_keep_a_graduated_or_pinned_kind_for_a_person() -> None:
    from dataclasses import replace

    from phasegate.graph.proposals import Evidence

    graduated = [approve(proposal()) for _ in range(3)]
    pinned = AutonomyPolicy(policy={"draft_pr_create": "auto"})
    passing = replace(proposal(), evidence=(Evidence("checks", {"passed": True}),))
    failing = replace(proposal(), evidence=(Evidence("checks", {"passed": False}),))
    assert decide(passing, graduated, POLICY).mode == "auto"
    assert decide(failing, graduated, POLICY).reason == "checks_failed"
    assert decide(failing, [], pinned).mode == "propose"
    assert decide(passing, [], pinned).mode == "auto"
