"""Queues on one store: priorities (a person's word, a forge label, the claim order)
and agent slots as a semaphore, on a real SQLite file and a real PostgreSQL server
(``store_url``); the queue's commands. The real workers: test_queue_workers.py."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from phasegate import operations
from phasegate.agents.slots import SLOT_WAIT_EVENT, CallSlots, slot_needs
from phasegate.config.cartridge import cartridge_from_document
from phasegate.core.contract import RUNNABLE_STATUSES, EventWrite, WorkflowPaused
from phasegate.core.inputs import ActionRefused
from phasegate.core.priority import parse_priority, priority_from_labels, priority_name
from phasegate.forge.base import Issue
from phasegate.integrations.triggers import start_from_issue
from phasegate.runtime.engine import Engine
from phasegate.store import SlotNeed, Store, open_store
from phasegate.testing import FixedClock, InMemoryForge

from conftest import new_workflow, phasegate_cli

HOST = os.uname().nodename


def test_priorities_are_words_or_integers_and_labels_carry_them() -> None:
    assert [parse_priority(w) for w in ("high", " Normal ", "LOW", "7", "-100")] == [
        1,
        0,
        -1,
        7,
        -100,
    ]
    for bad in ("urgent", "101", "1.5", ""):
        with pytest.raises(ActionRefused, match="high, normal, low or an integer"):
            parse_priority(bad)
    assert [priority_name(p) for p in (1, 0, -1, 5)] == ["high", "normal", "low", "5"]
    assert priority_from_labels(["bug", "Priority:High"]) == 1
    assert priority_from_labels(["priority:low", "priority:3", "priority:soon"]) == 3
    assert priority_from_labels(["bug", "priority:soon"]) is None


@pytest.fixture
def store(store_url: str) -> Store:
    opened = open_store(store_url, FixedClock())
    yield opened  # type: ignore[misc]
    opened.close()


def _dead_pid() -> int:
    done = subprocess.run(["true"], check=True)
    assert done.returncode == 0
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_slots_hold_a_cap_go_to_the_higher_priority_and_come_back_expired_or_gone(
    store: Store,
) -> None:
    clock = store.clock
    assert isinstance(clock, FixedClock)
    wf = new_workflow(store)
    needs = [SlotNeed("provider", "anthropic", 2), SlotNeed("runner", "claude-code", 5)]

    def take(call: str, holder: str = f"{HOST}:{os.getpid()}:a", priority: int = 0) -> object:
        return store.acquire_slots(
            needs,
            call_id=call,
            holder=holder,
            workflow_id=wf,
            role="plan",
            ttl_s=30.0,
            priority=priority,
        )

    def held() -> set[str]:
        return {r["call_id"] for r in store.slot_rows() if r["live"] and not r["waiting"]}

    assert take("a") is None and take("b") is None
    assert take("c") == needs[0], "the provider's cap of 2 is reached: c waits"
    clock.advance(1)
    assert take("urgent", priority=1) == needs[0]
    assert held() == {"a", "b"}
    waiting = sorted((r["call_id"], r["scope"]) for r in store.slot_rows() if r["waiting"])
    assert waiting == [
        ("c", "provider"),
        ("c", "runner"),
        ("urgent", "provider"),
        ("urgent", "runner"),
    ]
    store.release_slots("a")
    assert take("c") == needs[0], "the free slot goes to the higher priority, waiting less"
    assert take("urgent", priority=1) is None
    store.release_slots("b")
    assert take("c") is None and held() == {"c", "urgent"}
    assert not any(r["waiting"] for r in store.slot_rows())
    clock.advance(31)  # nothing renewed them: no lease holds this workflow
    assert take("d") is None and held() == {"d"}
    # A holder of this host whose process is gone holds nothing, at once.
    assert take("e", holder=f"{HOST}:{_dead_pid()}:x") is None
    assert take("f") is None, "the gone holder's slot does not count"
    assert take("g") == needs[0]
    store.release_slots("g")  # a wait given up leaves nothing behind
    assert held() == {"d", "f"} and not any(r["waiting"] for r in store.slot_rows())
    # A call waiting ahead for another cap keeps nothing from a call behind it.
    pinned, shared, free = (
        SlotNeed("provider", "anthropic", 2),  # d and f hold both
        SlotNeed("runner", "api", 1),
        SlotNeed("provider", "openai", 1),
    )
    kwargs = {"holder": f"{HOST}:{os.getpid()}:a", "workflow_id": wf, "role": "plan"}
    ahead = store.acquire_slots([pinned, shared], call_id="h", ttl_s=30.0, priority=5, **kwargs)
    assert ahead == pinned
    assert store.acquire_slots([free, shared], call_id="l", ttl_s=30.0, **kwargs) is None
    assert held() == {"d", "f", "l"}


def test_slots_expire_with_the_lease_they_are_held_under_and_are_renewed_with_it(
    store: Store,
) -> None:
    clock = store.clock
    assert isinstance(clock, FixedClock)
    wf = new_workflow(store)
    owner = f"elsewhere:1:{os.getpid()}"  # another machine: only expiry frees it
    fence = store.claim(wf, owner, 10.0)
    assert fence is not None
    need = [SlotNeed("repository", "/r", 1)]
    kwargs = {"holder": owner, "workflow_id": wf, "role": "build", "ttl_s": 999.0}
    assert store.acquire_slots(need, call_id="a", **kwargs) is None  # type: ignore[arg-type]
    (slot,) = store.slot_rows()
    assert slot["expires_at"] == clock.now() + timedelta(seconds=10)
    clock.advance(8)
    assert store.renew(wf, owner, fence, 10.0)
    assert store.slot_rows()[0]["expires_at"] == clock.now() + timedelta(seconds=10)
    clock.advance(9)
    other = {**kwargs, "holder": f"{HOST}:{os.getpid()}:b"}
    assert store.acquire_slots(need, call_id="b", **other) == need[0]  # type: ignore[arg-type]
    clock.advance(2)  # the lease ran out unrenewed, and the slot with it
    assert store.acquire_slots(need, call_id="b", **other) is None  # type: ignore[arg-type]


def test_claims_go_by_priority_then_age_and_a_person_reorders_them(store: Store) -> None:
    clock = store.clock
    assert isinstance(clock, FixedClock)
    ids = []
    for priority in (-1, 0, 0, 1):
        ids.append(
            store.create_workflow(
                title="t",
                ticket="x",
                repo_path="/r",
                base_branch="main",
                auto_merge=False,
                content_language="en",
                priority=priority,
            )
        )
        clock.advance(1)
    low, older, newer, high = ids
    rows = store.lease_rows(RUNNABLE_STATUSES)
    assert [r["id"] for r in rows] == [high, older, newer, low]
    taken = store.claim_free(ids, "w:1:a", 30.0, limit=2)
    assert set(taken) == {high, older}
    row = operations.set_priority(store, low, "high", by="maya")
    assert row["priority"] == 1
    decision = [e for e in store.events(low) if e["type"] == "decision"][-1]
    assert decision["data"] == {"action": "priority", "by": "maya", "priority": 1, "was": -1}
    assert list(store.claim_free(ids, "w:1:b", 30.0, limit=1)) == [low]
    with pytest.raises(ActionRefused):
        operations.set_priority(store, low, "101", by="maya")


def test_a_calls_caps_are_the_smaller_of_the_cartridges_and_the_stores(tmp_path: Path) -> None:
    document = {
        "roles": {
            "plan": {"runner": "claude-code", "model": "claude-sonnet-4"},
            "build": {"runner": "api", "model": "openai/gpt-4o"},
            "review": {"runner": "command", "command": "true"},
        },
        "queue": {
            "max_calls_per_provider": {"anthropic": 3, "*": 8},
            "max_calls_per_repository": 4,
        },
    }
    cartridge = cartridge_from_document(tmp_path, document)
    stored = {("provider", "anthropic"): 5, ("runner", "api"): 2, ("repository", "*"): 2}
    asked: list[str] = []

    def repository() -> str:
        asked.append("once")
        return "octo/widgets"

    assert slot_needs(cartridge, "plan", stored, repository) == [
        SlotNeed("provider", "anthropic", 3),
        SlotNeed("repository", "octo/widgets", 2),
    ]
    assert slot_needs(cartridge, "build", {}, repository) == [
        SlotNeed("provider", "openai", 8),
        SlotNeed("repository", "octo/widgets", 4),
    ]
    bare = cartridge_from_document(tmp_path, {"roles": document["roles"]})
    assert slot_needs(bare, "review", {}, repository) == [], "no cap: nothing counted"
    assert slot_needs(bare, "build", stored, repository)[0] == SlotNeed("runner", "api", 2)
    assert len(asked) == 3, "the repository is asked only when a cap on it is set"


def test_a_forge_label_sets_the_priority_of_the_workflow_it_starts(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    forge = InMemoryForge()
    forge.issues[7] = Issue(7, "Fix it", "a bug", "open", "maya", labels=("priority:high",))
    engine, store = engine_for(happy_repo, forge=forge)
    workflow_id, _ = start_from_issue(
        engine, "octo/widgets", 7, by="maya", trigger="import", max_ticket_bytes=100_000
    )
    assert store.workflow_row(workflow_id)["priority"] == 1


def test_the_queue_commands_set_show_and_refuse_under_json(happy_repo: Path) -> None:
    repo = str(happy_repo)
    filed = phasegate_cli("run", "add it", "--no-advance", "--priority", "low", "-C", repo)
    assert filed.returncode == 0, filed.stdout + filed.stderr
    status = json.loads(phasegate_cli("status", "-C", repo, "--json").stdout)
    workflow_id = status[0]["id"]
    assert status[0]["priority"] == -1
    moved = phasegate_cli("priority", workflow_id, "5", "-C", repo, "--json", "--by", "maya")
    assert json.loads(moved.stdout) == {
        "id": workflow_id,
        "priority": 5,
        "priority_name": "5",
        "changed": True,
    }
    refused = phasegate_cli("priority", workflow_id, "urgent", "-C", repo, "--json")
    assert refused.returncode == 2
    assert json.loads(refused.stdout)["error"]["kind"] == "ActionRefused"
    capped = phasegate_cli("queue", "cap", "provider", "Anthropic", "2", "-C", repo, "--json")
    assert json.loads(capped.stdout)["key"] == "anthropic"
    bad = phasegate_cli("queue", "cap", "model", "x", "2", "-C", repo, "--json")
    assert bad.returncode == 2 and "provider, runner, repository" in bad.stdout
    view = json.loads(phasegate_cli("queue", "show", "-C", repo, "--json").stdout)
    assert [q["id"] for q in view["queued"]] == [workflow_id]
    assert [(c["scope"], c["key"], c["cap"]) for c in view["store_caps"]] == [
        ("provider", "anthropic", 2)
    ]
    shown = phasegate_cli("queue", "show", "-C", repo)
    assert "provider anthropic: 0 of 2 (store" in shown.stdout and workflow_id in shown.stdout
    uncapped = phasegate_cli("queue", "uncap", "provider", "anthropic", "-C", repo, "--json")
    assert json.loads(uncapped.stdout)["cap"] is None
    detail = phasegate_cli("show", workflow_id, "-C", repo)
    assert "priority 5" in detail.stdout


def test_the_board_and_the_workflow_page_show_a_priority_other_than_normal(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    from fastapi.testclient import TestClient
    from test_web import TOKEN, logged_in

    from phasegate.web import Access, create_app

    engine, _store = engine_for(happy_repo)
    urgent = operations.start(engine, "Fix the outage", by="maya", priority=1)["id"]
    usual = operations.start(engine, "Tidy the docs", by="maya")["id"]
    with TestClient(create_app(engine, Access(token=TOKEN, user="maya"))) as client:
        logged_in(client)
        board = client.get("/").text
        card = board[board.index(f'id="card-{urgent}"') :]
        assert '<dd class="wf-priority">high</dd>' in card[: card.index("</article>")]
        other = board[board.index(f'id="card-{usual}"') :]
        assert "wf-priority" not in other[: other.index("</article>")]
        page = client.get(f"/workflows/{urgent}").text
        assert '<dd id="wf-priority">high</dd>' in page


def test_a_call_waiting_for_a_slot_stops_at_shutdown_and_leaves_nothing_held(
    tmp_path: Path,
) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    wf = new_workflow(store)
    document = {
        "roles": {"plan": {"runner": "command", "command": "true"}},
        "queue": {"max_calls_per_provider": {"command": 1}},
    }
    cartridge = cartridge_from_document(tmp_path, document)
    cancel = threading.Event()
    said: list[str] = []

    def emit(_workflow_id: str, event: EventWrite) -> None:
        said.append(event.type)
        if event.type == SLOT_WAIT_EVENT:
            cancel.set()  # Ctrl-C while the second call waits

    slots = CallSlots(store, cartridge, cancel, emit, {})
    started = EventWrite("agent_started", {"role": "plan"})
    try:
        with slots.held(wf, "plan", "planning", started) as first:
            assert first.needs == (SlotNeed("provider", "command", 1),)
            with (
                pytest.raises(WorkflowPaused, match="waited for a slot"),
                slots.held(wf, "plan", "planning", started),
            ):
                pass
            assert [r["waiting"] for r in store.slot_rows()] == [False]
        assert said == ["agent_started", SLOT_WAIT_EVENT]
        assert store.slot_rows() == [], "the slot given back, the wait ended"
    finally:
        store.close()


def test_cap_names_that_can_never_match_are_refused_in_the_cartridge(tmp_path: Path) -> None:
    from phasegate.config.cartridge import CartridgeError

    roles = {"plan": {"runner": "claude-code"}}
    for caps, said in (
        ({"max_calls_per_runner": {"bogus-runner": 2}}, "'bogus-runner' is no runner"),
        ({"max_calls_per_provider": {"anthropic/claude": 2}}, "before its first /"),
    ):
        with pytest.raises(CartridgeError, match=said) as refused:
            cartridge_from_document(tmp_path, {"roles": roles, "queue": caps})
        assert "queue.max_calls_per_" in str(refused.value), "the key is named"
    kept = cartridge_from_document(
        tmp_path,
        {"roles": roles, "queue": {"max_calls_per_provider": {"my-gateway": 2}}},
    )
    assert kept.queue.max_calls_per_provider == {"my-gateway": 2}, "a custom provider stays"


def test_queue_commands_take_negative_numbers_show_holders_and_say_when_nothing_changed(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = str(happy_repo)
    engine, store = engine_for(happy_repo)
    for_person = engine.start("Waits for a person", "Write feature.txt", auto_merge=False)
    assert engine.advance(for_person)["status"] == "waiting"
    advanced = operations.start(engine, "Being advanced", by="maya")["id"]
    unclaimed = operations.start(engine, "Not claimed yet", by="maya", priority=1)["id"]
    holder = f"{HOST}:{os.getpid()}:w1"
    assert store.claim(advanced, holder, 60) is not None
    needs = [SlotNeed("provider", "anthropic", 2)]
    taken = store.acquire_slots(
        needs, call_id="c1", holder=holder, workflow_id=advanced, role="plan", ttl_s=60
    )
    assert taken is None

    lowered = phasegate_cli("priority", advanced, "-5", "-C", repo, "--json")
    assert json.loads(lowered.stdout)["priority"] == -5, lowered.stdout + lowered.stderr
    assert "Change a workflow's priority" in phasegate_cli("priority", "--help").stdout
    same = phasegate_cli("priority", unclaimed, "high", "-C", repo)
    assert "already has priority high; nothing recorded" in same.stdout
    decisions = [e["data"].get("action") for e in store.events(unclaimed, types=["decision"])]
    assert decisions == ["start"], "nothing recorded for a priority it had"
    assert "priority" in [e["data"].get("action") for e in store.events(advanced)]

    negative = phasegate_cli("queue", "cap", "provider", "anthropic", "-1", "-C", repo, "--json")
    assert negative.returncode == 2 and "cap -1: give a number" in negative.stdout
    for scope, name, said in (
        ("runner", "bogus-runner", "is no runner"),
        ("provider", "anthropic/claude", "before its first /"),
    ):
        bad = phasegate_cli("queue", "cap", scope, name, "2", "-C", repo, "--json")
        assert bad.returncode == 2 and said in json.loads(bad.stdout)["error"]["message"]
    nothing = phasegate_cli("queue", "uncap", "provider", "nothere", "-C", repo)
    assert nothing.returncode == 0
    assert "no cap on provider nothere in the store; nothing changed" in nothing.stdout
    as_json = phasegate_cli("queue", "uncap", "provider", "nothere", "-C", repo, "--json")
    assert json.loads(as_json.stdout)["removed"] is False

    shown = phasegate_cli("queue", "show", "-C", repo).stdout
    now, later = shown.index("advanced by a worker now"), shown.index("waiting to be claimed")
    people = shown.index("waiting for a person")
    calls = shown.index("agent call(s) holding slots now")
    assert advanced in shown[now:later] and holder in shown[now:later]
    assert unclaimed in shown[later:people] and advanced not in shown[later:people]
    # A report waiting for a person is no work to claim: listed apart.
    assert for_person in shown[people:calls] and for_person not in shown[:people]
    view = json.loads(phasegate_cli("queue", "show", "-C", repo, "--json").stdout)
    assert {q["id"]: q["for_person"] for q in view["queued"]} == {
        unclaimed: False,
        advanced: False,
        for_person: True,
    }
    assert f"holding: {advanced} (plan, priority 0) on provider anthropic, worker {holder}" in shown


def test_doctor_warns_of_a_provider_cap_no_role_counts_against(happy_repo: Path) -> None:
    from phasegate.tools.doctor import diagnose

    cartridge = happy_repo / "phasegate.toml"
    with cartridge.open("a") as text:
        text.write('\n[queue]\nmax_calls_per_provider = {antropic = 2, scripted = 1, "*" = 4}\n')
    said = [w for w in diagnose(happy_repo, offline=True).warnings if "max_calls_per" in w]
    # the roles here are scripted: that cap and "*" count; the typo holds nothing back
    assert said == [
        "queue.max_calls_per_provider: no role here calls 'antropic' (did you mean "
        "'anthropic'?); the roles' providers: scripted; its cap holds nothing back"
    ]
