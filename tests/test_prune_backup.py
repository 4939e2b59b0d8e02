"""``phasegate prune`` and ``phasegate backup`` on real stores: workflows run with
scripted agents in a real repository, the commands run as a person runs them.

Prune deletes only finished workflows' events, keeps their trail and totals,
and ``show`` still reads them; a backup taken while another process writes
opens as a valid store with the same workflows.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from phasegate import operations
from phasegate.core.contract import EventWrite
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store
from phasegate.store.prune import KEPT_EVENTS, PRUNED_EVENT
from phasegate.web import views

from conftest import git, phasegate_cli


def _finished_and_running(engine: Engine, store: Store) -> tuple[str, str, str]:
    """A completed workflow, a cancelled one and one still running, each with agent output."""
    done = engine.start("Add the feature", "Write feature.txt", auto_merge=False)
    engine.advance(done)
    operations.approve_merge(engine, done, by="alice")
    assert engine.advance(done)["status"] == "completed"
    cancelled = engine.start("Another", "Write other.txt")
    operations.cancel(engine, cancelled, by="alice")
    running = engine.start("Still going", "Write more.txt")
    for workflow_id in (done, cancelled, running):
        for n in range(50):
            text = {"role": "build", "text": f"line {n}\n"}
            store.add_event(workflow_id, EventWrite("agent_output", text))
    return done, cancelled, running


def test_prune_deletes_finished_workflows_events_keeps_their_trail_and_show_reads_them(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(happy_repo)
    done, cancelled, running = _finished_and_running(engine, store)
    before = {w: store.events(w) for w in (done, cancelled, running)}
    usage = store.usage_totals(done)
    shown_before = json.loads(phasegate_cli("show", done, "--json", "-C", str(happy_repo)).stdout)

    # Nothing is older than a day yet.
    young = phasegate_cli("prune", "--older-than", "1", "--json", "-C", str(happy_repo))
    assert young.returncode == 0, young.stderr
    assert json.loads(young.stdout)["workflows"] == 0

    dry = phasegate_cli("prune", "--older-than", "0", "--dry-run", "--json", "-C", str(happy_repo))
    counted = json.loads(dry.stdout)
    assert sorted(counted["workflow_ids"]) == sorted([done, cancelled])
    assert counted["events"]["agent_output"] == 100
    assert {w: store.events(w) for w in before} == before  # a dry run deletes nothing

    pruned = phasegate_cli("prune", "--older-than", "0", "--json", "-C", str(happy_repo))
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["event_count"] == counted["event_count"]

    assert store.events(running) == before[running]  # a running workflow stays whole
    for workflow_id in (done, cancelled):
        left = store.events(workflow_id)
        kept = [e for e in before[workflow_id] if e["type"] in KEPT_EVENTS]
        assert [e for e in left if e["type"] != PRUNED_EVENT] == kept
        summary = [e for e in left if e["type"] == PRUNED_EVENT]
        assert len(summary) == 1
        deleted = len(before[workflow_id]) - len(kept)
        assert sum(summary[0]["data"]["events"].values()) == deleted
        assert summary[0]["data"]["events"]["agent_output"] == 50
    assert store.usage_totals(done) == usage  # tokens and cost are the agent runs'

    shown = phasegate_cli("show", done, "--json", "-C", str(happy_repo))
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert detail["timeline"] == shown_before["timeline"]
    assert detail["milestones"] == shown_before["milestones"]
    assert detail["workflow"]["cost_usd"] == shown_before["workflow"]["cost_usd"]
    assert detail["pruned"]["events"]["agent_output"] == 50
    text = phasegate_cli("show", done, "-C", str(happy_repo))
    assert "events pruned" in text.stdout, text.stdout

    page = views.workflow_page(store, done)
    trail = [e for e in before[done] if e["type"] in KEPT_EVENTS]
    assert page["pruned"]["event_count"] == len(before[done]) - len(trail)
    assert [e["type"] for e in page["activity"]][-1] == PRUNED_EVENT

    again = phasegate_cli("prune", "--older-than", "0", "--json", "-C", str(happy_repo))
    assert json.loads(again.stdout)["workflows"] == 0  # nothing left to prune


WRITER = """
import sys, time
from phasegate.core.contract import EventWrite
from phasegate.store import open_store
store = open_store(sys.argv[1])
workflow_id = sys.argv[2]
print("writing", flush=True)
while True:
    store.add_event(workflow_id, EventWrite("agent_output", {"text": "x" * 200}))
"""


def test_backup_taken_while_a_worker_writes_is_a_valid_store_with_the_same_workflows(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]], tmp_path: Path
) -> None:
    engine, store = engine_for(happy_repo)
    ids = [engine.start(f"Feature {n}", f"Write f{n}.txt") for n in range(3)]
    url = f"sqlite:///{happy_repo / '.phasegate' / 'state.db'}"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, url, ids[0]], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
        target = tmp_path / "backup.db"
        taken = phasegate_cli("backup", str(target), "--json", "-C", str(happy_repo))
        assert taken.returncode == 0, taken.stderr
        assert json.loads(taken.stdout)["bytes"] == target.stat().st_size
        refused = phasegate_cli("backup", str(target), "-C", str(happy_repo))
        assert refused.returncode == 2 and "--force" in refused.stderr
        forced = phasegate_cli("backup", str(target), "--force", "-C", str(happy_repo))
        assert forced.returncode == 0, forced.stderr
    finally:
        writer.terminate()
        writer.wait(timeout=30)
        assert writer.stdout is not None
        writer.stdout.close()
    with sqlite3.connect(target) as check:
        assert check.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    copy = open_store(f"sqlite:///{target}")
    try:
        assert sorted(r["id"] for r in copy.list_workflows()) == sorted(ids)
        assert len(copy.events(ids[0])) > 1
    finally:
        copy.close()


def test_backup_of_a_postgresql_store_points_to_pg_dump(happy_repo: Path, tmp_path: Path) -> None:
    cartridge = happy_repo / "phasegate.toml"
    url = "postgresql://phasegate@127.0.0.1:1/phasegate"
    cartridge.write_text(f'[store]\nurl = "{url}"\n\n' + cartridge.read_text())
    git(happy_repo, "commit", "-qam", "a server's store")
    refused = phasegate_cli("backup", str(tmp_path / "b.db"), "-C", str(happy_repo))
    assert refused.returncode == 2
    assert "pg_dump" in refused.stderr and not (tmp_path / "b.db").exists()


def test_backup_to_a_directory_or_into_a_missing_one_says_which_and_what_to_do(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]], tmp_path: Path
) -> None:
    engine, _store = engine_for(happy_repo)
    engine.start("Feature", "Write f.txt")
    nowhere = tmp_path / "no" / "such"
    missing = phasegate_cli("backup", str(nowhere / "b.db"), "-C", str(happy_repo))
    assert missing.returncode == 2
    assert f"the directory {nowhere} does not exist" in missing.stderr
    assert f"mkdir -p {nowhere}" in missing.stderr and not nowhere.exists()
    folder = tmp_path / "backups"
    folder.mkdir()
    for force in ([], ["--force"]):
        onto = phasegate_cli("backup", str(folder), *force, "--json", "-C", str(happy_repo))
        assert onto.returncode == 2, onto.stdout
        said = json.loads(onto.stdout)["error"]["message"]
        assert said.startswith(f"{folder} is a directory; give a file to write")
        assert "Errno" not in onto.stderr and list(folder.iterdir()) == []
