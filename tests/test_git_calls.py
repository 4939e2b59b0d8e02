"""Fewer git calls: a demo lifecycle's count stays bounded, and
what phasegate now reads from git's own files (``phasegate.git.files``) instead of
asking git is what git would say, read afresh each time it changes."""

from __future__ import annotations

import collections
import subprocess
import threading
from pathlib import Path

import pytest

from phasegate.agents import make_runner
from phasegate.agents.base import AgentRequest, AgentResult
from phasegate.config.cartridge import load_cartridge
from phasegate.forge.base import ForgeNotFound
from phasegate.forge.local import LocalForge
from phasegate.git import files as _gitfs
from phasegate.git.command import GitCall, changes, git, list_refs, note_change, recording
from phasegate.git.guard import snapshot
from phasegate.git.workspace import Workspace
from phasegate.runtime.engine import Engine
from phasegate.store import Fence, open_store
from phasegate.tools.demo import DEMO_TICKET, DEMO_TITLE, make_sample_project

from conftest import HAPPY_ANSWERS, make_repo, scripted_cartridge
from conftest import git as sh_git

#: One demo lifecycle once made 258 git calls (60 of them the ref ledger's and
#: the worktree lock's own); 34 now (the target: 35), two of them
#: the merge's look for a person's edits in its way before git runs. A status
#: phasegate took of a checkout stands until something may have written it
#: (agents/service.py CheckoutSeen): the self-heal, a read-only role's check before
#: its run and development's look for a dead attempt's leftovers reuse it. The merge
#: gate reads the branch's change once more (one `git diff --raw` in report): 35.
MAX_DEMO_CALLS = 35


def _git_refs(cwd: Path) -> dict[str, str]:
    out = sh_git(cwd, "for-each-ref", "--format=%(refname)%00%(objectname)%00%(symref)")
    refs = {}
    for line in out.splitlines():
        name, sha, symref = line.split("\0")
        refs[name] = f"ref: {symref}" if symref else sha
    return refs


def test_a_demo_lifecycle_stays_within_its_git_call_budget_with_no_ledger_calls(
    tmp_path: Path,
) -> None:
    repo = make_sample_project(tmp_path / "calc")
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    try:
        engine = Engine(repo, cartridge, store)
        with recording() as calls:
            row = engine.advance(engine.start(DEMO_TITLE, DEMO_TICKET))
    finally:
        store.close()
    assert row["status"] == "completed"
    by = collections.Counter(c.subcommand for c in calls)
    assert len(calls) <= MAX_DEMO_CALLS, by
    # the ledger and the guard list refs from the files; repair prunes only what is stale
    assert [c for c in calls if c.bookkeeping] == []
    assert by["for-each-ref"] == 0 and by["symbolic-ref"] == 0
    assert [
        c.args for c in calls if c.args[:2] in (("worktree", "prune"), ("worktree", "list"))
    ] == []


