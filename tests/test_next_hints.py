"""What a person is told to do next names the action that applies, a cancelled
workflow's time stops at its cancel, and a completed workflow's stream says so
with ``phase_change {"phase": "completed"}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from phasegate import operations
from phasegate.operations import login_name
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.summary import workflow_detail
from phasegate.web.views import activity, board, elapsed_s

from conftest import HAPPY_ANSWERS, git, make_repo, phasegate_cli, scripted_cartridge


def project(tmp_path: Path, verdict: str = "confirmed") -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    answers = HAPPY_ANSWERS.replace("VERDICT: confirmed", f"VERDICT: {verdict}")
    (repo / "answers.toml").write_text(answers)
    (repo / "phasegate.toml").write_text(scripted_cartridge())
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


def test_after_a_rejected_verification_the_hint_names_verify_override_not_resume(
    tmp_path: Path,
) -> None:
    repo = project(tmp_path, verdict="rejected")
    done = phasegate_cli("run", "Add the feature", "--repo", str(repo))
    assert done.returncode == 1, done.stderr
    assert "acceptance_verification" in done.stdout
    [hint] = [line for line in done.stdout.splitlines() if "next:" in line]
    assert "phasegate verify-override" in hint and "--verdict confirmed" in hint
    assert "phasegate resume" not in hint

    # The decision it names, with --by left out: the login name decides.
    [summary] = json.loads(phasegate_cli("status", "--json", "--repo", str(repo)).stdout)
    decided = phasegate_cli(
        "verify-override", summary["id"], "--verdict", "confirmed", "--json", "--repo", str(repo)
    )
    assert decided.returncode == 0, decided.stderr
    after = json.loads(decided.stdout)
    assert (after["status"], after["verified_by"]) == ("completed", login_name())


def test_a_paused_workflow_is_told_to_resume(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    from phasegate.cli.render import next_hint
    from phasegate.core.contract import PhaseResult

    engine, store = engine_for(project(tmp_path))
    workflow_id = engine.start("Paused", "Write feature.txt")
    engine.decide(workflow_id, lambda _ctx: PhaseResult("pause", reason="given up"))
    hint = next_hint(store.load_context(workflow_id))
    assert hint == f"`phasegate show {workflow_id}`, then `phasegate resume {workflow_id}`"


def test_a_cancelled_workflows_elapsed_time_stops_at_its_cancel(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(project(tmp_path))
    workflow_id = engine.start("Cancelled", "Write feature.txt")
    running = engine.start("Still filed", "Write feature.txt")
    operations.cancel(engine, workflow_id, by="ana")
    row = store.workflow_row(workflow_id)
    taken = (row["updated_at"] - row["created_at"]).total_seconds()
    later = store.clock.now() + timedelta(hours=5)
    assert elapsed_s(row, later) == taken < 3600
    cards = {c["id"]: c for g in board(store, later) for c in g["cards"]}
    assert cards[workflow_id]["elapsed_s"] == taken
    assert cards[running]["elapsed_s"] >= 5 * 3600  # one not ended goes on counting


def test_a_merged_workflow_ends_its_stream_with_phase_change_completed(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(project(tmp_path))
    workflow_id = engine.start("Merged", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "completed"
    events = store.events(workflow_id)
    phases = [e["data"]["phase"] for e in events if e["type"] == "phase_change"]
    assert phases[-4:] == ["merge", "completed", "acceptance_verification", "completed"]
    completed = next(i for i, e in enumerate(events) if e["data"] == {"phase": "completed"})
    # in the merge's own commit, the moment the change landed
    entered = next(i for i, e in enumerate(events) if e["data"] == {"phase": "merge"})
    assert events[completed + 1]["data"] == {"phase": "acceptance_verification"}
    assert entered < completed
    merge_done = [
        i
        for i, e in enumerate(events)
        if e["type"] == "milestone_updated"
        and e["data"].get("phase") == "merge"
        and e["data"].get("status") == "completed"
    ]
    assert merge_done and max(merge_done) < completed  # said after the merge succeeded
    assert store.workflow_row(workflow_id)["merge_sha"]
    # A person's timeline has each phase once: the UI consumers' marker is left out.
    timeline = [t["phase"] for t in workflow_detail(store, workflow_id)["timeline"]]
    assert timeline[-3:] == ["merge", "acceptance_verification", "completed"]
    said = {a["id"]: a["text"] for a in activity(events)}
    assert said[events[completed]["id"]] == "merged (acceptance verification follows)"
    last = [e for e in events if e["type"] == "phase_change"][-1]
    assert said[last["id"]] == "entered completed"
