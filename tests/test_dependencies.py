"""Dependencies between workflows: blocked until what they wait for merged and verified.

The store's rules on SQLite and PostgreSQL (the release in the completing commit, a
failed dependency explained, a person's resume dropping it, cycles refused, the
reconciliation pass), then ``phasegate run --after`` on a real repository.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from phasegate.config.cartridge import load_cartridge
from phasegate.core import decisions
from phasegate.core.contract import PhaseResult, WorkflowNotFound
from phasegate.core.dependencies import DependencyCycle, cycle_path, depends_on_issues
from phasegate.forge.base import Comment, Issue, Labelled
from phasegate.integrations.triggers import Ignored, Started, Watcher
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store
from phasegate.store import tables as t
from phasegate.summary import workflow_summary
from phasegate.testing import InMemoryForge

from conftest import phasegate_cli


def _new(store: Store, title: str, **kwargs: object) -> str:
    return store.create_workflow(
        title=title,
        ticket=title,
        repo_path="/r",
        base_branch="main",
        auto_merge=False,
        content_language="en",
        **kwargs,  # type: ignore[arg-type]
    )


def _end(store: Store, workflow_id: str, outcome: str = "completed") -> None:
    ctx = store.load_context(workflow_id)
    if outcome == "completed":
        store.commit_phase_result(ctx, PhaseResult.advance("completed"))
    else:
        store.commit_phase_result(ctx, PhaseResult("failed", reason="the checks failed"))


@pytest.fixture
def store(store_url: str) -> Store:
    opened = open_store(store_url)
    yield opened
    opened.close()


def test_a_workflow_runs_only_once_everything_it_waits_for_completed(store: Store) -> None:
    a, b = _new(store, "a"), _new(store, "b")
    c = _new(store, "c", after=[a, b])
    row = store.workflow_row(c)
    assert row["status"] == "blocked"
    assert f"waits for {a} (preparing), {b} (preparing)" in row["error"]
    assert store.runnable_workflow_ids(frozenset({"preparing"})) == sorted([a, b], key=[a, b].index)

    _end(store, a)  # one of two: still blocked, and it says what is left
    row = store.workflow_row(c)
    assert row["status"] == "blocked"
    assert row["error"] == f"waits for {b} (preparing) to merge and verify"

    # the reason as shown is said from now, not from when it was stored
    store.commit_phase_result(store.load_context(b), PhaseResult.advance("planning"))
    assert f"{b} (preparing)" in store.workflow_row(c)["error"]
    assert f"waits for {b} (planning)" in workflow_summary(store, store.workflow_row(c))["error"]

    _end(store, b, "failed")  # what it waits for failed: a person is told what to do
    said = f"{b} failed: resume {b}, or resume this one to go on without it"
    assert said in store.workflow_row(c)["error"]
    assert store.workflow_row(c)["status"] == "blocked"

    # a person's resume starts it without what did not complete, in the same commit
    ctx = store.load_context(c)
    store.commit_phase_result(ctx, decisions.resume(ctx))
    row = store.workflow_row(c)
    assert (row["status"], row["error"]) == ("preparing", None)
    assert [e["depends_on"] for e in store.dependencies(c)] == [a]
    [met] = store.events(c, types=["dependencies_met"])
    assert met["data"] == {"dropped": [b], "by": "resume"}


def test_the_completing_commit_releases_its_dependents_in_its_own_transaction(
    store: Store,
) -> None:
    a = _new(store, "a")
    b = _new(store, "b", after=[a])
    c = _new(store, "c", after=[b])
    _end(store, a)
    assert store.workflow_row(b)["status"] == "preparing"
    assert store.workflow_row(c)["status"] == "blocked"  # waits for b, not for a
    [met] = store.events(b, types=["dependencies_met"])
    assert met["data"] == {"after": [a]}
    # after a completed workflow: runnable at once
    d = _new(store, "d", after=[a])
    assert (store.workflow_row(d)["status"], store.workflow_row(d)["error"]) == ("preparing", None)


def test_the_reconciliation_pass_releases_what_no_commit_did(store: Store) -> None:
    a = _new(store, "a")
    b = _new(store, "b", after=[a])
    with store.transaction() as conn:  # a completion that released nothing (an older version)
        conn.execute(t.workflows.update().where(t.workflows.c.id == a).values(status="completed"))
    assert store.workflow_row(b)["status"] == "blocked"
    assert store.release_ready() == [b]
    assert store.workflow_row(b)["status"] == "preparing"
    assert store.release_ready() == []


def test_a_cycle_is_refused_naming_it_and_nothing_is_recorded(store: Store) -> None:
    # issue 1 waits for issue 2, which has no workflow yet
    one = _new(store, "one", issue=("o/r", 1), after_issues=[("o/r", 2)])
    assert "o/r#2 (no workflow yet)" in store.workflow_row(one)["error"]
    with pytest.raises(DependencyCycle) as refused:
        _new(store, "two", issue=("o/r", 2), after_issues=[("o/r", 1)])
    assert " → " in str(refused.value)
    assert refused.value.path[0] == refused.value.path[-1]
    assert any(f"{one} (#1)" in node for node in refused.value.path)
    assert [r["id"] for r in store.list_workflows()] == [one]
    assert store.workflow_for_issue("o/r", 2) is None
    [edge] = store.dependencies(one)
    assert (edge["depends_on"], edge["issue"]) == (None, "o/r#2")  # untouched

    with pytest.raises(DependencyCycle, match=r"\(#3\) → .*\(#3\)"):  # an issue after itself
        _new(store, "three", issue=("o/r", 3), after_issues=[("o/r", 3)])
    with pytest.raises(WorkflowNotFound):
        _new(store, "four", after=["0badc0de"])
    assert len(store.list_workflows()) == 1

    # issue 2 without the cycle: the waiting one now waits for its workflow
    two = _new(store, "two", issue=("o/r", 2))
    [edge] = store.dependencies(one)
    assert (edge["depends_on"], edge["issue"]) == (two, "o/r#2")
    _end(store, two)
    assert store.workflow_row(one)["status"] == "preparing"


def test_depends_on_lines_and_cycles_are_read_purely() -> None:
    text = "Fix it.\nDepends on #12, #3\n- depends on: #12\nmentions #99 in passing\n"
    assert depends_on_issues(text) == [12, 3]
    graph = {"a": ["b"], "b": ["c", "a"], "c": []}
    assert cycle_path("a", lambda n: graph[n]) == ["a", "b", "a"]
    assert cycle_path("c", lambda n: graph[n]) is None


def test_run_after_files_a_blocked_workflow_that_a_completion_releases(happy_repo: Path) -> None:
    repo = str(happy_repo)
    filed = phasegate_cli("run", "First", "--no-advance", "--repo", repo, "--json")
    first = json.loads(filed.stdout)
    proc = phasegate_cli("run", "Second", "--after", first["id"], "--repo", repo, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    second = json.loads(proc.stdout)
    assert second["status"] == "blocked"
    assert second["waits_for"] == [{"id": first["id"], "issue": None, "status": "preparing"}]
    said = phasegate_cli("show", second["id"], "--repo", repo)
    assert f"after {first['id']}: preparing" in said.stdout
    assert "waits for" in said.stdout and "merge and verify" in said.stdout
    listed = json.loads(phasegate_cli("status", "--repo", repo, "--json").stdout)
    assert {r["id"]: r["status"] for r in listed}[second["id"]] == "blocked"

    missing = phasegate_cli("run", "Third", "--after", "0badc0de", "--repo", repo, "--json")
    assert missing.returncode != 0 and "0badc0de" in missing.stdout + missing.stderr
    wrong = phasegate_cli("run", "Third", "--branch-strategy", "trunk", "--repo", repo, "--json")
    assert wrong.returncode == 2 and "'ticket', 'epic'" in wrong.stderr
    assert json.loads(wrong.stdout)["error"]["kind"] == "UsageError"

    # a resume of one still waiting goes on without what it waited for, and says so
    waiting = json.loads(
        phasegate_cli("run", "W", "--after", first["id"], "--repo", repo, "--json").stdout
    )
    dropped = phasegate_cli("resume", waiting["id"], "--no-advance", "--repo", repo)
    assert f"dropped: waiting for {first['id']} (preparing)" in dropped.stdout, dropped.stdout
    # what ended without completing releases nobody: waiting for it is refused
    gone = phasegate_cli("cancel", waiting["id"], "--repo", repo)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    refused = phasegate_cli("run", "Third", "--after", waiting["id"], "--repo", repo, "--json")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"{waiting['id']}: that workflow is cancelled" in refused.stdout + refused.stderr

    done = phasegate_cli("resume", first["id"], "--repo", repo, "--json")
    assert json.loads(done.stdout)["status"] == "completed", done.stdout
    shown = json.loads(phasegate_cli("show", second["id"], "--repo", repo, "--json").stdout)
    assert shown["workflow"]["status"] == "preparing"
    assert shown["workflow"]["waits_for"][0]["status"] == "completed"
    store = open_store(f"sqlite:///{happy_repo / '.phasegate' / 'state.db'}")
    try:
        count = store.engine.connect().execute(sa.select(sa.func.count()).select_from(t.workflows))
        assert count.scalar() == 3  # the refused --after recorded nothing
    finally:
        store.close()


def test_depends_on_lines_of_trusted_people_hold_a_forge_issue_and_a_cycle_is_ignored(
    happy_repo: Path,
) -> None:
    forge = InMemoryForge()
    forge.permissions = {"ana": "write"}  # eve has no access
    said = {
        1: ("Parser", "Write the parser.", "ana"),
        2: ("Printer", "Write the printer.\nDepends on #1", "ana"),
        3: ("Docs", "Document it.\nDepends on #1", "eve"),  # an outsider's words hold nothing
        4: ("Left", "Depends on #5", "ana"),
        5: ("Right", "Depends on #4", "ana"),
    }
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for number, (title, body, author) in said.items():
        forge.issues[number] = Issue(number, title, body, "open", author=author)
        forge.labelled.append(Labelled(forge.issues[number], "ana", now))
    forge.said[3] = [Comment(7, "ana", "Depends on #2, please", now)]
    cartridge = load_cartridge(happy_repo)
    store = open_store(cartridge.store_url(happy_repo))
    try:
        engine = Engine(happy_repo, cartridge, store, forge=forge)
        found = Watcher(engine, "o/r", max_ticket_bytes=100_000).watch_once()
        started = {r.issue_number: r.workflow_id for r in found if isinstance(r, Started)}
        assert sorted(started) == [1, 2, 3, 4]
        [ignored] = [r for r in found if isinstance(r, Ignored)]
        assert ignored.issue_number == 5
        assert f"{started[4]} (#4) → " in ignored.reason and ignored.reason.count("(#5)") == 2
        assert store.workflow_for_issue("o/r", 5) is None

        def waits(number: int) -> list[tuple[object, object]]:
            return [(e["depends_on"], e["issue"]) for e in store.dependencies(started[number])]

        assert waits(1) == []
        assert waits(2) == [(started[1], "o/r#1")]
        assert waits(3) == [(started[2], "o/r#2")]  # the trusted comment's, not eve's body
        assert waits(4) == [(None, "o/r#5")]
        assert {store.workflow_row(started[n])["status"] for n in (2, 3, 4)} == {"blocked"}
        assert store.workflow_row(started[1])["status"] == "preparing"
    finally:
        store.close()
