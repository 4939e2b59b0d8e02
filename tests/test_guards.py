"""Refs and .git around agent runs: real workflows with
``command`` agents that attack the repository, real git, the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from phasegate.agents.base import AgentResult
from phasegate.git import guard
from phasegate.git.command import withhold_from_git
from phasegate.git.workspace import Workspace

from conftest import alive, git, land_held, make_repo, phasegate_cli


def _bind(repo: Path, role: str, command: str) -> None:
    """Bind ``role`` of the happy cartridge to a ``command`` agent, committed."""
    cartridge = (repo / "phasegate.toml").read_text()
    scripted = f'[roles.{role}]\nrunner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n'
    assert scripted in cartridge
    body = json.dumps(command)  # a TOML basic string is a JSON string
    (repo / "phasegate.toml").write_text(
        cartridge.replace(scripted, f'[roles.{role}]\nrunner = "command"\ncommand = {body}\n')
    )
    git(repo, "commit", "-qam", f"{role} is a command")


def _violations(store, workflow_id: str) -> list[dict]:
    return [e["data"] for e in store.events(workflow_id) if e["type"] == "violation"]


# -- refs -------------------------------------------------------------------------

SIDE_BRANCH_AGENT = """
me=$(git symbolic-ref --short HEAD)
git checkout -q -b side main
echo evil > evil.txt && git add evil.txt && git commit -qm 'evil on a side branch'
git checkout -q "$me"
git reset -q --hard side
git tag planted side
echo built
"""

PERSON_CHECKOUT_AGENT = """
person=$(dirname "$(git rev-parse --path-format=absolute --git-common-dir)")
echo evil > "$person/evil.txt"
git -C "$person" add evil.txt && git -C "$person" commit -qm 'evil straight onto the base'
echo built
"""


@pytest.mark.parametrize(
    "agent", [SIDE_BRANCH_AGENT, PERSON_CHECKOUT_AGENT], ids=["side_branch", "person_checkout"]
)
def test_a_build_agent_that_moves_refs_is_undone_and_its_attempt_fails(
    happy_repo: Path, engine_for, agent: str
) -> None:
    _bind(happy_repo, "build", agent)
    base_before = git(happy_repo, "rev-parse", "main")
    engine, store = engine_for(happy_repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "failed" and "ref_violation" in row["error"]
    assert git(happy_repo, "rev-parse", "main") == base_before
    assert "evil" not in git(happy_repo, "log", "--all", "--format=%s")  # no ref reaches it
    assert git(happy_repo, "branch", "--list", "side") == ""
    assert git(happy_repo, "tag", "--list") == ""
    worktree = Path(row["worktree_path"])
    assert git(worktree, "symbolic-ref", "--short", "HEAD") == row["branch_name"]
    runs = [r for r in store.agent_runs(row["id"]) if r["role"] == "build"]
    assert [r["error_kind"] for r in runs] == ["ref_violation"] * 3
    found = _violations(store, row["id"])
    assert {(v["name"], v["role"]) for v in found} == {("ref_violation", "build")}
    assert any("refs/heads/main" in v["paths"] or "refs/heads/side" in v["paths"] for v in found)
    shown = phasegate_cli("show", row["id"], "--repo", str(happy_repo)).stdout
    assert "violations (3)" in shown and "ref_violation · build" in shown


def test_a_build_agent_that_only_edits_files_is_no_violation(happy_repo: Path, engine_for) -> None:
    _bind(happy_repo, "build", "echo made > feature.txt; git add feature.txt; echo built")
    engine, store = engine_for(happy_repo)
    row = engine.advance(engine.start("t", "ticket"))
    assert row["status"] == "completed", row["error"]
    assert _violations(store, row["id"]) == []
    assert git(happy_repo, "show", "main:feature.txt") == "made"


# -- .git integrity ---------------------------------------------------------------


def _marker_script(tmp_path: Path) -> tuple[Path, Path]:
    """A script that leaves a marker file whenever anything runs it."""
    marker = tmp_path / "MARKER"
    script = tmp_path / "planted.sh"
    script.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\nexit 0\n')
    script.chmod(0o755)
    return script, marker


HOOKS = ("pre-commit", "post-commit", "post-checkout", "post-merge", "reference-transaction")


def _attacks(script: Path, tmp_path: Path) -> dict[str, str]:
    hooks_dir = tmp_path / "evil-hooks"
    include = tmp_path / "evil-include"
    plant_hooks = "; ".join(f"cp {script} {hooks_dir}/{name}" for name in HOOKS)
    common_hooks = "; ".join(f'cp {script} "$common/hooks/{name}"' for name in HOOKS)
    return {
        "fsmonitor": f"git config core.fsmonitor {script}",
        "hooks_path": f"mkdir -p {hooks_dir}; {plant_hooks}; git config core.hooksPath {hooks_dir}",
        "common_hooks": "common=$(git rev-parse --path-format=absolute --git-common-dir); "
        + common_hooks,
        "alias_and_include": f"printf '[core]\\n\\tfsmonitor = {script}\\n' > {include}; "
        f"git config alias.st '!{script}'; git config include.path {include}",
        "info": "common=$(git rev-parse --path-format=absolute --git-common-dir); "
        'echo "* filter=evil" > "$common/info/attributes"; echo "*.py" >> "$common/info/exclude"',
    }


def _git_dir_state(repo: Path) -> dict[str, bytes]:
    common = repo / ".git"
    watched = [common / "config", *(common / "hooks").rglob("*"), *(common / "info").rglob("*")]
    return {str(p.relative_to(common)): p.read_bytes() for p in watched if p.is_file()}


@pytest.mark.parametrize(
    "attack", ["fsmonitor", "hooks_path", "common_hooks", "alias_and_include", "info"]
)
def test_a_read_only_role_that_plants_code_in_git_never_has_it_run(
    happy_repo: Path, engine_for, tmp_path: Path, attack: str
) -> None:
    script, marker = _marker_script(tmp_path)
    # The plan role attacks on its first call only, so the workflow goes on to the
    # later git calls, the merge and the verification checkout.
    body = _attacks(script, tmp_path)[attack]
    _bind(
        happy_repo,
        "plan",
        f'if [ "$PHASEGATE_CALL_INDEX" = 0 ]; then {body}; fi; echo "1. Write feature.txt"',
    )
    engine, store = engine_for(happy_repo)
    workflow_id = engine.start("t", "ticket")  # (adds .phasegate/ to info/exclude)
    before = _git_dir_state(happy_repo)
    row = land_held(engine, engine.advance(workflow_id), "git_dir_violation")
    assert row["status"] == "completed", row["error"]
    assert git(happy_repo, "show", "main:feature.txt") == "the feature"  # merged
    subprocess.run(["git", "status"], cwd=happy_repo, check=True, capture_output=True)
    subprocess.run(["git", "commit", "-q", "--allow-empty", "-m", "person"], cwd=happy_repo)
    assert not marker.exists(), marker.read_text()
    assert _git_dir_state(happy_repo) == before
    found = _violations(store, row["id"])
    assert [(v["name"], v["role"]) for v in found] == [("git_dir_violation", "plan")]
    plans = [r["error_kind"] for r in store.agent_runs(row["id"]) if r["role"] == "plan"]
    assert plans == ["git_dir_violation", None]
    shown = phasegate_cli("show", row["id"], "--repo", str(happy_repo)).stdout
    assert "violations (1)" in shown and "git_dir_violation · plan" in shown


@pytest.mark.parametrize("attack", ["system_config", "included_file", "alternates"])
def test_an_unconfined_role_planting_config_outside_the_repository_is_undone(
    happy_repo: Path, engine_for, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attack: str
) -> None:
    # Found by a fresh-user trial: /etc/gitconfig and a file the global config
    # includes were not watched, so a planted fsmonitor (or a filter, run with
    # phasegate's environment) went on running in every git after the workflow.
    script, marker = _marker_script(tmp_path)
    system = tmp_path / "system.gitconfig"
    system.write_text("[user]\n\tname = System\n")
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", str(system))
    included = tmp_path / "included.gitconfig"
    included.write_text("[color]\n\tui = auto\n")
    global_config = Path(os.environ["GIT_CONFIG_GLOBAL"])
    global_config.write_text(f"[include]\n\tpath = {included}\n")
    alternates = happy_repo / ".git" / "objects" / "info" / "alternates"
    target, body = {
        "system_config": (system, f"printf '[core]\\n\\tfsmonitor = {script}\\n' >> {system}"),
        "included_file": (
            included,
            f"printf '[core]\\n\\tfsmonitor = {script}\\n' >> {included}",
        ),
        "alternates": (alternates, f"echo {tmp_path}/no-such-objects > {alternates}"),
    }[attack]
    before = target.read_bytes() if target.exists() else None
    _bind(
        happy_repo,
        "plan",
        f'if [ "$PHASEGATE_CALL_INDEX" = 0 ]; then {body}; fi; echo "1. Write feature.txt"',
    )
    engine, store = engine_for(happy_repo)
    row = land_held(engine, engine.advance(engine.start("t", "ticket")), "git_dir_violation")
    assert row["status"] == "completed", row["error"]
    person = subprocess.run(["git", "status"], cwd=happy_repo, capture_output=True, text=True)
    assert person.returncode == 0 and "error:" not in person.stderr, person.stderr
    assert not marker.exists(), marker.read_text()
    assert (target.read_bytes() if target.exists() else None) == before
    found = _violations(store, row["id"])
    assert [(v["name"], v["role"]) for v in found] == [("git_dir_violation", "plan")]
    assert str(target) in found[0]["paths"] or any(
        str(target).endswith(p) for p in found[0]["paths"]
    ), found


def test_phasegate_git_runs_no_hook_fsmonitor_or_textconv_planted_in_config(
    tmp_path: Path,
) -> None:
    script, marker = _marker_script(tmp_path)
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n", ".gitattributes": "*.txt diff=evil\n"})
    git(repo, "commit", "-q", "--allow-empty", "-m", "second")
    for name in HOOKS:
        (repo / ".git" / "hooks" / name).write_bytes(script.read_bytes())
        (repo / ".git" / "hooks" / name).chmod(0o755)
    git(repo, "config", "core.fsmonitor", str(script))
    git(repo, "config", "diff.evil.textconv", str(script))
    git(repo, "config", "diff.external", str(script))
    marker.unlink(missing_ok=True)  # the test's own git calls above may have run it
    ws = Workspace()
    ws.create_branch(repo, "feature", "main")
    tree = ws.ensure_worktree(repo, "feature", tmp_path / "wt")
    (tree / "a.txt").write_text("changed\n")
    assert "changed" in ws.change_since(tree, "main")
    ws.commit_all(tree, "change")
    assert "+changed" in ws.diff(repo, "main", "feature")
    ws.merge_into_base(repo, "main", "feature", "merge feature")
    with ws.temporary_checkout(repo, ws.rev(repo, "main"), tmp_path / "verify") as checkout:
        assert (checkout / "a.txt").read_text() == "changed\n"
    assert not marker.exists(), marker.read_text()


def test_a_guard_restores_config_hooks_and_refs_it_finds_changed(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    git(repo, "branch", "kept")
    global_config = Path(os.environ["GIT_CONFIG_GLOBAL"])  # the test's own (conftest)
    with guard.watch(repo, "k") as watched:
        git(repo, "config", "--global", "core.sshCommand", "/bin/false")
        git(repo, "config", "core.fsmonitor", "/bin/true")
        (repo / ".git" / "hooks" / "post-commit").write_text("#!/bin/sh\n")
        git(repo, "branch", "-D", "kept")
        git(repo, "branch", "made")
        git(repo, "commit", "-q", "--allow-empty", "-m", "moved")
    proc = subprocess.run(["git", "config", "core.fsmonitor"], cwd=repo, capture_output=True)
    assert proc.returncode == 1  # unset again
    assert not global_config.exists()  # it was not there before
    assert not (repo / ".git" / "hooks" / "post-commit").exists()
    assert git(repo, "branch", "--format=%(refname:short)").split() == ["kept", "main"]
    assert git(repo, "log", "--format=%s", "main") == "initial"
    names = [v.name for v in watched.found]
    assert names == ["ref_violation", "git_dir_violation"]
    assert set(watched.found[0].paths) == {"refs/heads/kept", "refs/heads/made", "refs/heads/main"}
    failed = watched.apply(AgentResult("fine"))
    assert failed.error_kind == "ref_violation" and failed.violations == tuple(watched.found)


def test_phasegate_own_ref_moves_during_a_run_are_not_the_agent_s(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    ws = Workspace()
    ws.create_branch(repo, "other", "main")
    tree = ws.ensure_worktree(repo, "other", tmp_path / "wt")
    with guard.watch(tree, "k") as watched:
        # another workflow's worker, meanwhile: its commit and its merge into the base
        (tree / "b.txt").write_text("b\n")
        ws.commit_all(tree, "other's commit")
        merged = ws.merge_into_base(repo, "main", "other", "merge other")
    assert watched.found == []
    assert git(repo, "rev-parse", "main") == merged


# -- crash safety -----------------------------------------------------------------


def test_a_killed_phasegate_s_guard_journal_is_restored_by_the_next_run(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    base = git(repo, "rev-parse", "main")
    config = (repo / ".git" / "config").read_bytes()
    ready = tmp_path / "ready"
    # A real phasegate process guards an agent run and is killed while it works.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import pathlib, time
                from phasegate.git import guard
                with guard.watch(pathlib.Path({str(repo)!r}), "wf-1", role="build", phase="p"):
                    pathlib.Path({str(ready)!r}).write_text("x")
                    time.sleep(60)
                """
            ),
        ],
        env={**os.environ},
    )
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and child.poll() is None
        time.sleep(0.05)
    # the agent's work, while phasegate runs
    git(repo, "config", "core.hooksPath", str(tmp_path))
    git(repo, "commit", "-q", "--allow-empty", "-m", "agent's")
    git(repo, "branch", "stray")
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert not alive(child.pid)
    assert git(repo, "rev-parse", "main") != base  # left as the agent made it, for now
    recovered = guard.recover(repo, "wf-1")
    assert {(role, v.name) for role, _phase, v in recovered} == {
        ("build", "ref_violation"),
        ("build", "git_dir_violation"),
    }
    assert git(repo, "rev-parse", "main") == base
    assert git(repo, "branch", "--list", "stray") == ""
    assert (repo / ".git" / "config").read_bytes() == config
    assert guard.recover(repo, "wf-1") == []  # once


