"""The development graph's records and the human gate, on a real SQLite file.

Migration 0002, ``Store.record_run`` (one transaction, modes from the autonomy
policy), ``phasegate approve/reject/proposals/replay/propose`` through the real
console script, graduation counted from the store's gate history, and the
shell that answers the graph with the cartridge's runners.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from phasegate.agents import ScriptedRunner
from phasegate.agents.base import AgentRequest, AgentResult
from phasegate.config.cartridge import CARTRIDGE_FILE, Cartridge, load_cartridge
from phasegate.core.autonomy import AutonomyPolicy, streak
from phasegate.core.contract import MilestoneWrite, ProposalDecided, ProposalNotFound, RunNotFound
from phasegate.graph import (
    AgentCall,
    Answer,
    GraphRules,
    ScriptedAnswers,
    canonical_json,
    run_lifecycle,
)
from phasegate.phases.graph_mode.harness import (
    ProposeInterrupted,
    RunnerAnswers,
    first_difference,
    propose,
    replay_check,
)
from phasegate.store import Store, open_store
from phasegate.store import tables as t
from phasegate.store.store import make_dialect
from phasegate.store.values import HEAD_REVISION
from phasegate.testing import FixedClock

from conftest import git, make_repo, phasegate_cli, scripted_cartridge

RULES = GraphRules(bound_roles=frozenset({"plan", "build", "review"}))
TICKET = "Add multiply() to calc\n\ncalc.multiply(a, b) returns a * b."
APPROVE = "Correct and tested.\nVERDICT: approve"
CHANGES = "Missing a test for zero.\nVERDICT: request_changes"


def new_file(path: str, *lines: str) -> str:
    body = "".join(f"+{line}\n" for line in lines)
    return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1,{len(lines)} @@\n{body}"


def built(patch: str, summary: str = "Adds multiply(); test_calc covers it.") -> str:
    return f"{summary}\n\n```diff\n{patch}```\n"


CALC = new_file("calc.py", "def multiply(a, b):", "    return a * b")
CALC_WITH_TEST = CALC + new_file("test_calc.py", "from calc import multiply")
CARTRIDGE_CHANGE = (
    f"--- a/{CARTRIDGE_FILE}\n+++ b/{CARTRIDGE_FILE}\n@@ -1 +1 @@\n-fix_attempts = 2\n"
    "+fix_attempts = 3\n"
)


def graph_record(
    run_id: str,
    *,
    builds: tuple[str, ...] = (built(CALC),),
    reviews: tuple[str, ...] = (APPROVE,),
    ticket: str = TICKET,
) -> dict[str, Any]:
    """A real run record of the pure graph, answered from data."""
    answers = ScriptedAnswers({"plan": ["1. Add multiply"], "build": builds, "review": reviews})
    return run_lifecycle(answers, run_id=run_id, date="2026-01-01", cartridge=RULES, ticket=ticket)


def clean_run(run_id: str) -> dict[str, Any]:
    """Approved on its first attempt."""
    return graph_record(run_id)


def retried_run(run_id: str) -> dict[str, Any]:
    """Approved on the second attempt, after the reviewer sent the first back."""
    return graph_record(
        run_id, builds=(built(CALC), built(CALC_WITH_TEST)), reviews=(CHANGES, APPROVE)
    )


def self_modifying_run(run_id: str) -> dict[str, Any]:
    """Approved first time, but it changes the cartridge."""
    return graph_record(run_id, builds=(built(CARTRIDGE_CHANGE),))


@pytest.fixture
def clock() -> FixedClock:
    return FixedClock()


@pytest.fixture
def store(store_url: str, clock: FixedClock) -> Store:
    s = open_store(store_url, clock)
    yield s
    s.close()


def table_count(store: Store, table: sa.Table) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


# -- migrations 0002 and 0003 -----------------------------------------------------------------


def test_migrations_upgrade_a_0001_database_with_its_data_in_place(
    store_url: str, clock: FixedClock
) -> None:
    url = store_url
    dialect = make_dialect(url)
    old = Store(dialect.engine(), clock, dialect)
    old.migrate("0001")
    assert "proposals" not in sa.inspect(old.engine).get_table_names()
    workflow_id = old.create_workflow(
        title="old",
        ticket="filed before 0002",
        repo_path="/r",
        base_branch="main",
        auto_merge=False,
        content_language="en",
    )
    old.write_milestone(workflow_id, "preparation", MilestoneWrite("issue_created", data={"n": 1}))
    old.close()

    store = open_store(url, clock)  # what a user's next command does
    try:
        with store.engine.connect() as conn:
            version = conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
            diffs = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), t.metadata
            )
        assert version == HEAD_REVISION
        assert diffs == []
        tables = set(sa.inspect(store.engine).get_table_names())
        assert {"graph_runs", "proposals", "graph_calls"} <= tables
        # the 0001 data is where it was, and the new tables refer to it
        assert store.workflow_row(workflow_id)["ticket"] == "filed before 0002"
        assert [m.data for m in store.milestones(workflow_id)] == [{"n": 1}]
        [row] = store.record_run(clean_run("r1"), workflow_id=workflow_id)
        assert row["workflow_id"] == workflow_id
        assert store.run("r1")["workflow_id"] == workflow_id
    finally:
        store.close()


# -- record_run ------------------------------------------------------------------------------


def test_record_run_stores_the_whole_record_and_its_proposals(
    store: Store, clock: FixedClock
) -> None:
    record = clean_run("r1")
    rows = store.record_run(record)

    stored = store.run("r1")
    assert canonical_json(stored["record"]) == canonical_json(record)
    assert stored["date"] == "2026-01-01" and stored["created_at"] == clock.now()
    assert [c["role"] for c in stored["record"]["calls"]] == ["plan", "build", "review"]
    [row] = rows
    [proposal] = record["proposals"]
    assert len(row["id"]) == 8 and int(row["id"], 16) >= 0  # short hex
    assert row["record_id"] == proposal["id"] == "r1/draft_pr_create/1"
    assert (row["run_id"], row["kind"], row["title"]) == (
        "r1",
        "draft_pr_create",
        proposal["title"],
    )
    assert row["payload"] == proposal["payload"] and row["evidence"] == proposal["evidence"]
    assert (row["attempts"], row["self_modification"], row["paths"]) == (1, False, ["calc.py"])
    assert (row["mode"], row["status"]) == ("propose", "proposed")
    assert (row["decided_by"], row["decided_at"], row["reason"]) == (None, None, None)
    assert row["created_at"] == clock.now()
    assert store.proposal(row["id"]) == row
    assert store.proposals(status="proposed") == [row] and store.proposals(status="approved") == []


def test_record_run_is_one_transaction(store: Store) -> None:
    record = clean_run("r1")
    broken = {**record, "proposals": [*record["proposals"], {"id": "r1/broken/2"}]}
    with pytest.raises(KeyError):
        store.record_run(broken)  # the second proposal is malformed: nothing at all is kept
    assert table_count(store, t.graph_runs) == 0
    assert table_count(store, t.proposals) == 0

    store.record_run(record)
    with pytest.raises(sa.exc.IntegrityError):
        store.record_run(record)  # a run is recorded once
    assert (table_count(store, t.graph_runs), table_count(store, t.proposals)) == (1, 1)
    with pytest.raises(ValueError, match="calls"):
        store.record_run({k: v for k, v in record.items() if k != "calls"})


def test_unknown_runs_and_proposals_are_named(store: Store) -> None:
    with pytest.raises(RunNotFound, match="'nope'"):
        store.run("nope")
    with pytest.raises(ProposalNotFound, match="'beef'"):
        store.proposal("beef")
    with pytest.raises(ProposalNotFound, match="'beef'"):
        store.decide_proposal("beef", "approved", "ana")


def test_a_decision_records_who_when_and_why_and_is_never_overwritten(
    store: Store, clock: FixedClock
) -> None:
    [first] = store.record_run(clean_run("r1"))
    [second] = store.record_run(clean_run("r2"))
    clock.advance(60)
    approved = store.decide_proposal(first["id"], "approved", "ana")
    assert (approved["status"], approved["decided_by"]) == ("approved", "ana")
    assert approved["decided_at"] == clock.now() and approved["reason"] is None
    clock.advance(60)
    rejected = store.decide_proposal(second["id"], "rejected", "bo", "no test for zero")
    assert (rejected["status"], rejected["decided_by"], rejected["reason"]) == (
        "rejected",
        "bo",
        "no test for zero",
    )
    with pytest.raises(ProposalDecided, match=f"{first['id']} was approved already by ana"):
        store.decide_proposal(first["id"], "rejected", "bo", "changed my mind")
    assert store.proposal(first["id"]) == approved
    with pytest.raises(ValueError, match="approved or rejected"):
        store.decide_proposal(second["id"], "maybe", "ana")
    history = store.gate_history()
    assert [(d.proposal_id, d.outcome, d.by) for d in history] == [
        (first["id"], "approved", "person"),
        (second["id"], "rejected", "person"),
    ]


# -- graduation, counted from the store ----------------------------------------------------------


def record_and_decide(
    store: Store,
    run: Callable[[str], dict[str, Any]],
    verdict: str | None,
    policy: AutonomyPolicy | None = None,
) -> dict[str, Any]:
    """Record a run; decide its draft PR proposal (when ``verdict``); return its row."""
    run_id = f"r{len(store.proposals()) + 1}"
    [row] = store.record_run(run(run_id), policy=policy)
    if verdict is not None:
        store.decide_proposal(row["id"], verdict, "ana", None if verdict == "approved" else "no")
    return row


def test_three_clean_first_attempt_approvals_graduate_the_kind(store: Store) -> None:
    modes = [record_and_decide(store, clean_run, "approved")["mode"] for _ in range(3)]
    assert modes == ["propose", "propose", "propose"]
    assert streak("draft_pr_create", store.gate_history("draft_pr_create")) == 3
    assert record_and_decide(store, clean_run, None)["mode"] == "auto"


def test_a_pass_that_needed_retries_does_not_extend_the_streak(store: Store) -> None:
    record_and_decide(store, clean_run, "approved")
    retried = record_and_decide(store, retried_run, "approved")
    assert retried["attempts"] == 2
    record_and_decide(store, clean_run, "approved")
    assert streak("draft_pr_create", store.gate_history("draft_pr_create")) == 2
    assert record_and_decide(store, clean_run, "approved")["mode"] == "propose"
    assert record_and_decide(store, clean_run, None)["mode"] == "auto"


def test_a_rejection_resets_the_streak(store: Store) -> None:
    record_and_decide(store, clean_run, "approved")
    record_and_decide(store, clean_run, "approved")
    record_and_decide(store, clean_run, "rejected")
    record_and_decide(store, clean_run, "approved")
    record_and_decide(store, clean_run, "approved")
    assert streak("draft_pr_create", store.gate_history()) == 2
    assert record_and_decide(store, clean_run, "approved")["mode"] == "propose"
    assert record_and_decide(store, clean_run, None)["mode"] == "auto"


def test_a_self_modification_never_gets_auto(store: Store) -> None:
    for _ in range(3):
        record_and_decide(store, clean_run, "approved")
    governing = record_and_decide(store, self_modifying_run, None)
    assert (governing["self_modification"], governing["mode"]) == (True, "propose")
    # a path the cartridge's autonomy policy governs is a self_modification too
    policy = AutonomyPolicy(governance_paths=("calc.py",))
    governed = record_and_decide(store, clean_run, None, policy)
    assert (governed["self_modification"], governed["mode"]) == (True, "propose")
    # and its approval does not count towards a streak
    store.decide_proposal(governed["id"], "approved", "ana")
    assert streak("draft_pr_create", store.gate_history()) == 3
    # even under a policy that says auto
    auto = AutonomyPolicy(policy={"draft_pr_create": "auto"})
    assert record_and_decide(store, self_modifying_run, None, auto)["mode"] == "propose"
    # the streak is 3: a cartridge asking for 4 still proposes
    longer = AutonomyPolicy(graduation_streak=4)
    assert record_and_decide(store, clean_run, None, longer)["mode"] == "propose"


# -- the CLI: proposals, approve, reject, replay ---------------------------------------------------


@pytest.fixture
def gate_repo(tmp_path: Path) -> Path:
    """A repository with a scripted cartridge and a store holding two recorded runs."""
    repo = make_repo(tmp_path / "repo", {"README.md": "# calc\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text("")
    (repo / CARTRIDGE_FILE).write_text(scripted_cartridge())
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    store = open_store(load_cartridge(repo).store_url(repo))
    try:
        store.record_run(clean_run("run-a"))
        store.record_run(retried_run("run-b"))
    finally:
        store.close()
    return repo


def repo_store(repo: Path) -> Store:
    return open_store(load_cartridge(repo).store_url(repo))


def cli_json(*args: str) -> tuple[int, Any]:
    proc = phasegate_cli(*args, "--json")
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else proc.stderr


def test_proposals_lists_them_and_filters_by_status(gate_repo: Path) -> None:
    code, rows = cli_json("proposals", "--repo", str(gate_repo))
    assert code == 0
    assert [(r["run_id"], r["kind"], r["mode"], r["status"], r["attempts"]) for r in rows] == [
        ("run-a", "draft_pr_create", "propose", "proposed", 1),
        ("run-b", "draft_pr_create", "propose", "proposed", 2),
    ]
    table = phasegate_cli("proposals", "--repo", str(gate_repo))
    assert table.returncode == 0, table.stderr
    header = table.stdout.splitlines()[1]
    for column in ("id", "kind", "title", "mode", "status", "attempts", "decided_by"):
        assert column in header
    assert rows[0]["id"] in table.stdout and "Add multiply() to calc" in table.stdout
    assert cli_json("proposals", "--status", "approved", "--repo", str(gate_repo)) == (0, [])
    bad = phasegate_cli("proposals", "--status", "done", "--repo", str(gate_repo))
    assert bad.returncode == 2 and "--status 'done'" in bad.stderr


def test_approve_and_reject_record_who_and_when_once(gate_repo: Path) -> None:
    store = repo_store(gate_repo)
    try:
        first, second = (r["id"] for r in store.proposals())
    finally:
        store.close()
    approved = phasegate_cli("approve", first, "--by", "ana", "--repo", str(gate_repo))
    assert approved.returncode == 0, approved.stderr
    assert f"proposal {first} (draft_pr_create) approved by ana" in approved.stdout
    assert "1 clean first-attempt approval(s) in a row; it graduates to auto at 3" in (
        approved.stdout
    )
    code, rejected = cli_json(
        "reject", second, "--reason", "no test for zero", "--by", "bo", "--repo", str(gate_repo)
    )
    assert code == 0
    assert (rejected["status"], rejected["decided_by"], rejected["reason"]) == (
        "rejected",
        "bo",
        "no test for zero",
    )
    assert rejected["decided_at"] and rejected["streak"] == 0

    store = repo_store(gate_repo)
    try:
        row = store.proposal(first)
        assert (row["status"], row["decided_by"]) == ("approved", "ana")
        assert row["decided_at"] is not None and row["decided_at"].tzinfo is not None
    finally:
        store.close()

    again = phasegate_cli("reject", first, "--reason", "late", "--repo", str(gate_repo))
    assert again.returncode == 2
    assert f"proposal {first} was approved already by ana" in again.stderr
    unknown = phasegate_cli("approve", "deadbeef", "--repo", str(gate_repo))
    assert unknown.returncode == 2 and "'deadbeef'" in unknown.stderr
    no_reason = phasegate_cli("reject", second, "--repo", str(gate_repo))
    assert no_reason.returncode == 2 and "--reason" in no_reason.stderr
    for gate in ("auto", "harness:checks"):
        as_a_gate = phasegate_cli("approve", first, "--by", gate, "--repo", str(gate_repo))
        assert as_a_gate.returncode == 2 and "phasegate's own gate" in as_a_gate.stderr


def test_replay_reproduces_a_recorded_run_byte_for_byte(gate_repo: Path) -> None:
    for run_id in ("run-a", "run-b"):
        proc = phasegate_cli("replay", run_id, "--repo", str(gate_repo))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("identical: 1 proposal(s)")
    code, out = cli_json("replay", "run-b", "--repo", str(gate_repo))
    assert (code, out["identical"], out["difference"], out["calls"]) == (0, True, None, 5)
    unknown = phasegate_cli("replay", "nope", "--repo", str(gate_repo))
    assert unknown.returncode == 2 and "'nope'" in unknown.stderr


def tamper(repo: Path, run_id: str, change: Callable[[dict[str, Any]], None]) -> None:
    store = repo_store(repo)
    try:
        record = store.run(run_id)["record"]
        change(record)
        with store.transaction() as conn:
            conn.execute(
                t.graph_runs.update().where(t.graph_runs.c.run_id == run_id).values(record=record)
            )
    finally:
        store.close()


def test_a_tampered_record_reports_its_first_difference(gate_repo: Path) -> None:
    def retitle(record: dict[str, Any]) -> None:
        record["proposals"][0]["title"] = "Something else"

    tamper(gate_repo, "run-a", retitle)
    proc = phasegate_cli("replay", "run-a", "--repo", str(gate_repo))
    assert proc.returncode == 1
    assert proc.stdout.strip() == (
        'different: proposals[0].title: recorded "Something else", '
        'replayed "Add multiply() to calc"'
    )

    def other_patch(record: dict[str, Any]) -> None:
        build = next(c for c in record["calls"] if c["role"] == "build")
        build["response"] = built(new_file("mul.py", "import operator"))

    tamper(gate_repo, "run-b", other_patch)
    code, out = cli_json("replay", "run-b", "--repo", str(gate_repo))
    assert (code, out["identical"]) == (1, False)
    assert out["difference"].startswith("the replay diverged: call 2:")  # review saw another diff


def test_first_difference_names_the_path() -> None:
    assert first_difference({"a": [1, {"b": 2}]}, {"a": [1, {"b": 3}]}) == (
        "a[1].b: recorded 2, replayed 3"
    )
    assert first_difference([1], [1, 2], "p") == "p: 1 recorded, 2 replayed"
    assert first_difference({"a": 1}, {}, "p") == "p.a: recorded, missing from the replay"
    assert replay_check(clean_run("r")).identical


# -- propose: the graph on the repository, with the cartridge's runners --------------------------

PROPOSE_ANSWERS = '''
[[scope_epic]]
text = "SUBTASK: Add multiply() with its test"

[[plan]]
text = "1. Add multiply() to calc.py\\n2. Test it in test_calc.py"

[[build]]
text = """Adds multiply(); test_calc covers it.

