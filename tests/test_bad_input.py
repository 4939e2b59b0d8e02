"""Bad input gets a clear error and loses nothing.

A malformed cartridge, an unknown workflow id, an agent that crashes, hangs
or answers garbage, a patch that reaches outside its worktree, checks that
never pass, a forge that times out: each ends in a bounded, explained stop
(exit code 1 or 2 and the reason in `show`), never a traceback, a duplicate
or a file written where it should not be.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from phasegate.config.cartridge import load_cartridge
from phasegate.forge import ForgeError, LocalForge
from phasegate.git.workspace import PatchError, Workspace
from phasegate.runtime.engine import Engine
from phasegate.store import open_store
from phasegate.testing import FlakyForge

from conftest import (
    HAPPY_ANSWERS,
    alive,
    git,
    make_repo,
    phasegate_cli,
    scripted_cartridge,
)


def flat(text: str) -> str:
    """The text with every run of whitespace made one space (the console wraps lines)."""
    return " ".join(text.split())


def make_project(tmp_path: Path, answers: str = HAPPY_ANSWERS, **cartridge: Any) -> Path:
    """A committed repository whose cartridge binds the roles to ``answers`` (or overrides)."""
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(answers)
    (repo / "phasegate.toml").write_text(scripted_cartridge(**cartridge))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


def toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a valid TOML basic string


def run_json(repo: Path, ticket: str = "Add the feature") -> tuple[int, dict[str, Any], str]:
    """``phasegate run --json``: exit code, the summary, stderr."""
    proc = phasegate_cli("run", "--repo", str(repo), "--json", ticket)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def show_json(repo: Path, workflow_id: str) -> dict[str, Any]:
    proc = phasegate_cli("show", workflow_id, "--repo", str(repo), "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def show_text(repo: Path, workflow_id: str) -> str:
    proc = phasegate_cli("show", workflow_id, "--repo", str(repo))
    assert proc.returncode == 0, proc.stderr
    return flat(proc.stdout)


def runs_of(detail: dict[str, Any], role: str) -> list[dict[str, Any]]:
    return [r for r in detail["agent_runs"] if r["role"] == role]


def kinds(detail: dict[str, Any]) -> list[str]:
    return [m["kind"] for m in detail["milestones"]]


# -- a malformed cartridge -----------------------------------------------------------

CARTRIDGE_FAULTS = {
    "unknown_key": (
        {"extra": "[limits]\nmax_plan_round = 3\n"},
        ["limits.max_plan_round: unknown key"],
    ),
    "wrong_type": (
        {"extra": '[limits]\nmax_plan_rounds = "three"\n'},
        ["limits.max_plan_rounds:", "valid integer"],
    ),
    "command_runner_without_command": (
        {"role_overrides": {"build": 'runner = "command"\ntimeout = 5\n'}},
        ["roles.build:", "needs a `command`"],
    ),
    "invalid_toml": (
        {"extra": "[limits]\nmax_plan_rounds = = 3\n"},
        ["phasegate.toml: not valid TOML"],
    ),
}


@pytest.mark.parametrize("fault", CARTRIDGE_FAULTS)
def test_a_malformed_cartridge_stops_work_with_exit_2_naming_the_key(
    tmp_path: Path, fault: str
) -> None:
    settings, expected = CARTRIDGE_FAULTS[fault]
    repo = make_project(tmp_path, **settings)
    head = git(repo, "rev-parse", "HEAD")
    cartridge_path = str(repo / "phasegate.toml")

    acting = (["run", "--repo", str(repo), "the ticket"], ["worker", "--once", "--repo", str(repo)])
    for args in acting:
        proc = phasegate_cli(*args)
        message = flat(proc.stderr)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert cartridge_path in message  # the file ...
        for part in expected:  # ... and the key
            assert part in message, message

    # Nothing was created: no state, no branch, no commit, no worktree.
    assert not (repo / ".phasegate").exists()
    assert git(repo, "branch", "--format=%(refname:short)") == "main"
    assert git(repo, "rev-parse", "HEAD") == head
    # looking still works, and says what is wrong
    looking = phasegate_cli("status", "--repo", str(repo), "--json")
    assert looking.returncode == 0 and json.loads(looking.stdout) == []
    assert all(part in flat(looking.stderr) for part in expected)
    (repo / "phasegate.toml").write_text(scripted_cartridge())
    listed = phasegate_cli("status", "--repo", str(repo), "--json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == []


# -- an agent that fails ---------------------------------------------------------------


def test_an_agent_that_exits_non_zero_is_retried_then_the_workflow_fails(
    tmp_path: Path,
) -> None:
    crash = 'runner = "command"\ncommand = "echo the agent crashed >&2; exit 3"\ntimeout = 30\n'
    repo = make_project(
        tmp_path, extra="[limits]\nagent_retries = 2\n", role_overrides={"build": crash}
    )
    code, summary, _ = run_json(repo)
    assert code == 1
    assert (summary["current_phase"], summary["status"]) == ("development", "failed")

    detail = show_json(repo, summary["id"])
    error = detail["workflow"]["error"]
    assert error.startswith("build agent failed 3 time(s)")
    assert "exit_code" in error and "exited with code 3" in error and "crashed" in error
    builds = runs_of(detail, "build")
    assert len(builds) == 2 + 1
    assert {(r["outcome"], r["error_kind"]) for r in builds} == {("failed", "exit_code")}
    # Nothing before it was lost: the plan is still there for a resume.
    assert "plan_finalized" in kinds(detail)
    assert [m["status"] for m in detail["milestones"] if m["kind"] == "dev_failed"] == ["failed"]
    text = show_text(repo, summary["id"])
    assert f"reason: {flat(error)}" in text


@pytest.mark.parametrize(
    ("role", "phase", "good"),
    [
        ("review", "pr_review", "VERDICT: approve"),
        ("plan_review", "planning", "VERDICT: approve"),
    ],
)
def test_a_review_role_that_answers_garbage_stops_at_the_cap_and_pauses_resumably(
    tmp_path: Path, role: str, phase: str, good: str
) -> None:
    # A command reviewer whose answer a person can fix: it prints a file outside the repository.
    answer = tmp_path / "answer.txt"
    answer.write_text("Looks fine to me.\n")
    binding = f'runner = "command"\ncommand = {toml_string(f"cat {answer}")}\ntimeout = 30\n'
    repo = make_project(
        tmp_path,
        extra="[limits]\nagent_retries = 4\nmax_review_parse_failures = 2\n",
        role_overrides={role: binding},
    )
    code, summary, _ = run_json(repo)
    assert code == 1
    # Capped as the verifier is: two unreadable answers, not agent_retries + 1 = 5, then a
    # pause a person resumes, never a failed workflow.
    assert (summary["current_phase"], summary["status"]) == (phase, "paused")
    detail = show_json(repo, summary["id"])
    reason = detail["workflow"]["error"]
    assert reason.startswith(f"{role} gave no verdict it could read"), reason
    assert "limits.max_review_parse_failures = 2" in reason
    assert f"{role} agent failed 2 time(s); last: garbage: no verdict" in reason
    assert f"roles.{role}" in reason and "phasegate resume" in reason
    runs = runs_of(detail, role)
    assert [(r["outcome"], r["error_kind"]) for r in runs] == [("garbage", "garbage")] * 2
    assert f"reason: {flat(reason)}" in show_text(repo, summary["id"])

    answer.write_text(f"{good}\n")
    resumed = phasegate_cli("resume", summary["id"], "--repo", str(repo), "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"
    detail = show_json(repo, summary["id"])
    assert [r["outcome"] for r in runs_of(detail, role)] == ["garbage", "garbage", "ok"]


def test_garbage_then_a_good_answer_recovers_and_completes(tmp_path: Path) -> None:
    answers = HAPPY_ANSWERS.replace(
        '[[review]]\ntext = "VERDICT: approve"',
        '[[review]]\ntext = "I would rather not say."\n[[review]]\ntext = "VERDICT: approve"',
    )
    repo = make_project(tmp_path, answers)
    code, summary, _ = run_json(repo)
    assert code == 0
    assert summary["status"] == "completed"
    detail = show_json(repo, summary["id"])
    assert [r["outcome"] for r in runs_of(detail, "review")] == ["garbage", "ok"]
    assert detail["workflow"]["error"] is None
    assert "feature.txt" in git(repo, "ls-tree", "--name-only", "main")


# The agent records its pid and its child's, then sleeps; one variant's child ignores
# SIGTERM, as agent CLIs' helpers sometimes do, and still holds the agent's stdout.
HANGS = {
    "sleeps": "sleep 120 & echo $! >> {pids}; echo $$ >> {pids}; wait",
    "child_ignores_sigterm": (
        "(trap '' TERM; exec sleep 120) & echo $! >> {pids}; echo $$ >> {pids}; wait"
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hang", "role", "phase", "status"),
    [
        ("sleeps", "build", "development", "failed"),
        ("sleeps", "plan", "planning", "planning_timeout"),
        ("child_ignores_sigterm", "build", "development", "failed"),
    ],
)
def test_an_agent_that_hangs_is_killed_at_its_timeout(
    tmp_path: Path, role: str, phase: str, status: str, hang: str
) -> None:
    pids = tmp_path / "agent.pids"
    command = HANGS[hang].format(pids=pids)
    binding = f'runner = "command"\ncommand = {toml_string(command)}\ntimeout = 1\n'
    repo = make_project(
        tmp_path, extra="[limits]\nagent_retries = 1\n", role_overrides={role: binding}
    )
    started = time.monotonic()
    code, summary, _ = run_json(repo)
    elapsed = time.monotonic() - started

    assert code == 1
    assert (summary["current_phase"], summary["status"]) == (phase, status)
    # Two tries of 1 s each, and at most the 2 s SIGTERM grace each: never the 120 s
    # sleep (one try left to sleep would alone take 120 s; the rest of the run is slack
    # for a loaded machine, where the whole workflow has taken 42 s).
    assert elapsed < 110, elapsed
    recorded = [int(p) for p in pids.read_text().split()]
    assert len(recorded) == 2 * 2  # two tries, two processes each
    assert not [pid for pid in recorded if alive(pid)]

    detail = show_json(repo, summary["id"])
    error = detail["workflow"]["error"]
    assert error.startswith(f"{role} agent failed 2 time(s); last: timeout: no answer within 1s")
    runs = runs_of(detail, role)
    assert len(runs) == 1 + 1
    assert {r["error_kind"] for r in runs} == {"timeout"}
    assert all(r["duration_s"] < 5 for r in runs)
    assert f"reason: {flat(error)}" in show_text(repo, summary["id"])


# -- patches ------------------------------------------------------------------------------

PATCHES = {
    "climbs_out": (
        "--- /dev/null\n+++ b/../outside.txt\n@@ -0,0 +1 @@\n+escaped\n",
        "reaches outside its worktree: ../outside.txt",
    ),
    "climbs_to_the_repository": (
        "--- /dev/null\n+++ b/../../../outside.txt\n@@ -0,0 +1 @@\n+escaped\n",
        "reaches outside its worktree: ../../../outside.txt",
    ),
    "absolute": (
        "--- /dev/null\n+++ {tmp}/outside.txt\n@@ -0,0 +1 @@\n+escaped\n",
        "reaches outside its worktree: {tmp}/outside.txt",
    ),
    "renames_out": (
        "diff --git a/README.md b/README.md\nsimilarity index 100%\n"
        "rename from README.md\nrename to ../outside.txt\n",
        "does not apply",
    ),
    "does_not_apply": (
        "--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-# not what is there\n+# changed\n",
        "the patch does not apply",
    ),
}


def files_outside_state(root: Path) -> set[Path]:
    """Every path under ``root`` except git's and phasegate's own directories."""
    return {
        p for p in root.rglob("*") if not {".git", ".phasegate"} & set(p.relative_to(root).parts)
    }


@pytest.mark.parametrize("case", PATCHES)
def test_a_bad_build_patch_writes_nothing_and_fails_clearly(tmp_path: Path, case: str) -> None:
    patch, expected = (part.format(tmp=tmp_path) for part in PATCHES[case])
    answers = (
        '[[plan]]\ntext = "1. patch it"\n[[plan_review]]\ntext = "VERDICT: approve"\n'
        f'[[build]]\ntext = "patched"\npatch = {toml_string(patch)}\n'
        '[[review]]\ntext = "VERDICT: approve"\n[[verification]]\ntext = "VERDICT: confirmed"\n'
    )
    repo = make_project(tmp_path, answers, extra="[limits]\nagent_retries = 1\n")
    before = files_outside_state(tmp_path)

    code, summary, _ = run_json(repo)
    assert code == 1
    assert (summary["current_phase"], summary["status"]) == ("development", "failed")
    detail = show_json(repo, summary["id"])
    error = detail["workflow"]["error"]
    assert error.startswith("build agent failed 2 time(s); last: invalid_patch:"), error
    assert expected in error
    assert {r["error_kind"] for r in runs_of(detail, "build")} == {"invalid_patch"}

    # No file outside the worktree, and none in it: the worktree is as preparation left it.
    assert files_outside_state(tmp_path) == before
    worktree = repo / ".phasegate" / "worktrees" / summary["id"]
    for outside in (
        tmp_path / "outside.txt",
        repo / "outside.txt",
        repo / ".phasegate" / "outside.txt",
        repo / ".phasegate" / "worktrees" / "outside.txt",
    ):
        assert not outside.exists(), outside
    assert git(worktree, "status", "--porcelain") == ""
    assert git(worktree, "rev-parse", "HEAD") == git(repo, "rev-parse", "main")
    assert (repo / "README.md").read_text() == "# sample\n"


def test_a_patch_missing_its_final_newline_still_applies(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"README.md": "one\ntwo\n"})
    patch = "--- a/README.md\n+++ b/README.md\n@@ -1,2 +1,2 @@\n one\n-two\n+three"
    new_file = "--- /dev/null\n+++ b/notes/new.txt\n@@ -0,0 +1 @@\n+new"
    # git itself refuses both: the final newline is what Workspace.apply_patch adds.
    for raw in (patch, new_file):
        assert git_apply_check(repo, raw) != 0
    assert Workspace().apply_patch(repo, patch) == ["README.md"]
    assert Workspace().apply_patch(repo, new_file) == ["notes/new.txt"]
    assert (repo / "README.md").read_text() == "one\nthree\n"
    assert (repo / "notes" / "new.txt").read_text() == "new\n"


def test_a_patch_that_does_not_apply_changes_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"a.txt": "a\n", "b.txt": "b\n"})
    # The first file would apply; the second does not: neither may be changed.
    patch = (
        "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-a\n+A\n"
        "--- a/b.txt\n+++ b/b.txt\n@@ -1 +1 @@\n-not b\n+B\n"
    )
    with pytest.raises(PatchError, match="does not apply"):
        Workspace().apply_patch(repo, patch)
    assert (repo / "a.txt").read_text() == "a\n"
    assert git(repo, "status", "--porcelain") == ""
    with pytest.raises(PatchError, match="empty"):
        Workspace().apply_patch(repo, "  \n")


def git_apply_check(repo: Path, patch: str) -> int:
    return subprocess.run(
        ["git", "apply", "--check", "-"], cwd=repo, input=patch, capture_output=True, text=True
    ).returncode


# -- checks that never pass ------------------------------------------------------------------

# Check output is arbitrary text: brackets in it are not console markup. The shell
# computes 42, so "assert 42 == 41" is in the output, not in the command.
CHECK_OUTPUT = "FAILED test_feature [100%]: [roles.build] wrote [/tmp/nowhere]"


def test_checks_failing_every_round_stay_bounded(tmp_path: Path) -> None:
    check = f"echo '{CHECK_OUTPUT}' \"assert $((40 + 2)) == 41\"; exit 1"
    repo = make_project(tmp_path, checks=[check], extra="[limits]\nmax_dev_retries = 2\n")
    code, summary, _ = run_json(repo)
    assert code == 1
    # paused, not failed: the default profile (review) leaves re-planning to a person
    assert (summary["current_phase"], summary["status"]) == ("development", "paused")

    detail = show_json(repo, summary["id"])
    tests_run = [m for m in detail["milestones"] if m["kind"] == "tests_run"]
    assert [(m["attempt"], m["status"]) for m in tests_run] == [
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
    ]
    assert len(runs_of(detail, "build")) == 3  # one build per attempt, no more
    error = detail["workflow"]["error"]
    assert error.startswith("checks still failing after 3 attempt(s)")
    assert f"{CHECK_OUTPUT} assert 42 == 41" in error and "exit code 1" in error
    assert "pr_created" not in kinds(detail)
    assert f"reason: {flat(error)}" in show_text(repo, summary["id"])


# -- an unknown workflow id ------------------------------------------------------------------

UNKNOWN = "0badf00d"


@pytest.mark.parametrize(
    "args",
    [
        ["show", UNKNOWN],
        ["show", UNKNOWN, "--json"],
        ["resume", UNKNOWN],
        ["feedback", UNKNOWN, "more tests please"],
        ["approve-merge", UNKNOWN],
        ["verify-override", UNKNOWN, "--verdict", "confirmed", "--by", "ana"],
    ],
    ids=["show", "show-json", "resume", "feedback", "approve-merge", "verify-override"],
)
def test_an_unknown_workflow_id_is_a_clear_error(happy_repo: Path, args: list[str]) -> None:
    proc = phasegate_cli(*args, "--repo", str(happy_repo))
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert f"no workflow with id '{UNKNOWN}'" in flat(proc.stderr)
    listed = phasegate_cli("status", "--repo", str(happy_repo), "--json")
    assert json.loads(listed.stdout) == []


# -- a forge that times out ---------------------------------------------------------------------


class LateTimeoutForge:
    """Wraps a forge whose ``method`` does its work, then times out on our side once."""

    def __init__(self, inner: Any, method: str) -> None:
        self.inner, self.method, self.failures = inner, method, 1

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name != self.method:
            return attr

        def late(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            if self.failures:
                self.failures -= 1
                raise ForgeError(f"{name}: timed out (after the forge did it)")
            return result

        return late


@pytest.mark.parametrize("when", ["before_the_effect", "after_the_effect"])
def test_a_forge_that_times_out_fails_the_workflow_and_resume_completes(
    happy_repo: Path, when: str
) -> None:
    cartridge = load_cartridge(happy_repo)
    store = open_store(cartridge.store_url(happy_repo))
    try:
        workspace = Workspace()
        local = LocalForge(store, happy_repo, workspace)
        flaky = (
            FlakyForge(local, "create_pull_request", failures=1)
            if when == "before_the_effect"
            else LateTimeoutForge(local, "create_pull_request")
        )
        engine = Engine(happy_repo, cartridge, store, forge=flaky, workspace=workspace)
        workflow_id = engine.start("Add the feature", "the ticket")
        row = engine.advance(workflow_id)
        assert (row["current_phase"], row["status"]) == ("pr_review", "failed")
        assert "create_pull_request: timed out" in row["error"]
        assert row["pr_number"] is None
        assert len(local.pull_requests()) == (1 if when == "after_the_effect" else 0)
    finally:
        store.close()

    shown = phasegate_cli("show", workflow_id, "--repo", str(happy_repo))
    assert "create_pull_request: timed out" in flat(shown.stdout)

    resumed = phasegate_cli("resume", workflow_id, "--repo", str(happy_repo), "--json")
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["status"] == "completed"

    store = open_store(cartridge.store_url(happy_repo))
    try:
        prs = LocalForge(store, happy_repo, Workspace()).pull_requests()
        assert len(prs) == 1
        assert (prs[0].number, prs[0].state) == (summary["pr_number"], "merged")
        created = [m for m in store.milestones(workflow_id) if m.kind == "pr_created"]
        assert [m.status for m in created] == ["completed"]
    finally:
        store.close()
    assert git(happy_repo, "rev-list", "--count", "--merges", "main") == "1"


def test_output_that_is_not_utf8_is_read_not_fatal(tmp_path: Path) -> None:
    reviewer = (
        'runner = "command"\ncommand = "printf \'Caf\\\\351 ok\\\\nVERDICT: approve\\\\n\'"\n'
    )
    repo = make_project(
        tmp_path,
        role_overrides={"review": reviewer},
        checks=["printf 'bytes \\377\\376 ok\\n'"],
    )
    code, summary, err = run_json(repo)
    assert code == 0, err
    assert summary["status"] == "completed"
    detail = show_json(repo, summary["id"])
    review = [m for m in detail["milestones"] if m["kind"] == "pr_reviewed"][0]
    assert review["data"]["comments"].startswith("Caf\ufffd ok")
    tests_run = [m for m in detail["milestones"] if m["kind"] == "tests_run"][0]
    assert "\ufffd" in tests_run["data"]["checks"][0]["output"]


@pytest.mark.parametrize(
    "fault", ["no_commits", "bad_base_branch", "missing_script", "missing_cli", "unset_key"]
)
def test_what_would_fail_after_filing_is_refused_before_filing(tmp_path: Path, fault: str) -> None:
    if fault == "no_commits":
        repo = tmp_path / "repo"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        (repo / "answers.toml").write_text(HAPPY_ANSWERS)
        (repo / "phasegate.toml").write_text(scripted_cartridge())
        expected = "has no commits yet"
    elif fault == "bad_base_branch":
        repo = make_project(tmp_path)
        text = (repo / "phasegate.toml").read_text().replace('"main"', '"nope"')
        (repo / "phasegate.toml").write_text(text)
        expected = "workflow.base_branch: 'nope' is not a branch"
    elif fault == "missing_cli":
        repo = make_project(
            tmp_path,
            role_overrides={"build": 'runner = "claude-code"\nexecutable = "/nope/claude"\n'},
        )
        expected = "roles.build.executable: the claude-code program `/nope/claude` is not found"
    elif fault == "unset_key":
        repo = make_project(
            tmp_path,
            role_overrides={
                "review": 'runner = "command"\ncommand = "true"\napi_key_env = "NOPE_API_KEY"\n'
            },
        )
        expected = "roles.review.api_key_env: $NOPE_API_KEY is not set"
    else:
        repo = make_project(tmp_path)
        (repo / "answers.toml").unlink()
        expected = "answers.toml: cannot read scripted answers"
    proc = phasegate_cli("run", "--repo", str(repo), "the ticket")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in flat(proc.stderr)
    status = phasegate_cli("status", "--repo", str(repo), "--json")
    assert json.loads(status.stdout) == []  # nothing was filed


def test_the_state_directory_is_excluded_from_git_without_init(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n"})  # no .gitignore
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge())
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    code, summary, err = run_json(repo)
    assert code == 0 and summary["status"] == "completed", err
    assert git(repo, "status", "--porcelain") == ""