def test_a_worker_killed_during_an_agent_run_has_its_refs_and_config_restored_on_restart(
    happy_repo: Path, engine_for, tmp_path: Path
) -> None:
    flag, ready = tmp_path / "attacked", tmp_path / "ready"
    _bind(
        happy_repo,
        "build",
        f"if [ ! -e {flag} ]; then touch {flag}; git config core.hooksPath {tmp_path}; "
        f"git branch stray main; touch {ready}; sleep 60; fi; "
        "echo made > feature.txt; echo built",
    )
    config = (happy_repo / ".git" / "config").read_bytes()
    engine, store = engine_for(happy_repo)
    workflow_id = engine.start("t", "ticket")
    worker = subprocess.Popen(
        [str(Path(sys.executable).parent / "phasegate"), "worker", "--repo", str(happy_repo)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline and worker.poll() is None
            time.sleep(0.05)
        os.killpg(worker.pid, signal.SIGKILL)
    finally:
        worker.wait()
    assert git(happy_repo, "branch", "--list", "stray") != ""  # as the agent left it

    row = engine.advance(workflow_id)  # reconciliation first, then the phases

    assert row["status"] == "completed", row["error"]
    assert git(happy_repo, "branch", "--list", "stray") == ""
    assert (happy_repo / ".git" / "config").read_bytes() == config
    notes = [e["data"]["note"] for e in store.events(workflow_id) if e["type"] == "reconciled"]
    assert any(n.startswith("ref_violation of a killed build run undone") for n in notes), notes
    assert any(n.startswith("git_dir_violation of a killed build run") for n in notes), notes


def test_a_graph_role_that_sets_fsmonitor_and_moves_the_base_fails_and_is_undone(
    tmp_path: Path,
) -> None:
    from phasegate.agents.runners.command import CommandRunner
    from phasegate.config.cartridge import Cartridge, RoleBinding
    from phasegate.graph import AgentCall
    from phasegate.phases.graph_mode.harness import RunnerAnswers

    script, marker = _marker_script(tmp_path)
    repo = make_repo(tmp_path / "repo")
    base = git(repo, "rev-parse", "main")
    agent = CommandRunner(
        RoleBinding(
            runner="command",
            command=f"git config core.fsmonitor {script}; "
            "git commit -q --allow-empty -m evil; echo VERDICT: approve",
        )
    )
    role = {"runner": "scripted", "script": "unused.toml"}
    cartridge = Cartridge.model_validate(
        {"roles": {"review": role}, "limits": {"agent_retries": 0}}
    )
    answers = RunnerAnswers(cartridge, repo, "run-1", runners={"review": agent})
    answer = answers(AgentCall("review", "review", "review", "Review it."))
    assert marker.exists()  # the agent's own commit ran it, inside the agent's run
    marker.unlink()
    assert answer.error_kind == "ref_violation"
    assert "refs/heads/main" in (answer.error or "")
    assert git(repo, "rev-parse", "main") == base
    proc = subprocess.run(["git", "config", "core.fsmonitor"], cwd=repo, capture_output=True)
    assert proc.returncode == 1
    subprocess.run(["git", "status"], cwd=repo, check=True, capture_output=True)
    assert not marker.exists()


def test_an_agent_s_own_branch_is_put_back_keeping_its_working_tree_edits(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    ws = Workspace()
    ws.create_branch(repo, "mine", "main")
    tree = ws.ensure_worktree(repo, "mine", tmp_path / "wt")
    start = ws.rev(tree, "HEAD")
    with guard.watch(tree, "k") as watched:
        git(tree, "checkout", "-q", "-b", "elsewhere")
        (tree / "a.txt").write_text("edited\n")
        git(tree, "commit", "-qam", "the agent's own commit")
        (tree / "new.txt").write_text("new\n")
    assert [v.name for v in watched.found] == ["ref_violation"]
    assert git(tree, "symbolic-ref", "--short", "HEAD") == "mine"
    assert ws.rev(tree, "HEAD") == start
    assert git(repo, "branch", "--list", "elsewhere") == ""
    assert (tree / "a.txt").read_text() == "edited\n" and (tree / "new.txt").exists()
    assert git(tree, "status", "--porcelain") == "M a.txt\n?? new.txt"  # index = HEAD


def test_what_phasegate_git_starts_never_sees_a_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A filter driver (git-lfs's kind) still runs in phasegate's git: it gets
    # phasegate's environment without the secret-named variables (fresh-user trial:
    # a filter planted in /etc/gitconfig saw MY_SECRET_TOKEN).
    monkeypatch.setenv("MY_SECRET_TOKEN", "sentinel-secret-value-4711")
    # a role's api_key_env need not say KEY: the engine withholds its value by value
    monkeypatch.setenv("MY_LLM", "llm-secret-value-0815")
    withhold_from_git(["llm-secret-value-0815"])
    seen = tmp_path / "filter-env"
    repo = make_repo(tmp_path / "repo", {".gitattributes": "*.txt filter=probe\n"})
    git(repo, "config", "filter.probe.clean", f"sh -c 'env >> {seen}; cat'")
    ws = Workspace()
    ws.create_branch(repo, "feature", "main")
    tree = ws.ensure_worktree(repo, "feature", tmp_path / "wt")
    (tree / "a.txt").write_text("changed\n")
    ws.commit_all(tree, "change")
    assert seen.exists()  # the filter ran
    assert "sentinel-secret-value-4711" not in seen.read_text()
    assert "MY_SECRET_TOKEN" not in seen.read_text()
    assert "llm-secret-value-0815" not in seen.read_text()


def test_a_nested_repository_in_the_change_never_runs_its_config_and_is_refused(
    happy_repo: Path, engine_for, tmp_path: Path
) -> None:
    # Second fresh-user trial: a build agent made a repository inside its worktree
    # with a filter in its own .git/config; phasegate's `git status` looked inside
    # it to see whether it was dirty and ran the filter, outside any sandbox.
    script, marker = _marker_script(tmp_path)
    evil = (
        "git init -q sub && cd sub && echo '* filter=evil' > .gitattributes && git add -A && "
        "git -c user.name=a -c user.email=a@b commit -qm s && "
        f"git config filter.evil.clean {script} && echo dirty > f && cd .."
    )
    build = (
        f'if [ "$PHASEGATE_CALL_INDEX" = 0 ]; then {evil}; fi; '
        "echo the feature > feature.txt; echo built"
    )
    _bind(happy_repo, "build", build)
    engine, store = engine_for(happy_repo)
    row = land_held(engine, engine.advance(engine.start("t", "ticket")), "git_dir_violation")
    assert row["status"] == "completed", row["error"]
    assert not marker.exists(), marker.read_text()
    assert git(happy_repo, "show", "main:feature.txt") == "the feature"
    assert "sub" not in git(happy_repo, "ls-tree", "--name-only", "main").split()
    found = _violations(store, row["id"])
    assert [(v["name"], v["paths"]) for v in found] == [("git_dir_violation", ["sub"])], found