```diff
--- /dev/null
+++ b/calc.py
@@ -0,0 +1,2 @@
+def multiply(a, b):
+    return a * b
```
"""
input_tokens = 120
output_tokens = 40
cost_usd = 0.02
[build.files]
"written-by-build.txt" = "a read-only build writes nothing"

[[review]]
text = "Correct and small.\\nVERDICT: approve"
input_tokens = 30
output_tokens = 5
'''

SCOPE_ROLE = '[roles.scope_epic]\nrunner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n'


def propose_repo(
    tmp_path: Path,
    answers: str = PROPOSE_ANSWERS,
    extra: str = SCOPE_ROLE,
    checks: list[str] | None = None,
) -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# calc\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(answers)
    (repo / CARTRIDGE_FILE).write_text(scripted_cartridge(extra=extra, checks=checks))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


def test_propose_runs_the_graph_and_records_a_draft_pr_proposal(tmp_path: Path) -> None:
    repo = propose_repo(tmp_path)
    code, out = cli_json("propose", "Add multiply() to calc", "--repo", str(repo))
    assert code == 0, out
    assert out["stopped"] is None and out["fix_loop"]["approved_attempt"] == 1
    assert out["calls"] == 4
    assert out["usage"] == {"input_tokens": 150, "output_tokens": 45, "cost_usd": 0.02}
    item, draft = out["proposals"]
    assert item["kind"] == "item_create" and item["payload"]["shape"] == "single"
    assert draft["kind"] == "draft_pr_create"
    assert (draft["mode"], draft["status"], draft["attempts"]) == ("propose", "proposed", 1)
    assert draft["paths"] == ["calc.py"]
    assert "+def multiply(a, b):" in draft["payload"]["patch"]
    assert [e["kind"] for e in draft["evidence"]] == [
        "change_facts",
        "review",
        "attempts",
        "checks",
    ]
    # no checks configured: the patch was still applied in a scratch worktree
    assert draft["evidence"][3]["data"] | {"base": None} == {
        "applied": True,
        "base": None,
        "results": [],
        "passed": True,
    }
    facts = draft["evidence"][0]["data"]
    assert (facts["files"], facts["paths"]) == (1, ["calc.py"])
    assert draft["evidence"][1]["data"]["decision"] == "approve"
    assert draft["evidence"][2]["data"]["first_attempt"] is True

    # build ran read-only: nothing was applied or written in the checkout
    assert git(repo, "status", "--porcelain") == ""
    assert not (repo / "calc.py").exists() and not (repo / "written-by-build.txt").exists()

    run_id = out["run_id"]
    store = repo_store(repo)
    try:
        record = store.run(run_id)["record"]
        assert [c["role"] for c in record["calls"]] == ["scope_epic", "plan", "build", "review"]
        assert record["date"] == store.run(run_id)["created_at"].date().isoformat()
        assert [r["id"] for r in store.proposals(run_id=run_id)] == [item["id"], draft["id"]]
    finally:
        store.close()
    replayed = phasegate_cli("replay", run_id, "--repo", str(repo))
    assert replayed.returncode == 0 and replayed.stdout.startswith("identical: 2 proposal(s)")

    text = phasegate_cli("propose", "Add multiply() to calc", "--repo", str(repo))
    assert text.returncode == 0, text.stderr
    assert "draft_pr_create" in text.stdout and "propose" in text.stdout
    assert "phasegate approve ID" in text.stdout


def test_propose_without_an_approval_records_the_run_and_exits_1(tmp_path: Path) -> None:
    answers = PROPOSE_ANSWERS.replace("[[build]]", "[[build]]\nexit_code = 3", 1)
    repo = propose_repo(tmp_path, answers, extra="")
    code, out = cli_json("propose", "Add multiply() to calc", "--repo", str(repo))
    assert (code, out["proposals"]) == (1, [])
    assert out["stopped"]["node"] == "build" and out["stopped"]["reason"] == "agent_failed"
    store = repo_store(repo)
    try:
        record = store.run(out["run_id"])["record"]
    finally:
        store.close()
    # 1 + agent_retries (2) tries of build, every try's tokens in its one recorded call
    [build] = [c for c in record["calls"] if c["role"] == "build"]
    assert (build["error_kind"], build["error"], build["input_tokens"]) == (
        "exit_code",
        "exited with code 3",
        360,
    )
    text = phasegate_cli("propose", "Add multiply() to calc", "--repo", str(repo))
    assert text.returncode == 1
    assert "stopped at build: agent_failed: build: exit_code" in text.stdout
    assert "no proposals" in text.stdout


def test_propose_refuses_a_cartridge_the_graph_cannot_run(tmp_path: Path) -> None:
    repo = propose_repo(tmp_path, extra="")
    review = '[roles.review]\nrunner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n'
    cartridge = (repo / CARTRIDGE_FILE).read_text()
    assert review in cartridge
    (repo / CARTRIDGE_FILE).write_text(cartridge.replace(review, ""))
    git(repo, "commit", "-qam", "review unbound")  # what runs is the committed cartridge
    unbound = phasegate_cli("propose", "x", "--repo", str(repo))
    assert unbound.returncode == 2
    assert "the graph needs the roles review bound" in unbound.stderr
    assert phasegate_cli("propose", "--repo", str(repo)).returncode == 2  # no ticket


# -- the answer source ------------------------------------------------------------------------


def graph_cartridge(**limits: Any) -> Cartridge:
    role = {"runner": "scripted", "script": "unused.toml"}
    return Cartridge.model_validate(
        {"roles": {"plan": role, "build": role, "review": role}, "limits": limits}
    )


def test_runner_answers_map_failures_to_the_graphs_error_kinds(tmp_path: Path) -> None:
    runner = ScriptedRunner(
        {
            "plan": [{"text": "", "exit_code": 1, "input_tokens": 5}],
            "build": [{"text": "a diff", "cost_usd": 0.5}],
        }
    )
    answers = RunnerAnswers(
        graph_cartridge(agent_retries=1, workflow_budget_usd=0.5),
        tmp_path,
        "run-1",
        runners={"plan": runner, "build": runner},
    )
    failed = answers(AgentCall("plan", "plan", "plan", "Plan it."))
    assert (failed.error_kind, failed.error, failed.input_tokens) == (
        "exit_code",
        "exited with code 1",
        10,  # two tries, both counted
    )
    built_ = answers(AgentCall("build", "build", "build", "Build it."))
    assert (built_.ok, built_.text, built_.cost_usd) == (True, "a diff", 0.5)
    capped = answers(AgentCall("build", "build", "build", "Again."))
    assert (capped.error_kind, capped.error) == ("budget", "the spend cap is reached")


class _Recording:
    """A runner that keeps its requests; ``write`` makes it change the checkout."""

    name = "recording"

    def __init__(self, write: str | None = None) -> None:
        self.requests: list[AgentRequest] = []
        self.write = write

    def run(self, request: AgentRequest, cancel: threading.Event, on_spawn: Any = None) -> Any:
        self.requests.append(request)
        if self.write:
            (request.cwd / self.write).write_text("stray\n")
        return AgentResult("VERDICT: approve", session_id=f"s-{request.session_line}")


def test_every_role_runs_read_only_in_the_checkout_on_its_threads_session(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    runner = _Recording()
    answers = RunnerAnswers(
        graph_cartridge(agent_retries=0), repo, "run-1", runners={"build": runner, "review": runner}
    )
    for prompt in ("one", "two"):
        answers(AgentCall("build", "build", "build", prompt))
    answers(AgentCall("review", "review", "review", "three"))
    first, second, review = runner.requests
    assert all(r.read_only and r.cwd == repo for r in runner.requests)
    assert (first.call_index, second.call_index, review.call_index) == (0, 1, 0)
    assert (first.session_id, second.session_id) == (None, "s-build")
    assert review.session_id is None and review.workflow_id == "run-1"


def test_a_role_that_writes_fails_read_only_violation_and_is_undone(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    answers = RunnerAnswers(
        graph_cartridge(agent_retries=0),
        repo,
        "run-1",
        runners={"build": _Recording(write="stray.txt")},
    )
    answer = answers(AgentCall("build", "build", "build", "Build it."))
    assert answer.error_kind == "read_only_violation"
    assert "stray.txt" in (answer.error or "")
    assert not (repo / "stray.txt").exists() and git(repo, "status", "--porcelain") == ""


def test_a_cancelled_run_records_nothing(store: Store, tmp_path: Path) -> None:
    cancel = threading.Event()
    cancel.set()
    answers = RunnerAnswers(graph_cartridge(), tmp_path, "run-1", cancel=cancel)
    with pytest.raises(ProposeInterrupted):
        propose(store, graph_cartridge(), answers, ticket=TICKET, run_id="run-1", date="d")
    assert table_count(store, t.graph_runs) == 0


def test_propose_through_the_harness_stores_modes_from_the_cartridge_policy(store: Store) -> None:
    cartridge = Cartridge.model_validate(
        {
            "roles": {
                r: {"runner": "scripted", "script": "unused.toml"}
                for r in ("plan", "build", "review")
            },
            "autonomy": {"policy": {"draft_pr_create": "auto"}},
        }
    )

    def answer(call: AgentCall) -> Answer:
        return ScriptedAnswers(
            {"plan": ["1. Add it"], "build": [built(CALC)], "review": [APPROVE]}
        )(call)

    record, [row] = propose(store, cartridge, answer, ticket=TICKET, run_id="r1", date="d")
    assert row["mode"] == "auto" and row["record_id"] == record["proposals"][0]["id"]


# -- the check arm: the patch applied in a worktree of the harness, checks as evidence --------


def worktrees(repo: Path) -> list[str]:
    return [
        line
        for line in git(repo, "worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]


def test_propose_attaches_passing_checks_as_evidence_before_the_gate(tmp_path: Path) -> None:
    repo = propose_repo(tmp_path, checks=["cat calc.py", "test -f calc.py"])
    head = git(repo, "rev-parse", "HEAD")
    code, out = cli_json("propose", "Add multiply() to calc", "--repo", str(repo))
    assert code == 0, out
    _, draft = out["proposals"]
    assert draft["status"] == "proposed"
    [checks] = [e["data"] for e in draft["evidence"] if e["kind"] == "checks"]
    assert (checks["applied"], checks["passed"], checks["base"]) == (True, True, head)
    assert "error" not in checks
    first, second = checks["results"]
    assert (first["command"], first["exit_code"], first["passed"]) == ("cat calc.py", 0, True)
    assert "def multiply(a, b):" in first["output"] and first["duration_s"] >= 0
    assert (second["command"], second["passed"]) == ("test -f calc.py", True)

    # the person's checkout is untouched and no worktree is left behind
    assert git(repo, "status", "--porcelain", "--ignored") == "!! .phasegate/"
    assert not (repo / "calc.py").exists()
    assert worktrees(repo) == [f"worktree {repo.resolve()}"]

    store = repo_store(repo)
    try:
        record = store.run(out["run_id"])["record"]
    finally:
        store.close()
    # the graph's proposals stay its own; the machine evidence is kept beside them
    [graph_draft] = [p for p in record["proposals"] if p["kind"] == "draft_pr_create"]
    assert "checks" not in [e["kind"] for e in graph_draft["evidence"]]
    assert record["harness"]["checks"] == {draft["record_id"]: checks}
    replayed = phasegate_cli("replay", out["run_id"], "--repo", str(repo))
    assert replayed.returncode == 0 and replayed.stdout.startswith("identical: 2 proposal(s)")

    text = phasegate_cli("propose", "Add multiply() to calc", "--repo", str(repo))
    assert text.returncode == 0, text.stderr
    assert "checks of" in text.stdout and "2 passed" in text.stdout


def harness_run(
    tmp_path: Path, store: Store, patch: str, checks: list[str]
) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """``harness.propose`` in a real repository; return (repo, record, draft row)."""
    repo = make_repo(tmp_path / "repo", {"README.md": "# calc\n"})
    role = {"runner": "scripted", "script": "unused.toml"}
    cartridge = Cartridge.model_validate(
        {
            "roles": {"plan": role, "build": role, "review": role},
            "landing_areas": {"checks": checks, "check_timeout": 30},
        }
    )
    answers = ScriptedAnswers({"plan": ["1. Add it"], "build": [built(patch)], "review": [APPROVE]})
    record, [row] = propose(
        store, cartridge, answers, ticket=TICKET, run_id="r1", date="d", repo=repo
    )
    assert row["kind"] == "draft_pr_create"
    assert git(repo, "status", "--porcelain", "--ignored") == ""
    assert worktrees(repo) == [f"worktree {repo.resolve()}"]
    assert replay_check(store.run("r1")["record"]).identical
    return repo, record, row


def checks_of(row: dict[str, Any]) -> dict[str, Any]:
    [data] = [e["data"] for e in row["evidence"] if e["kind"] == "checks"]
    return data


def test_a_failing_check_is_evidence_with_its_output(
    tmp_path: Path, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PHASEGATE_TEST_TOKEN", "tok-0123456789abcdef")
    failing = (
        "grep -q divide calc.py || { echo 'no divide here'; echo tok-0123456789abcdef; exit 3; }"
    )
    _, record, row = harness_run(tmp_path, store, CALC, ["test -f calc.py", failing])
    data = checks_of(row)
    assert (data["applied"], data["passed"]) == (True, False)
    ok, bad = data["results"]
    assert ok["passed"] is True
    assert (bad["command"], bad["exit_code"], bad["passed"]) == (failing, 3, False)
    assert "no divide here" in bad["output"]
    assert "tok-0123456789abcdef" not in bad["output"] and "***" in bad["output"]
    assert record["harness"]["checks"][row["record_id"]] == data
    assert row["status"] == "proposed"


def test_a_patch_that_does_not_apply_is_evidence_with_the_error(
    tmp_path: Path, store: Store
) -> None:
    stale = "--- a/missing.py\n+++ b/missing.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
    _, _, row = harness_run(tmp_path, store, stale, ["touch ran.txt"])
    data = checks_of(row)
    assert (data["applied"], data["passed"], data["results"]) == (False, False, [])
    assert "missing.py" in data["error"]
