"""A first run with no agent and no model key: ``init`` binds the sample agent and ``run``
takes a ticket through the whole lifecycle on the person's own repository (a clone of it).

Every command is the real console script in a process of its own, with a PATH
that holds no agent CLI and an environment without a model key; the repository,
git and the sandbox are real.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from phasegate.config.cartridge import load_cartridge
from phasegate.tools.discover import AGENT_CLIS, MODEL_KEY_VARS
from phasegate.tools.sample_agent import SAMPLE_COMMAND, answer

from conftest import git, make_repo, phasegate_cli


def no_agent_env() -> dict[str, str]:
    """This process's environment without a model key, a runner's executable override or a
    PATH folder holding an agent CLI."""
    folders = [
        folder
        for folder in os.environ.get("PATH", "").split(os.pathsep)
        if folder and not any(os.access(Path(folder, cli), os.X_OK) for cli in AGENT_CLIS)
    ]
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in MODEL_KEY_VARS
        and not name.endswith("_API_KEY")
        and not (name.startswith("PHASEGATE_") and name.endswith("_BIN"))
    }
    return {**env, "PATH": os.pathsep.join(folders), "COLUMNS": "200"}


def phasegate(repo: Path, *args: str) -> tuple[int, Any]:
    """``phasegate ARGS --repo REPO --json`` as a process: its exit code and its JSON."""
    exe = Path(sys.executable).parent / "phasegate"
    proc = subprocess.run(
        [str(exe), *args, "--repo", str(repo), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=no_agent_env(),
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_init_then_run_completes_a_workflow_with_no_agent_and_no_key(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "own repo", {"README.md": "# mine\n", "src/app.py": "x = 1\n"})
    code, init = phasegate(repo, "init")
    assert code == 0, init
    # no path of this checkout or machine: phasegate runs the agent installed with it
    assert init["sample_agent"] == {"command": SAMPLE_COMMAND, "calls_a_model": False}
    assert init["roles"]["runner"] == "command"
    assert init["next"][0].startswith("git add phasegate.toml && git commit")
    assert any("phasegate approve-merge" in step for step in init["next"])
    assert any("edit [agents.sample]" in note for note in init["notes"])
    cartridge = load_cartridge(repo)
    for role in ("plan", "plan_review", "build", "review", "verification"):
        binding = cartridge.role(role)
        assert (binding.runner, binding.command, binding.agent) == (
            "command",
            init["sample_agent"]["command"],
            "sample",
        )
    # Only the cartridge is there to commit, as init's next step says.
    assert git(repo, "status", "--porcelain") == "?? phasegate.toml"
    assert not (repo / ".phasegate").exists()
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "phasegate cartridge")

    # Another person's clone, the first checkout's files gone: the committed cartridge
    # runs there all the same (worktree, the verifier's checkout), nothing of init's left.
    clone = tmp_path / "their clone"
    git(tmp_path, "clone", "-q", str(repo), str(clone))
    git(clone, "config", "user.email", "them@example.com")
    git(clone, "config", "user.name", "them")
    git(repo, "config", "core.bare", "true")
    for entry in repo.iterdir():
        if entry.name != ".git":
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    repo = clone
    code, doctor = phasegate(repo, "doctor", "--offline")
    assert code == 0, doctor
    build = next(r for r in doctor["roles"] if r["role"] == "build")
    assert build["executable"] == "$PHASEGATE_PYTHON", build
    assert Path(build["resolved"]).parent == Path(sys.executable).parent
    assert any("bound to the stand-in sample agent" in w for w in doctor["warnings"]), doctor

    code, run = phasegate(repo, "run", "Add a line to NOTES.md")
    assert (code, run["status"], run["current_phase"]) == (0, "waiting", "wait"), run
    assert run["profile"] == "review"  # init's profile: a person lets it merge
    code, merged = phasegate(repo, "approve-merge", run["id"])
    assert (code, merged["status"]) == (0, "completed"), merged

    notes = git(repo, "show", "main:NOTES.md")
    assert notes == f"- Add a line to NOTES.md (phasegate workflow {run['id']})"
    shown = json.loads(phasegate_cli("show", run["id"], "--repo", str(repo), "--json").stdout)
    verified = [m for m in shown["milestones"] if m["kind"] == "acceptance_verification"]
    verdicts = [m["data"]["verdict"] for m in verified]
    assert verdicts == ["confirmed"], shown["milestones"]
    runs = shown["agent_runs"]
    assert {r["role"] for r in runs} == {"plan", "plan_review", "build", "review", "verification"}
    assert {r["runner"] for r in runs} == {"command"} and sum(r["cost_usd"] for r in runs) == 0
    # Nothing of the sample agent reached the base branch.
    assert ".phasegate/" not in git(repo, "ls-tree", "-r", "--name-only", "main")


def test_a_new_project_with_no_agent_gets_the_sample_agent_too(tmp_path: Path) -> None:
    where = tmp_path / "elsewhere"  # no cartridge to copy: init's is taken
    where.mkdir()
    checkout = tmp_path / "gadgets"
    code, run = phasegate(
        where, "run", "--new-project", "gadgets", "--dir", str(checkout), "Add a line"
    )
    assert (code, run["status"]) == (0, "waiting"), run
    assert f"command = '{SAMPLE_COMMAND}'" in (checkout / "phasegate.toml").read_text()
    assert git(checkout, "ls-tree", "--name-only", "main") == "README.md\nphasegate.toml"
    assert git(checkout, "status", "--porcelain") == ""


def test_the_sample_agent_answers_graph_mode_with_a_diff(tmp_path: Path) -> None:
    # no newline at its end: the new line goes on a line of its own all the same
    repo = make_repo(tmp_path / "repo", {"NOTES.md": "- an older note"})
    assert phasegate(repo, "init")[0] == 0
    cartridge = repo / "phasegate.toml"
    text = cartridge.read_text()
    assert "# [graph]\n# enabled = true\n" in text
    cartridge.write_text(text.replace("# [graph]\n# enabled = true\n", "[graph]\nenabled = true\n"))
    git(repo, "add", "phasegate.toml")
    git(repo, "commit", "-q", "-m", "phasegate cartridge, graph mode")
    # full-auto: the graph's draft PR proposal lands and the change merges unasked
    code, run = phasegate(repo, "run", "Add a line", "--profile", "full-auto")
    assert (code, run["status"]) == (0, "completed"), run
    assert git(repo, "show", "main:NOTES.md").splitlines() == [
        "- an older note",
        f"- Add a line (phasegate workflow {run['id']})",
    ]


def test_the_sample_agent_answers_each_role_by_rule(tmp_path: Path) -> None:
    prompt = "Write the plan.\n\n## Ticket: Add a line\n\nmore\n"
    assert answer("plan", prompt, "w1", True, tmp_path) == (
        "1. Add one line to NOTES.md naming the ticket: Add a line.\n"
    )
    graph = "Build it.\n\n## Ticket\n\n  Add a graph line\nbody\n"
    diff = answer("build", graph, "w2", True, tmp_path)
    assert "--- /dev/null\n+++ b/NOTES.md\n@@ -0,0 +1 @@\n" in diff, diff
    assert "+- Add a graph line (phasegate workflow w2)\n" in diff
    assert answer("verification", prompt, "w1", True, tmp_path).endswith("indeterminate\n")
    (tmp_path / "NOTES.md").write_bytes(b"old")  # no newline at its end
    answer("build", prompt, "w3", False, tmp_path)
    assert (tmp_path / "NOTES.md").read_text() == "old\n- Add a line (phasegate workflow w3)\n"
    assert answer("verification", prompt, "w1", True, tmp_path).endswith("confirmed\n")
    with pytest.raises(ValueError, match="no answer for the role arbitrate"):
        answer("arbitrate", prompt, "w1", True, tmp_path)
