"""An epic into tickets: scope's pieces filed on the forge, each a workflow run in order.

Real git, a real SQLite file, graph mode with scripted agents, and a ``command``
build agent that answers each workflow with a diff of its own. The approval of
scope's item_create files three linked tickets with a dependency chain; the second
starts only after the first merged and verified; the parent completes after the
third.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_web import TOKEN, logged_in

from phasegate import operations
from phasegate.config.cartridge import load_cartridge
from phasegate.core.contract import PhaseResult
from phasegate.forge.local import LocalForge
from phasegate.git.workspace import Workspace
from phasegate.graph.calls import prompt_hash
from phasegate.graph.prompts import scope_prompt
from phasegate.proc.host import host_name
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store
from phasegate.web import Access, create_app

from conftest import git, make_repo, phasegate_cli, scripted_cartridge
from support.torture_epic import ANSWERS, BUILD


def epic_repo(tmp_path: Path, *, item_policy: str = "propose", profile: str | None = None) -> Path:
    """A repository whose graph scopes every ticket as three chained pieces."""
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(ANSWERS)
    (repo / "build.sh").write_text(BUILD)
    extra = (
        "[graph]\nenabled = true\n\n"
        f'[autonomy]\npolicy = {{ draft_pr_create = "auto", item_create = "{item_policy}" }}\n\n'
        '[roles.scope_epic]\nrunner = "scripted"\nscript = "answers.toml"\n\n'
    )
    cartridge = scripted_cartridge(
        checks=[],
        extra=extra,
        profile=profile,
        role_overrides={"build": 'runner = "command"\ncommand = "sh build.sh"\ntimeout = 30\n'},
    )
    (repo / "phasegate.toml").write_text(cartridge)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    return repo


@pytest.fixture
def opened() -> Iterator[list[Store]]:
    stores: list[Store] = []
    yield stores
    for store in stores:
        store.close()


def _engine(repo: Path, stores: list[Store]) -> Engine:
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    stores.append(store)
    return Engine(repo, cartridge, store)


def test_an_approved_epic_files_linked_tickets_run_in_order_and_completes_after_them(
    tmp_path: Path, opened: list[Store]
) -> None:
    repo = epic_repo(tmp_path)
    started = phasegate_cli("run", "Build the report tool", "--repo", str(repo), "--json")
    parent = json.loads(started.stdout)
    assert parent["status"] == "awaiting_approval", parent
    proposal = parent["awaiting_proposal"]
    assert "files its 3 pieces as tickets" in parent["error"]
    [item] = json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)
    assert item["payload"]["subtasks"] == ["the parser", "the printer", "the docs"]
    assert item["payload"]["depends_on"] == [[], [1], [2]]

    decided = phasegate_cli("approve", proposal, "--by", "ana", "--repo", str(repo), "--json")
    assert decided.returncode == 0, decided.stdout + decided.stderr
    assert json.loads(decided.stdout)["workflow"]["status"] == "pieces"

    engine = _engine(repo, opened)
    store = engine.store
    shown = json.loads(phasegate_cli("show", parent["id"], "--repo", str(repo), "--json").stdout)
    pieces = shown["workflow"]["pieces"]
    assert [p["title"] for p in pieces] == ["the parser", "the printer", "the docs"]
    assert [p["status"] for p in pieces] == ["preparing", "blocked", "blocked"]
    ids = [p["id"] for p in pieces]
    # three tickets on the forge, each linked to the parent's, the chain in their bodies
    forge = LocalForge(store, repo, Workspace())
    issues = {i.number: i for i in forge.issues()}
    assert len(issues) == 4
    numbers = [p["issue_number"] for p in pieces]
    assert all(f"Part of #{parent['issue_number']}" in issues[n].body for n in numbers)
    assert f"Depends on #{numbers[0]}" in issues[numbers[1]].body
    assert f"Depends on #{numbers[1]}" in issues[numbers[2]].body
    assert "Depends on" not in issues[numbers[0]].body
    assert [forge.parent_issue(n) for n in numbers] == [parent["issue_number"]] * 3
    assert forge.parent_issue(parent["issue_number"]) is None
    text = phasegate_cli("show", parent["id"], "--repo", str(repo)).stdout
    assert "pieces: 0 of 3 completed" in text

    engine.run_worker(once=True)  # every runnable one, and each one its end releases

    rows = {wid: store.workflow_row(wid) for wid in [parent["id"], *ids]}
    assert {r["status"] for r in rows.values()} == {"completed"}, {
        k: (r["status"], r["error"]) for k, r in rows.items()
    }
    assert len(store.list_workflows()) == 4  # no workflow twice
    # each piece started only once the one before it merged and verified
    for before, after in zip(ids, ids[1:], strict=False):
        ended = max(e["id"] for e in store.events(before, types=["phase_change"]))
        [met] = store.events(after, types=["dependencies_met"])
        first_move = min(
            e["id"]
            for e in store.events(after, types=["phase_change"])
            if e["data"]["phase"] != "preparation"
        )
        assert ended < met["id"] < first_move
        assert rows[before]["completed_at"] <= rows[after]["completed_at"]
    assert rows[parent["id"]]["completed_at"] >= rows[ids[2]]["completed_at"]
    assert forge.issue(parent["issue_number"]).state == "closed"
    for wid in ids:  # each piece's own change, merged on the base
        assert git(repo, "show", f"main:piece-{wid}.txt") == "done"
    [item] = json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)[:1]
    assert item["status"] == "applied"
    listed = phasegate_cli("show", parent["id"], "--repo", str(repo)).stdout
    assert "pieces: 3 of 3 completed" in listed
    # no branch or checkout left: the pieces' went with their merges, the parent's with it
    assert git(repo, "branch", "--list", "phasegate/*") == ""
    assert not (repo / ".phasegate" / "worktrees" / parent["id"]).exists()


def test_an_auto_epic_files_its_pieces_at_once(tmp_path: Path, opened: list[Store]) -> None:
    repo = epic_repo(tmp_path, item_policy="auto")
    parent = json.loads(phasegate_cli("run", "Build it", "--repo", str(repo), "--json").stdout)
    assert parent["status"] == "pieces", parent
    assert "waits for its pieces: 0 of 3 completed" in parent["error"]
    assert [p["status"] for p in parent["pieces"]] == ["preparing", "blocked", "blocked"]
    refused = phasegate_cli("resume", parent["id"], "--repo", str(repo), "--json")
    assert refused.returncode != 0 and "waits for its pieces" in refused.stdout + refused.stderr
    # the dashboard's workflow page: the pieces and how far they are; a piece's epic
    engine = _engine(repo, opened)
    with TestClient(create_app(engine, Access(token=TOKEN, user="alice"))) as client:
        logged_in(client)
        page = client.get(f"/workflows/{parent['id']}").text
        assert "0 of 3 completed" in page and "the printer" in page
        first = parent["pieces"][0]["id"]
        assert f'href="/workflows/{parent["id"]}"' in client.get(f"/workflows/{first}").text
        second = client.get(f"/workflows/{parent['pieces'][1]['id']}").text
        assert f'<a href="/workflows/{first}">{first}</a> (preparing)' in second


def test_an_epic_on_one_branch_lands_its_pieces_through_its_own_merge(
    tmp_path: Path, opened: list[Store]
) -> None:
    repo = epic_repo(tmp_path, item_policy="auto")
    proc = phasegate_cli(
        "run", "Build it", "--branch-strategy", "epic", "--repo", str(repo), "--json"
    )
    parent = json.loads(proc.stdout)
    assert parent["status"] == "pieces", parent
    engine = _engine(repo, opened)
    store = engine.store
    branch = f"phasegate/epic-{parent['id']}"
    ids = [p["id"] for p in parent["pieces"]]
    assert {store.workflow_row(wid)["base_branch"] for wid in ids} == {branch}
    assert store.workflow_row(parent["id"])["state"]["branch_strategy"] == "epic"

    engine.run_worker(once=True)

    row = store.workflow_row(parent["id"])
    assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]
    assert row["branch_name"] == branch and row["merge_sha"]
    for wid in ids:  # each piece merged into the epic's branch, the epic into main
        assert store.workflow_row(wid)["status"] == "completed"
        assert git(repo, "show", f"main:piece-{wid}.txt") == "done"
    first = git(repo, "log", "--first-parent", "--format=%s", "main").splitlines()
    assert sum(1 for line in first if line.startswith("Merge")) == 1  # the epic's, once
    forge = LocalForge(store, repo, Workspace())
    assert forge.issue(parent["issue_number"]).state == "closed"
    shown = phasegate_cli("show", parent["id"], "--repo", str(repo)).stdout
    assert "branch strategy epic" in shown
    assert git(repo, "branch", "--list", "phasegate/*") == ""  # the epic's merged too


def test_rejected_pieces_pause_the_epic_and_its_next_scope_is_told_why(tmp_path: Path) -> None:
    repo = epic_repo(tmp_path)
    parent = json.loads(phasegate_cli("run", "Build it", "--repo", str(repo), "--json").stdout)
    first = parent["awaiting_proposal"]
    why = "the printer and the docs are one piece"
    rejected = phasegate_cli("reject", first, "--reason", why, "--by", "ana", "--repo", str(repo))
    # a recorded decision is a success: the workflow pauses with the reason, says so
    assert rejected.returncode == 0, rejected.stdout + rejected.stderr
    assert f"workflow {parent['id']} pauses with your reason" in rejected.stdout
    assert f"`phasegate resume {parent['id']}` scopes it again" in rejected.stdout
    shown = json.loads(phasegate_cli("show", parent["id"], "--repo", str(repo), "--json").stdout)
    assert shown["workflow"]["status"] == "paused" and why in shown["workflow"]["error"]

    again = json.loads(phasegate_cli("resume", parent["id"], "--repo", str(repo), "--json").stdout)
    assert again["status"] == "awaiting_approval" and again["awaiting_proposal"] != first
    store = open_store(load_cartridge(repo).store_url(repo))
    try:
        record = store.run(f"{parent['id']}-g2")["record"]
    finally:
        store.close()
    # the new run's input says why, and scope's prompt is made of it
    assert f"## Why the last pieces were rejected\n\n{why}" in record["ticket"]
    [scoped] = [c for c in record["calls"] if c["role"] == "scope_epic"]
    assert scoped["prompt_sha256"] == prompt_hash(scope_prompt(record["ticket"]))
    replayed = phasegate_cli("replay", f"{parent['id']}-g2", "--repo", str(repo))
    assert replayed.returncode == 0 and "identical" in replayed.stdout


def test_a_cancelled_epics_pieces_are_superseded_and_cannot_be_approved(tmp_path: Path) -> None:
    repo = epic_repo(tmp_path)
    parent = json.loads(phasegate_cli("run", "Build it", "--repo", str(repo), "--json").stdout)
    proposal = parent["awaiting_proposal"]
    cancelled = phasegate_cli("cancel", parent["id"], "--repo", str(repo))
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    [row] = json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)
    assert (row["status"], row["decided_by"]) == ("superseded", None)
    listed = phasegate_cli("proposals", "--repo", str(repo), env={"COLUMNS": "80"}).stdout
    [line] = [x for x in listed.splitlines() if proposal in x]  # piped: one line, not cut
    assert "item_create" in line and "superseded" in line

    late = phasegate_cli("approve", proposal, "--by", "ana", "--repo", str(repo), "--json")
    assert late.returncode == 2
    error = json.loads(late.stdout)["error"]
    assert error["kind"] == "ActionRefused"
    assert f"workflow {parent['id']}, which is cancelled" in error["message"]
    # nothing recorded: no decision, no streak
    [row] = json.loads(phasegate_cli("proposals", "--repo", str(repo), "--json").stdout)
    assert (row["status"], row["decided_by"]) == ("superseded", None)
    store = open_store(load_cartridge(repo).store_url(repo))
    try:
        assert store.gate_history("item_create") == []
    finally:
        store.close()


def test_a_cancelled_piece_is_gone_on_without_and_its_parent_completes_after_the_rest(
    tmp_path: Path, opened: list[Store]
) -> None:
    repo = epic_repo(tmp_path, item_policy="auto")
    parent = json.loads(phasegate_cli("run", "Build it", "--repo", str(repo), "--json").stdout)
    first, second, third = (p["id"] for p in parent["pieces"])
    engine = _engine(repo, opened)
    store = engine.store
    [blocked] = store.events(third, types=["blocked"])  # filed blocked, saying for what
    assert blocked["data"] == {"after": [second]}
    # While every piece may still complete, the parent offers no resume (the dashboard's
    # buttons); once one is cancelled, it does.
    assert "resume" not in operations.offered(store, parent["id"])
    operations.cancel(engine, second, by="ana")
    assert "resume" in operations.offered(store, parent["id"])
    said = f"{second} cancelled: resume this one to go on without {second}, or cancel it"
    assert said in store.workflow_row(parent["id"])["error"]
    assert said in store.workflow_row(third)["error"]

    shown = json.loads(phasegate_cli("show", third, "--repo", str(repo), "--json").stdout)
    number = parent["pieces"][1]["issue_number"]
    assert shown["workflow"]["waits_for"] == [
        {"id": second, "issue": f"#{number}", "status": "cancelled"}
    ]
    # the third goes on without the second, and says so
    resumed = phasegate_cli("resume", third, "--no-advance", "--repo", str(repo), "--json")
    [dropped] = json.loads(resumed.stdout)["dropped"]
    assert (dropped["id"], dropped["status"]) == (second, "cancelled")
    # the parent too: it waits for the first and the third only
    resumed = phasegate_cli("resume", parent["id"], "--no-advance", "--repo", str(repo))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"dropped: waiting for {second} (cancelled)" in resumed.stdout
    [event] = store.events(parent["id"], types=["pieces_dropped"])
    assert event["data"] == {"dropped": [second]}
    row = store.workflow_row(parent["id"])
    assert row["status"] == "pieces" and "0 of 2 completed" in row["error"]
    assert "resume" not in operations.offered(store, parent["id"])
    assert [p["depends_on"] for p in store.dependencies(parent["id"])] == [first, third]
    # nothing ended now: a resume of the parent is refused, naming a command that works
    refused = phasegate_cli("resume", parent["id"], "--repo", str(repo))
    assert refused.returncode == 2 and f"`phasegate cancel {parent['id']}`" in refused.stderr

    for piece in (first, third):  # the pieces left complete: the parent completes
        store.commit_phase_result(store.load_context(piece), PhaseResult.advance("completed"))
    assert store.workflow_row(parent["id"])["status"] == "planning"
    assert engine.advance(parent["id"])["status"] == "completed"
    forge = LocalForge(store, repo, Workspace())
    assert forge.issue(parent["issue_number"]).state == "closed"


def test_cancelling_a_parent_cancels_its_pieces_but_not_one_a_worker_advances(
    tmp_path: Path, opened: list[Store]
) -> None:
    repo = epic_repo(tmp_path, item_policy="auto")
    parent = json.loads(phasegate_cli("run", "Build it", "--repo", str(repo), "--json").stdout)
    first, second, third = (p["id"] for p in parent["pieces"])
    engine = _engine(repo, opened)
    store = engine.store
    listed = json.loads(phasegate_cli("status", "--repo", str(repo), "--json").stdout)
    assert [r["id"] for r in listed if r["epic_parent"]] == [first, second, third]
    shown = json.loads(phasegate_cli("show", second, "--repo", str(repo), "--json").stdout)
    assert shown["ticket"].startswith(f"the printer\n\nPart of #{parent['issue_number']}")
    # a worker advances the first: a live holder, this very process under another name
    assert store.claim(first, f"{host_name()}:{os.getpid()}:elsewhere", 600) is not None
    proc = phasegate_cli("cancel", parent["id"], "--repo", str(repo))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"pieces cancelled: {second}, {third}" in proc.stdout
    assert f"piece {first} not cancelled:" in proc.stdout
    assert f"then `phasegate cancel {first}`" in proc.stdout
    statuses = [store.workflow_row(w)["status"] for w in (parent["id"], first, second, third)]
    assert statuses == ["cancelled", "preparing", "cancelled", "cancelled"]

    store.release(first, f"{host_name()}:{os.getpid()}:elsewhere")
    assert operations.cancel(engine, first, by="ana")["status"] == "cancelled"
