"""The operations layer: every person's action once, its refusals
word for word the CLI's, who acts recorded, and cancel.

Real git repositories, a real SQLite file, the real CLI in a subprocess on the same
state as the operations called here.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_gate import clean_run

from phasegate import operations
from phasegate.core.contract import ContractViolation, PhasegateError
from phasegate.proc.host import host_name
from phasegate.runtime.engine import Engine, LeaseHeld
from phasegate.store import Store

from conftest import git, phasegate_cli


def decision_events(store: Store, workflow_id: str) -> list[dict[str, Any]]:
    return [e["data"] for e in store.events(workflow_id) if e["type"] == operations.DECISION_EVENT]


def waiting(engine: Engine, title: str) -> str:
    """A workflow run offline to the wait for its merge approval."""
    row = operations.start(engine, title, by="test", auto_merge=False)
    advanced = engine.advance(row["id"])
    assert advanced["status"] == "waiting", advanced["error"]
    return str(row["id"])


def test_every_refusal_is_the_clis_message_word_for_word_and_changes_nothing(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(happy_repo)
    filed = operations.start(engine, "Add a feature", by="ana")["id"]
    done = operations.start(engine, "Add another", by="ana")["id"]
    assert engine.advance(done)["status"] == "completed"
    # a draft PR of a run its workflow does not wait for (it is in preparation)
    (stale,) = store.record_run(clean_run("run-stale"), workflow_id=filed)
    (loose,) = store.record_run(clean_run("run-loose"))

    refusals: list[tuple[Callable[[], object], tuple[str, ...]]] = [
        (lambda: operations.start(engine, " \n", by="ana"), ("run", " \n")),
        (lambda: operations.resume(engine, done, by="ana"), ("resume", done)),
        (lambda: operations.feedback(engine, filed, "  ", by="ana"), ("feedback", filed, "  ")),
        (
            lambda: operations.approve_merge(engine, filed, by="ana"),
            ("approve-merge", filed, "--by", "ana"),
        ),
        (
            lambda: operations.revert(engine, filed, "plan again", by="ana"),
            ("revert", filed, "--reason", "plan again"),
        ),
        (
            lambda: operations.revert(engine, done, "x", by="ana", to_phase="development"),
            ("revert", done, "--reason", "x", "--to-phase", "development"),
        ),
        (
            lambda: operations.verify_override(engine, filed, "confirmed", by="ana"),
            ("verify-override", filed, "--verdict", "confirmed", "--by", "ana"),
        ),
        (
            lambda: operations.approve(engine, stale["id"], by="ana"),
            ("approve", stale["id"], "--by", "ana"),
        ),
        (
            lambda: operations.approve(engine, loose["id"], by="auto"),
            ("approve", loose["id"], "--by", "auto"),
        ),
        (
            lambda: operations.reject(engine, loose["id"], " ", by="ana"),
            ("reject", loose["id"], "--reason", " ", "--by", "ana"),
        ),
        (lambda: operations.approve(engine, "deadbeef", by="ana"), ("approve", "deadbeef")),
        (lambda: operations.cleanup(engine, "nope", by="ana"), ("cleanup", "nope")),
        (lambda: operations.cancel(engine, done, by="ana"), ("cancel", done)),
        # Who acts is checked as the people table checks a name, before anything.
        (lambda: operations.cancel(engine, filed, by=""), ("cancel", filed, "--by", "")),
        (
            lambda: operations.feedback(engine, filed, "more", by="mal\nlory"),
            ("feedback", filed, "more", "--by", "mal\nlory"),
        ),
        (
            lambda: operations.approve_merge(engine, filed, by=" ana"),
            ("approve-merge", filed, "--by", " ana"),
        ),
        (
            lambda: operations.start(engine, "Add x", by="x" * 65),
            ("run", "Add x", "--by", "x" * 65),
        ),
        (
            lambda: operations.reject(engine, loose["id"], "no", by="a\x1b[2Jb"),
            ("reject", loose["id"], "--reason", "no", "--by", "a\x1b[2Jb"),
        ),
        (lambda: operations.cleanup(engine, by="\t"), ("cleanup", "--by", "\t")),
    ]
    before = {w: store.workflow_row(w)["version"] for w in (filed, done)}
    for act, args in refusals:
        with pytest.raises(PhasegateError) as refused:
            act()
        proc = phasegate_cli(*args, "--repo", str(happy_repo))
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert f"error: {refused.value}" in proc.stderr, (args, proc.stderr)
    assert {w: store.workflow_row(w)["version"] for w in (filed, done)} == before
    assert store.proposal(stale["id"])["status"] == "proposed"
    assert store.proposal(loose["id"])["status"] == "proposed"
    assert len(store.list_workflows()) == 2  # the empty ticket filed nothing


def test_a_decision_while_another_process_holds_the_lease_is_refused_alike(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(happy_repo)
    filed = operations.start(engine, "Add a feature", by="ana")["id"]
    # a live holder: this very process, under another owner's name
    assert store.claim(filed, f"{host_name()}:{os.getpid()}:elsewhere", 600) is not None
    with pytest.raises(LeaseHeld, match=f"another process \\({host_name()}:{os.getpid()}\\);"):
        operations.cancel(engine, filed, by="ana")  # named as status names it
    for act, args in [
        (lambda: operations.cancel(engine, filed, by="ana"), ("cancel", filed)),
        (lambda: operations.resume(engine, filed, by="ana"), ("resume", filed, "--no-advance")),
    ]:
        with pytest.raises(LeaseHeld) as refused:
            act()
        proc = phasegate_cli(*args, "--repo", str(happy_repo))
        assert proc.returncode == 2 and f"error: {refused.value}" in proc.stderr, proc.stderr
    assert store.workflow_row(filed)["status"] == "preparing"


def test_a_decision_waits_for_a_worker_holding_a_waiting_workflow_for_a_moment(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(happy_repo)
    wf = waiting(engine, "Add a feature")
    # a worker ending the advance that left it waiting: this process, another owner
    other = f"{host_name()}:{os.getpid()}:worker"
    assert store.claim(wf, other, 600) is not None
    released = threading.Timer(0.3, store.release, (wf, other))
    released.start()
    try:
        started = time.monotonic()
        row = operations.approve_merge(engine, wf, by="ana")
    finally:
        released.cancel()
    assert time.monotonic() - started >= 0.25  # it waited for the release
    assert row["state"]["merge_approved_by"] == "ana"


def test_who_approved_the_merge_is_in_the_summary_before_and_after_it(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(happy_repo)
    wf = waiting(engine, "Add a feature")
    shown = json.loads(phasegate_cli("show", wf, "--repo", str(happy_repo), "--json").stdout)
    assert shown["workflow"]["merge_approved_by"] is None
    operations.approve_merge(engine, wf, by="ana")
    assert engine.advance(wf)["status"] == "completed"
    shown = json.loads(phasegate_cli("show", wf, "--repo", str(happy_repo), "--json").stdout)
    assert shown["workflow"]["merge_approved_by"] == "ana"
    [listed] = json.loads(phasegate_cli("status", "--repo", str(happy_repo), "--json").stdout)
    assert listed["merge_approved_by"] == "ana"


def test_a_verdict_that_is_neither_is_named_before_the_phase_it_is_in(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, _ = engine_for(happy_repo)
    wf = waiting(engine, "Add a feature")
    with pytest.raises(ContractViolation, match="verdict must be confirmed or rejected"):
        operations.verify_override(engine, wf, "maybe", by="ana")
    with pytest.raises(ContractViolation, match="is in wait, not acceptance_verification"):
        operations.verify_override(engine, wf, "confirmed", by="ana")


def test_a_decision_is_refused_once_the_wait_for_a_holder_runs_out(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]], monkeypatch
) -> None:
    monkeypatch.setattr(operations, "DECISION_WAIT_S", 0.3)
    engine, store = engine_for(happy_repo)
    wf = waiting(engine, "Add a feature")
    assert store.claim(wf, f"{host_name()}:{os.getpid()}:stuck", 600) is not None
    before = store.workflow_row(wf)["version"]
    started = time.monotonic()
    with pytest.raises(LeaseHeld):
        operations.approve_merge(engine, wf, by="ana")
    assert 0.3 <= time.monotonic() - started < 5
    assert store.workflow_row(wf)["version"] == before


def test_who_acts_is_recorded_where_the_action_records_a_person_and_in_its_event(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    # feedback's round builds something new (the scripted runner's last answer repeats)
    with (happy_repo / "answers.toml").open("a") as answers:
        answers.write('[[build]]\ntext = "renamed"\n[build.files]\n"feature.txt" = "named\\n"\n')
    git(happy_repo, "commit", "-qam", "a second build")
    engine, store = engine_for(happy_repo)
    wf = waiting(engine, "Add a feature")
    operations.feedback(engine, wf, "name it feature.txt", by="bo")
    assert engine.advance(wf)["status"] == "waiting"
    proc = phasegate_cli(
        "approve-merge", wf, "--by", "ana", "--no-advance", "--repo", str(happy_repo)
    )
    assert proc.returncode == 0, proc.stderr
    assert store.workflow_row(wf)["state"]["merge_approved_by"] == "ana"
    assert decision_events(store, wf) == [
        {"action": "start", "by": "test"},
        {"action": "feedback", "by": "bo"},
        {"action": "approve_merge", "by": "ana"},
    ]
    (loose,) = store.record_run(clean_run("run-loose"))
    outcome = operations.approve(engine, loose["id"], by="cy")
    assert (outcome.proposal["decided_by"], outcome.workflow_id) == ("cy", None)
    assert store.proposal(loose["id"])["decided_by"] == "cy"


def test_cancel_ends_a_workflow_for_good_closes_its_own_pull_request_and_leaves_its_issue(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(happy_repo)
    wf = waiting(engine, "Add a feature")
    filed = store.workflow_row(wf)
    issue = engine.forge.issue(filed["issue_number"])
    pr = engine.forge.pull_request(filed["pr_number"])

    proc = phasegate_cli("cancel", wf, "--by", "ana", "--json", "--repo", str(happy_repo))
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert (shown["id"], shown["status"]) == (wf, "cancelled")
    row = store.workflow_row(wf)
    assert (row["status"], row["current_phase"], row["error"]) == (
        "cancelled",
        "wait",
        "cancelled by ana",
    )
    assert decision_events(store, wf)[-1] == {"action": "cancel", "by": "ana"}
    assert engine.forge.issue(issue.number).state == issue.state == "open"
    assert pr.state == "open" and engine.forge.pull_request(pr.number).state == "closed"

    # no worker takes it on, and nothing a person does moves it on
    worker = phasegate_cli("worker", "--once", "--repo", str(happy_repo))
    assert worker.returncode == 0, worker.stderr
    assert store.workflow_row(wf)["version"] == row["version"]
    resumed = phasegate_cli("resume", wf, "--repo", str(happy_repo))
    assert resumed.returncode == 2
    assert f"error: workflow {wf} is cancelled; nothing moves it on" in resumed.stderr
    with pytest.raises(PhasegateError, match="is cancelled"):
        operations.approve_merge(engine, wf, by="ana")
    with pytest.raises(PhasegateError, match="is cancelled"):
        operations.cancel(engine, wf, by="ana")
    assert store.workflow_row(wf)["version"] == row["version"]


def test_a_ticket_feedback_and_reasons_reach_the_store_without_a_secret(
    happy_repo: Path,
    engine_for: Callable[..., tuple[Engine, Store]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = "sk-sentinel-4Hq8Vn2Kd7"
    monkeypatch.setenv("SENTINEL_API_KEY", secret)
    engine, store = engine_for(happy_repo)
    wf = waiting(engine, f"Add a feature; the key is {secret}")
    operations.feedback(engine, wf, f"use {secret} in the test", by="bo")
    operations.revert(engine, wf, f"the plan leaks {secret}", by="bo")
    (loose,) = store.record_run(clean_run("run-loose"))
    operations.reject(engine, loose["id"], f"it prints {secret}", by="bo")
    row = store.workflow_row(wf)
    stored = json.dumps(
        [row, store.events(wf), store.proposal(loose["id"])], default=str, ensure_ascii=False
    )
    assert secret not in stored
    assert "use " in row["user_feedback"] and row["state"]["decisions"][-1]["reason"]


def test_the_actions_offered_follow_the_workflows_state(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(happy_repo)
    filed = operations.start(engine, "Add a feature", by="ana")["id"]
    wf = waiting(engine, "Add another")  # before the next one lands the same file
    done = operations.start(engine, "Add a third", by="ana")["id"]
    assert engine.advance(done)["status"] == "completed"

    def offered(workflow_id: str, held: bool = False) -> tuple[str, ...]:
        return operations.actions(store.load_context(workflow_id), held=held)

    assert offered(filed) == ("resume", "cancel")  # filed, nobody advances it yet
    assert offered(filed, held=True) == ()
    assert offered(done) == ()
    assert offered(wf) == ("approve_merge", "feedback", "revert", "cancel")
    operations.approve_merge(engine, wf, by="ana")  # offered, so accepted
    # Approved, it merges next: feedback or a second approval would drop or blur
    # that decision without a word, so neither is offered and both are refused.
    assert offered(wf) == ("revert", "cancel")
    before = store.workflow_row(wf)
    with pytest.raises(ContractViolation, match=r"merge is approved \(by ana\) and it merges next"):
        operations.feedback(engine, wf, "one more thing", by="bo")
    with pytest.raises(ContractViolation, match=r"already approved \(by ana\)"):
        operations.approve_merge(engine, wf, by="bo")
    after = store.workflow_row(wf)
    assert (after["version"], after["user_feedback"]) == (before["version"], None)
    assert after["state"]["merge_approved_by"] == "ana"
    operations.cancel(engine, wf, by="ana")
    assert offered(wf) == ()


def test_feedback_and_a_review_over_a_ticket_s_limit_are_refused_and_change_nothing(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(happy_repo)
    wf = waiting(engine, "Add a feature")
    too_long = "x" * (operations.MAX_TICKET_BYTES + 1)
    version = store.workflow_row(wf)["version"]
    with pytest.raises(operations.ActionRefused, match="the feedback is over 1000000 bytes"):
        operations.feedback(engine, wf, too_long, by="bo")
    with pytest.raises(operations.ActionRefused, match="the review's summary is over"):
        operations.send_review(engine, wf, too_long, by="bo")
    assert store.workflow_row(wf)["version"] == version
    assert decision_events(store, wf) == [{"action": "start", "by": "test"}]
    # Each part under the limit, the review they make together over it.
    half = "y" * (operations.MAX_TICKET_BYTES // 2 + 10)
    operations.feedback(engine, wf, half, by="bo")
    version = store.workflow_row(wf)["version"]
    with pytest.raises(operations.ActionRefused, match="the review .* is over"):
        operations.send_review(engine, wf, half, by="bo")
    assert store.workflow_row(wf)["version"] == version