def test_refs_read_from_the_files_equal_for_each_ref_in_the_main_checkout_and_a_worktree(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    sh_git(repo, "branch", "packed")
    sh_git(repo, "-c", "user.name=p", "-c", "user.email=p@l", "tag", "-a", "-m", "t", "v1")
    sh_git(repo, "pack-refs", "--all")
    sh_git(repo, "branch", "-f", "packed", "HEAD")  # loose over packed, same value
    sh_git(repo, "branch", "loose")
    sh_git(repo, "update-ref", "refs/bisect/bad", "HEAD")  # the main checkout's own
    sh_git(repo, "symbolic-ref", "refs/remotes/origin/HEAD", "refs/heads/loose")
    sh_git(repo, "symbolic-ref", "refs/x/dangling", "refs/heads/nowhere")  # git leaves it out
    worktree = tmp_path / "wt"
    sh_git(repo, "worktree", "add", "-q", str(worktree), "loose")
    sh_git(worktree, "update-ref", "refs/worktree/mine", "HEAD")
    (worktree / "f").write_text("x\n")
    sh_git(worktree, "add", "f")
    sh_git(worktree, "-c", "user.name=p", "-c", "user.email=p@l", "commit", "-q", "-m", "f")

    for cwd in (repo, worktree):
        assert list_refs(cwd) == _git_refs(cwd)
    assert "refs/bisect/bad" in list_refs(repo) and "refs/bisect/bad" not in list_refs(worktree)
    assert "refs/worktree/mine" in list_refs(worktree)
    assert "refs/worktree/mine" not in list_refs(repo)


def test_a_ref_file_git_would_not_read_leaves_the_answer_to_git(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    (repo / ".git" / "refs" / "heads" / "broken").write_text("not a sha\n")
    assert _gitfs.read_refs(repo / ".git", repo / ".git") is None
    with recording() as calls:
        refs = list_refs(repo)
    assert [c.subcommand for c in calls] == ["for-each-ref"]
    assert "refs/heads/broken" not in refs and "refs/heads/main" in refs
    (repo / ".git" / "refs" / "heads" / "broken").unlink()
    (repo / ".git" / "refs" / "heads" / "link").symlink_to("main")  # an old-style symref
    assert _gitfs.read_refs(repo / ".git", repo / ".git") is None
    assert list_refs(repo) == _git_refs(repo)


def test_with_git_dir_in_the_environment_only_git_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo")
    monkeypatch.setenv("GIT_DIR", str(repo / ".git"))
    assert _gitfs.locate(repo) is None
    with recording() as calls:
        assert Workspace().rev(repo, "HEAD") == sh_git(repo, "rev-parse", "HEAD")
    assert [c.subcommand for c in calls] == ["rev-parse"]


def test_a_person_switching_branch_is_seen_by_the_next_read(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    ws = Workspace()
    main_tip = ws.rev(repo, "HEAD")
    assert snapshot(repo).branch == "refs/heads/main"
    sh_git(repo, "switch", "-q", "-c", "theirs")
    sh_git(
        repo,
        "-c",
        "user.name=p",
        "-c",
        "user.email=p@l",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "t",
    )
    assert snapshot(repo).branch == "refs/heads/theirs"
    assert ws.rev(repo, "HEAD") == sh_git(repo, "rev-parse", "HEAD") != main_tip
    assert ws.rev(repo, "main") == main_tip
    sh_git(repo, "checkout", "-q", "--detach")
    assert snapshot(repo).branch == ""


def test_a_merge_goes_where_the_base_is_checked_out_now_not_where_it_was(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    ws = Workspace()
    ws.create_branch(repo, "topic", "main")
    worktree = ws.ensure_worktree(repo, "topic", tmp_path / "wt")
    (worktree / "b.txt").write_text("b\n")
    ws.commit_all(worktree, "topic")
    sh_git(repo, "switch", "-q", "-c", "elsewhere")  # the person leaves main meanwhile
    elsewhere = ws.rev(repo, "elsewhere")

    merged = ws.merge_into_base(repo, "main", "topic", "Merge topic")

    assert ws.rev(repo, "main") == merged != elsewhere
    assert ws.rev(repo, "HEAD") == elsewhere  # their checkout untouched
    assert not (repo / "b.txt").exists()


def test_a_worktree_moved_to_another_branch_is_unhealthy_at_the_next_check(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    ws = Workspace()
    ws.create_branch(repo, "topic", "main")
    worktree = ws.ensure_worktree(repo, "topic", tmp_path / "wt")
    assert ws.checkout_problem(worktree, "topic") is None
    sh_git(worktree, "switch", "-q", "-c", "other")
    assert ws.checkout_problem(worktree, "topic") == "HEAD is not topic"
    sh_git(worktree, "switch", "-q", "topic")
    (worktree / "a.txt").unlink()
    assert ws.checkout_problem(worktree, "topic") == "tracked files missing: a.txt"


def test_a_removed_worktree_directory_is_pruned_and_a_healthy_repository_is_not(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    ws = Workspace()
    ws.create_branch(repo, "topic", "main")
    worktree = ws.ensure_worktree(repo, "topic", tmp_path / "wt")
    with recording() as calls:
        ws.repair(repo)
    assert calls == []
    subprocess.run(["rm", "-rf", str(worktree)], check=True)
    with recording() as calls:
        ws.repair(repo)
    assert [c.args for c in calls] == [("worktree", "prune")]
    assert "wt" not in git(["worktree", "list"], repo)


def test_the_guard_asks_git_for_a_hooks_path_only_when_a_config_names_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo")
    (tmp_path / "global").write_text("[user]\n\tname = p\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "global"))
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", "/dev/null")
    with recording() as calls:
        assert snapshot(repo) is not None
    assert calls == []
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "pre-commit").write_text("#!/bin/sh\n")
    sh_git(repo, "config", "core.hooksPath", str(hooks))
    with recording() as calls:
        snap = snapshot(repo)
    assert snap is not None and str(hooks) in snap.dirs
    assert str(hooks / "pre-commit") in snap.files
    assert [c.subcommand for c in calls] == ["config"]


# -- what phasegate saw of a checkout, reused (agents/service.py CheckoutSeen) -------


class _Marking:
    """A runner that notes how many git calls ``calls`` held when each run started
    and ended, then runs ``inner``."""

    def __init__(self, inner, calls: list[GitCall], marks: list[tuple[str, int]]) -> None:
        self.inner, self.calls, self.marks = inner, calls, marks
        self.name = inner.name

    def run(self, request: AgentRequest, cancel, on_spawn=None) -> AgentResult:
        self.marks.append((f"{request.role} start", len(self.calls)))
        try:
            return self.inner.run(request, cancel, on_spawn)
        finally:
            self.marks.append((f"{request.role} end", len(self.calls)))


def test_a_read_only_role_that_edits_after_a_status_phasegate_already_took_is_caught(
    tmp_path: Path, engine_for
) -> None:
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    command = 'runner = "command"\ncommand = "echo sneaky > planted.txt; echo VERDICT: approve"\n'
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(role_overrides={"plan_review": command})
    )
    sh_git(repo, "add", "-A")
    sh_git(repo, "commit", "-qm", "cartridge")
    cartridge = load_cartridge(repo)
    marks: list[tuple[str, int]] = []
    with recording() as calls:
        runners = {
            role: _Marking(make_runner(cartridge.role(role), repo), calls, marks)
            for role in ("plan", "plan_review")
        }
        engine, store = engine_for(repo, runners=runners)
        row = engine.advance(engine.start("t", "ticket"))

    at = dict(reversed(marks))  # each label's first mark
    between = calls[at["plan end"] : at["plan_review start"]]
    # plan's check after its run is plan_review's before: no status of its own
    assert [c.args for c in between] == [("status", "--porcelain", "-uall")]
    assert row["status"] == "failed" and "read_only_violation" in row["error"]
    worktree = Path(row["worktree_path"])
    assert not (worktree / "planted.txt").exists()
    assert sh_git(worktree, "status", "--porcelain", "-uall") == ""
    runs = [r["error_kind"] for r in store.agent_runs(row["id"]) if r["role"] == "plan_review"]
    assert runs == ["read_only_violation"] * 3


def test_a_worktree_broken_between_two_advances_is_healed_by_the_second(
    tmp_path: Path, engine_for
) -> None:
    from phasegate.core import decisions

    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge(auto_merge=False))
    sh_git(repo, "add", "-A")
    sh_git(repo, "commit", "-qm", "cartridge")
    engine, store = engine_for(repo)
    wf = engine.start("t", "ticket")
    row = engine.advance(wf)
    assert (row["current_phase"], row["status"]) == ("wait", "waiting"), row["error"]
    worktree = Path(row["worktree_path"])
    (worktree / "README.md").unlink()  # the person's doing, while the workflow waits
    assert not any(e["type"] == "worktree_healed" for e in store.events(wf))

    engine.decide(wf, lambda ctx: decisions.approve_merge(ctx, "ana"))
    row = engine.advance(wf)
    assert row["status"] == "completed", row["error"]
    assert any(e["type"] == "worktree_healed" for e in store.events(wf))


def test_what_was_seen_of_a_checkout_lapses_at_any_change_and_with_another_lease(
    tmp_path: Path, engine_for
) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n"})
    (repo / "phasegate.toml").write_text(scripted_cartridge())
    other = make_repo(tmp_path / "other")
    engine, store = engine_for(repo)
    agents = engine.agents
    fence = Fence(store, "wf", "me", 1)

    def seen_after(change) -> bool:
        agents.saw("wf", repo, changes(), healthy=True, clean=True)
        assert agents.seen("wf", repo) is not None
        change()
        return agents.seen("wf", repo) is not None

    assert agents.saw("wf", repo, changes(), healthy=True, clean=True) is None
    assert agents.seen("wf", repo) is None  # no lease held: nothing kept
    agents.fences["wf"] = fence
    assert seen_after(lambda: git(["status", "--porcelain"], repo))  # a read
    assert seen_after(lambda: git(["rev-parse", "HEAD"], repo))
    assert not seen_after(lambda: git(["commit", "-q", "--allow-empty", "-m", "e"], repo))
    assert not seen_after(note_change)  # an agent or a check ran
    writer = threading.Thread(target=git, args=(["tag", "t"], other))  # another workflow's
    assert not seen_after(lambda: (writer.start(), writer.join()))
    assert not seen_after(lambda: agents.fences.update(wf=Fence(store, "wf", "me", 2)))
    assert not seen_after(agents.fences["wf"].lost.set)  # the lease is lost
    agents.saw("wf", repo, changes(), healthy=True, clean=True)
    assert agents.seen("wf", tmp_path / "other") is None  # another checkout


def test_a_repository_without_an_origin_remote_is_known_so_without_git(tmp_path: Path) -> None:
    upstream = make_repo(tmp_path / "upstream")
    sh_git(upstream, "branch", "topic")
    clone = tmp_path / "clone"
    sh_git(tmp_path, "clone", "-q", str(upstream), str(clone))
    lone = make_repo(tmp_path / "lone")
    store = open_store(f"sqlite:///{tmp_path / 'state.db'}")
    try:
        with recording() as calls, pytest.raises(ForgeNotFound):
            LocalForge(store, lone, Workspace()).branch_ref("topic")
        assert calls == []
        found = LocalForge(store, clone, Workspace()).branch_ref("topic")
    finally:
        store.close()
    assert found == "refs/remotes/origin/topic"
    assert sh_git(clone, "rev-parse", found) == sh_git(upstream, "rev-parse", "topic")


def test_a_person_s_leftovers_in_the_worktree_between_advances_are_discarded_by_development(
    tmp_path: Path, engine_for
) -> None:
    from phasegate.core import decisions

    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge(auto_merge=False))
    sh_git(repo, "add", "-A")
    sh_git(repo, "commit", "-qm", "cartridge")
    engine, store = engine_for(repo)
    wf = engine.start("t", "ticket")
    row = engine.advance(wf)
    assert (row["current_phase"], row["status"]) == ("wait", "waiting"), row["error"]
    worktree = Path(row["worktree_path"])
    (worktree / "scratch.txt").write_text("the person's\n")  # healthy, not clean

    engine.decide(wf, lambda ctx: decisions.feedback(ctx, "once more"))
    engine.advance(wf)
    discarded = [m for m in store.milestones(wf) if m.kind == "attempt_discarded"]
    assert [m.data["paths"] for m in discarded] == [["scratch.txt"]]
    assert not (worktree / "scratch.txt").exists()
