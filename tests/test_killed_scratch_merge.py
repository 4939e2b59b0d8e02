"""A merge killed in its scratch checkout, while the person's checkout is on another
branch, leaves that checkout holding the base: ``git checkout main`` fails. doctor
and show name it while it does, and the next repair (a workflow's next step, here
the start of another) removes it; a live merge's scratch checkout is left alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from phasegate.config.cartridge import load_cartridge
from phasegate.git.workspace import Workspace
from phasegate.store import open_store

from conftest import HAPPY_ANSWERS, git, make_repo, phasegate_cli, scripted_cartridge


def cli_json(repo: Path, *args: str) -> dict:
    proc = phasegate_cli(*args, "--repo", str(repo), "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    return json.loads(proc.stdout)


def big_branch(repo: Path, files: int = 3000) -> str:
    """A branch off main adding ``files`` files: its merge writes them one by one, a
    window of seconds to kill it in."""
    git(repo, "checkout", "-q", "-b", "big", "main")
    (repo / "big").mkdir()
    for i in range(files):
        (repo / "big" / f"f{i}").write_text(f"{i}\n")
    git(repo, "add", "big")
    git(repo, "commit", "-q", "-m", "many files")
    git(repo, "checkout", "-q", "main")
    return "big"


def kill_a_merge_in_its_scratch_checkout(repo: Path, branch: str) -> Path:
    """Merge ``branch`` into main in a process SIGKILLed once git has begun writing the
    merge in the scratch checkout (main is checked out nowhere else); its path."""
    scratch = Workspace().scratch_path(repo, "merge-main")
    code = (
        "import sys\nfrom pathlib import Path\nfrom phasegate.git.workspace import Workspace\n"
        "Workspace().merge_into_base(Path(sys.argv[1]), 'main', sys.argv[2], 'Merge it')\n"
    )
    merging = subprocess.Popen(
        [sys.executable, "-c", code, str(repo), branch],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not (scratch / "big" / "f0").exists():
        assert merging.poll() is None, "the merge ended before git had begun it"
        assert time.monotonic() < deadline, "git never began the merge"
        time.sleep(0.002)
    os.killpg(merging.pid, signal.SIGKILL)
    merging.wait(timeout=10)
    return scratch


def dashboard_page(repo: Path, workflow_id: str) -> str:
    """The workflow's page as the dashboard serves it, its text on one line."""
    from fastapi.testclient import TestClient
    from test_web import TOKEN, logged_in

    from phasegate.runtime.engine import Engine
    from phasegate.web import Access, create_app

    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    try:
        with TestClient(create_app(Engine(repo, cartridge, store), Access(token=TOKEN))) as client:
            logged_in(client)
            return " ".join(client.get(f"/workflows/{workflow_id}").text.split())
    finally:
        store.close()


def test_a_killed_merges_scratch_checkout_is_named_then_freed(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge(auto_merge=False))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    first = cli_json(repo, "run", "Add the feature")
    assert (first["current_phase"], first["status"]) == ("wait", "waiting"), first
    big = big_branch(repo)
    git(repo, "checkout", "-q", "-b", "other")  # the person works elsewhere
    main = git(repo, "rev-parse", "main")

    scratch = kill_a_merge_in_its_scratch_checkout(repo, big)
    ws = Workspace()
    assert ws.scratch_holders(repo) == [(scratch, "main")]
    refused = subprocess.run(["git", "checkout", "main"], cwd=repo, capture_output=True, text=True)
    assert refused.returncode != 0 and str(scratch) in refused.stderr
    assert git(repo, "rev-parse", "main") == main  # the killed merge landed nothing

    # While it holds main, doctor and show say which checkout holds it and how to free it.
    note = f"the scratch checkout {scratch} holds main"
    doctor = cli_json(repo, "doctor", "--offline")
    [said] = [w for w in doctor["warnings"] if w.startswith(note)]
    assert f"git worktree remove --force {scratch}" in said and "phasegate resume" in said
    shown = cli_json(repo, "show", first["id"])["scratch_checkouts"]
    assert [(s["path"], s["branch"]) for s in shown] == [(str(scratch), "main")]
    text = phasegate_cli("show", first["id"], "--repo", str(repo)).stdout
    assert note in " ".join(text.split())
    assert note in dashboard_page(repo, first["id"])

    # A live merge's scratch checkout is that merge's: no repair takes it.
    with ws.merge_lock(repo):
        notes = ws.repair(repo)
        assert not any("scratch checkout" in n for n in notes), notes
        assert ws.scratch_holders(repo) == [(scratch, "main")]
        assert ws.left_scratch_checkouts(repo) == []

    # The next repair frees it: here, the start of another workflow.
    second = cli_json(repo, "run", "Add another feature")
    assert (second["current_phase"], second["status"]) == ("wait", "waiting"), second
    store = open_store(load_cartridge(repo).store_url(repo))
    repaired = [
        e["data"]["note"] for e in store.events(second["id"]) if e["type"] == "git_repaired"
    ]
    assert repaired == [f"removed the scratch checkout {scratch} a killed merge left holding main"]
    assert ws.scratch_holders(repo) == [] and not scratch.exists()
    git(repo, "checkout", "-q", "main")
    assert git(repo, "rev-parse", "HEAD") == main
    assert cli_json(repo, "show", first["id"])["scratch_checkouts"] == []
    assert not any(
        "scratch checkout" in w for w in cli_json(repo, "doctor", "--offline")["warnings"]
    )
