"""A whole workflow through the development graph (``[graph] enabled = true``) with the
real Claude Code CLI; only its model is scripted (``ScriptedModelServer``).

Every graph role is bound to Claude Code: two planners compete, an arbiter picks the
second plan, an adversary attacks it, the read-only build answers with a unified diff,
a reviewer and an adversary judge it (review tier 1), the apply arm lands the patch
(``draft_pr_create = "auto"``), the change merges and the verifier confirms it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_real_agents import KEYS, SENTINEL, TICKET_ENV, claude_role, claude_scripts

from phasegate.testing.model_server import ScriptedModelServer, Step, key_sha

from agent_cli_kit import VERIFY, assert_no_keys, make_project, run_ticket, show
from conftest import agent_cli, git, phasegate_cli

pytestmark = [pytest.mark.slow, pytest.mark.sandboxed]

# Markers: the fixed first line of each graph prompt (phasegate.graph.prompts), none of
# them a part of another prompt's template, the ticket, the plans or the patch.
PLAN = "Plan the change the ticket below asks for."
PLAN_ALTERNATIVE = "Write a second plan for the ticket below, different from the first."
PLAN_ARBITRATE = "Two plans compete for the ticket below; only one is built."
PLAN_ADVERSARY = "Attack the plan below before anything is built."
BUILD = "Implement the plan below for the ticket below (attempt 1)."
REVIEW = "Review the change below against its ticket and plan."
REVIEW_ADVERSARY = "Argue against the change below: find what its reviewer missed."

FIRST_PLAN = "1. Mention the feature in README.md (approach A-1204)."
SECOND_PLAN = (
    "1. Create feature.txt holding 'the feature' (approach B-7731).\n"
    "2. The landing check `test -f feature.txt` tests it."
)
PATCH = "--- /dev/null\n+++ b/feature.txt\n@@ -0,0 +1 @@\n+the feature\n"
BUILT = (
    "Creates feature.txt holding the feature; the check `test -f feature.txt` tests it.\n\n"
    f"```diff\n{PATCH}```\n"
)

ROLES = (
    "plan",
    "plan_alternative",
    "plan_arbitrate",
    "plan_adversary",
    "build",
    "review",
    "review_adversary",
    "verification",
)


def graph_scripts() -> dict[str, list[Step]]:
    def said(text: str) -> list[Step]:
        return [Step(text=text, input_tokens=80)]

    return {
        PLAN: said(FIRST_PLAN),
        PLAN_ALTERNATIVE: said(SECOND_PLAN),
        PLAN_ARBITRATE: said(
            "The second plan makes the file the ticket asks for.\n"
            "CHOICE: second\n"
            "PRICE: the README does not mention the feature"
        ),
        PLAN_ADVERSARY: said("Every step can be checked.\nVERDICT: proceed"),
        BUILD: said(BUILT),
        REVIEW: said("Correct and minimal.\nVERDICT: approve"),
        REVIEW_ADVERSARY: said("No claim against it holds.\nVERDICT: approve"),
        VERIFY: claude_scripts()[VERIFY],
    }


def prompts(server: ScriptedModelServer, marker: str) -> list[str]:
    """The text of the user turns of each request that played ``marker``'s script."""
    texts = []
    for request in server.played(marker):
        users = [m for m in request.body["messages"] if m["role"] == "user"]
        content = users[-1]["content"] if users else ""
        if isinstance(content, str):
            texts.append(content)
        else:
            texts.append("\n".join(c.get("text", "") for c in content if c.get("type") == "text"))
    return texts


@pytest.fixture
def claude() -> str:
    return agent_cli("claude")


def optional_role(role: str, body: str) -> str:
    return f"[roles.{role}]\n{body}\n"


def test_a_whole_graph_mode_workflow_on_the_real_claude_code(
    tmp_path: Path, claude: str, server_factory
) -> None:
    scripts = graph_scripts()
    server = server_factory(scripts)
    roles = {role: claude_role(claude, server.url) for role in ("plan", "build", "review")}
    roles["plan_review"] = claude_role(claude, server.url)  # bound, never asked in graph mode
    roles["verification"] = claude_role(claude, server.url, key=False)
    extra = (
        "[graph]\nenabled = true\n"
        "[graph.review_tiers]\ndefault = 1\n"
        '[autonomy]\npolicy = { draft_pr_create = "auto" }\n'
        + "".join(
            optional_role(role, claude_role(claude, server.url))
            for role in (
                "plan_alternative",
                "plan_arbitrate",
                "plan_adversary",
                "review_adversary",
                "arbitrate",  # bound for tier 1; not asked, the reviewers agree
            )
        )
    )
    repo = make_project(tmp_path, roles, extra=extra)

    proc = run_ticket(repo, TICKET_ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["status"] == "completed", summary
    assert git(repo, "show", "main:feature.txt") == "the feature"

    # every graph role ran on Claude Code, once, in the graph's order, then the verifier
    detail = show(repo, summary["id"])
    runs = detail["agent_runs"]
    assert [(r["role"], r["runner"], r["outcome"]) for r in runs] == [
        (role, "claude-code", "ok") for role in ROLES
    ]
    for marker in (PLAN, PLAN_ALTERNATIVE, PLAN_ARBITRATE, PLAN_ADVERSARY, BUILD, REVIEW):
        assert server.played(marker), marker
    assert server.played(REVIEW_ADVERSARY) and server.played(VERIFY)

    # the arbiter chose the second plan: the builder got it verbatim, never the first
    built = prompts(server, BUILD)
    assert built and all(f"## Plan\n\n{SECOND_PLAN}\n" in p for p in built), built
    assert not any("A-1204" in p for p in built), built
    # the adversary attacked the second plan too; the reviewers judged the builder's patch
    attacked = prompts(server, PLAN_ADVERSARY)
    assert attacked and all(SECOND_PLAN in p and "A-1204" not in p for p in attacked), attacked
    for marker in (REVIEW, REVIEW_ADVERSARY):
        judged = prompts(server, marker)
        assert judged and all(f"```diff\n{PATCH}```" in p for p in judged), judged
    # the kept planning answers were not asked (nor counted) again by development
    model_requests = [r for r in server.requests if r.script]
    assert summary["tokens"] == 100 * len(model_requests) == detail["workflow"]["tokens"]
    # the build held the key; the verifier only its own
    assert {r.key_sha for r in server.played(BUILD)} == {key_sha(SENTINEL)}

    # one draft PR proposal, applied by the apply arm, with the graph's whole evidence
    listed = phasegate_cli("proposals", "--repo", str(repo), "--json")
    assert listed.returncode == 0, listed.stderr
    [proposal] = json.loads(listed.stdout)
    assert proposal["kind"] == "draft_pr_create"
    assert (proposal["mode"], proposal["status"], proposal["decided_by"]) == (
        "auto",
        "applied",
        "auto",
    )
    assert proposal["attempts"] == 1 and proposal["paths"] == ["feature.txt"]
    assert proposal["payload"]["patch"] == PATCH
    evidence = {e["kind"]: e["data"] for e in proposal["evidence"]}
    assert {"plan_competition", "plan_attack", "review", "change_facts", "attempts", "checks"} <= (
        set(evidence)
    )
    assert evidence["plan_competition"]["choice"] == "second"
    assert evidence["plan_competition"]["author"] == "plan_alternative"
    assert evidence["plan_competition"]["price"] == "the README does not mention the feature"
    assert (evidence["plan_attack"]["verdict"], evidence["plan_attack"]["revised"]) == (
        "proceed",
        False,
    )
    assert evidence["review"] == {
        "tier": 1,
        "decision": "approve",
        "review": "approve",
        "adversary": "approve",
        "arbitrate": None,
    }
    assert (evidence["change_facts"]["files"], evidence["change_facts"]["insertions"]) == (1, 1)
    assert evidence["attempts"]["first_attempt"] is True
    checks = evidence["checks"]
    assert checks["applied"] is True and checks["passed"] is True
    assert [(c["command"], c["passed"]) for c in checks["results"]] == [
        ("test -f feature.txt", True)
    ]

    # the recorded run replays offline to the very same proposal
    run_id = f"{summary['id']}-g1"
    assert proposal["run_id"] == run_id
    replayed = phasegate_cli("replay", run_id, "--repo", str(repo), "--json")
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    out = json.loads(replayed.stdout)
    assert (out["identical"], out["difference"], out["proposals"]) == (True, None, 1)
    assert out["calls"] == len(ROLES) - 1  # every graph call; the verifier is no graph call

    assert_no_keys(
        repo, KEYS, proc.stdout, proc.stderr, json.dumps(detail), listed.stdout, replayed.stdout
    )
