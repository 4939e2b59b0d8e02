"""Re-entering development after a crash (docs/contracts/lifecycle.md: recovery and re-entry).

The rule under test: the change on the base is exactly what the recorded
attempts produced. The build agent is a real ``command`` agent that appends one
line to ``log.txt`` on every run, so the merged file must hold one line per
attempt whose output was kept (``phases.attempts.account_build_runs``: a commit
trailer names its agent run), and every other ``ok`` build run must be named by
an ``attempt_discarded`` milestone.

Everything is real: git, the SQLite file, ``phasegate worker`` processes killed
with SIGKILL (their whole process group), and a crash runner that dies with
``os._exit`` (as a SIGKILL would) right before or after a named Workspace call
of the development phase.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from phasegate.config.cartridge import load_cartridge
from phasegate.phases.attempts import ATTEMPT_TRAILER, account_build_runs
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store

from conftest import git, land_held, make_repo, phasegate_cli, scripted_cartridge

ROLES = ("plan", "plan_review", "build", "review", "verification")
PHASEGATE = Path(sys.executable).parent / "phasegate"
WAIT_S = 40.0  # bound on every wait for a worker; a test fails with the logs after it
T = TypeVar("T")
LINE = "one line per build run"
TITLE = "Append to the log"
CRASH_EXIT = 137
#: Statuses a workflow stops moving in (with auto_merge; without it, waiting too).
STOPPED = ("completed", "failed", "paused", "planning_timeout")

# Every role: reads its prompt (kept in prompts/), the build appends LINE to
# log.txt first (a kill while it sleeps leaves the edit uncommitted), records
# the call with its process group, sleeps as configured, answers.
AGENT_SCRIPT = """\
import json, os, sys, time
from pathlib import Path

role = sys.argv[1]
cfg = json.loads(Path(sys.argv[2]).read_text())
prompt = sys.stdin.read()
markers = Path(cfg["markers"])
n = len(list(markers.glob(role + "-*"))) + 1
(Path(cfg["prompts"]) / f"{role}-{n}.txt").write_text(prompt)
if role == "build":
    readme = Path("README.md")
    if "<<<<<<<" in readme.read_text():  # the base sync left a conflict to resolve
        readme.write_text("resolved\\n")
    elif f"build-{n}" in cfg["readme"]:
        readme.write_text(cfg["readme"][f"build-{n}"])
    with open("log.txt", "a") as log:
        log.write(cfg["line"] + "\\n")
    if f"build-{n}" in cfg["revert"] or "build" in cfg["revert"]:  # a change and its revert
        import subprocess
        for args in (["add", "-A"], ["commit", "-qm", "a line"], ["revert", "--no-edit", "HEAD"]):
            subprocess.run(["git", *args], check=True, capture_output=True)
tmp = markers / f".{role}-{n}.tmp"
tmp.write_text(json.dumps({"pgid": os.getpgid(0), "cwd": os.getcwd()}))
os.replace(tmp, markers / f"{role}-{n}")
time.sleep(cfg["sleep"].get(f"{role}-{n}", 0.05))
answers = cfg["answers"][role]
print(answers[min(n, len(answers)) - 1])
"""

# A check that, while armed, SIGKILLs the worker's process group (its pgid is in
# the arm file) after leaving a file behind in the worktree: the kill lands
# right after the attempt's commit, inside the checks.
KILLING_CHECK = """\
import json, os, signal, time
from pathlib import Path

arm = Path({arm!r})
if arm.exists():
    pgid = json.loads(arm.read_text())["pgid"]
    arm.unlink()
    Path("check-leftover.txt").write_text("left by the checks\\n")
    os.killpg(pgid, signal.SIGKILL)
    time.sleep(5)
"""

# One worker pass that dies (os._exit, like SIGKILL) right before or after the
# nth (default: first) call of a Workspace method: argv = repo, method, before|after[, n].
CRASH_RUNNER = """\
import os, sys
from pathlib import Path

from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import open_store
from phasegate.git.workspace import Workspace

repo, method, when = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
nth = int(sys.argv[4]) if len(sys.argv) > 4 else 1
real = getattr(Workspace, method)
calls = []


def crashing(self, *args, **kwargs):
    calls.append(method)
    if len(calls) < nth:
        return real(self, *args, **kwargs)
    if when == "before":
        os._exit(137)
    real(self, *args, **kwargs)
    os._exit(137)


class Crashing(Workspace):
    pass


setattr(Crashing, method, crashing)
cartridge = load_cartridge(repo)
store = open_store(cartridge.store_url(repo))
Engine(repo, cartridge, store, workspace=Crashing()).run_worker(once=True)
sys.exit(3)
"""


def wait_until(probe: Callable[[], T], what: str, on_timeout: Callable[[], str] = lambda: "") -> T:
    """Poll ``probe`` every 50 ms until it returns something truthy; fail after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not (value := probe()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {WAIT_S:g}s waiting for {what}\n{on_timeout()}")
        time.sleep(0.05)
    return value


class Lab:
    """One repository whose roles are the appending command agent."""

    def __init__(
        self,
        root: Path,
        *,
        extra: str = "",
        checks: list[str] | None = None,
        auto_merge: bool | None = True,
        profile: str | None = None,
    ) -> None:
        self.root = root
        self.repo = make_repo(
            root / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"}
        ).resolve()
        self.markers = root / "markers"
        self.prompts = root / "prompts"
        self.logs = root / "logs"
        for path in (self.markers, self.prompts, self.logs):
            path.mkdir()
        self.config = root / "agent.json"
        self.agent = root / "agent.py"
        self.agent.write_text(AGENT_SCRIPT)
        self.arm = root / "arm.json"
        self.check = root / "check.py"
        self.check.write_text(KILLING_CHECK.format(arm=str(self.arm)))
        self.runner = root / "crash_runner.py"
        self.runner.write_text(CRASH_RUNNER)
        self.workers: list[subprocess.Popen[bytes]] = []
        self.configure()
        argv = [sys.executable, str(self.agent)]
        overrides = {
            role: (
                'runner = "command"\n'
                f"command = {json.dumps(shlex.join([*argv, role, str(self.config)]))}\n"
                "timeout = 60\n"
            )
            for role in ROLES
        }
        (self.repo / "phasegate.toml").write_text(
            scripted_cartridge(
                checks=checks
                if checks is not None
                else ["test -f log.txt", shlex.join([sys.executable, str(self.check)])],
                role_overrides=overrides,
                extra=extra,
                auto_merge=auto_merge,
                profile=profile,
            )
        )
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-q", "-m", "cartridge")

    def configure(
        self,
        *,
        sleep: dict[str, float] | None = None,
        answers: dict[str, list[str]] | None = None,
        readme: dict[str, str] | None = None,
        revert: tuple[str, ...] = (),
    ) -> None:
        """How long each call sleeps (``"build-1": 30``), what each role answers
        (a list: call n gets item n, the last item after that) and what a build
        call writes to README.md besides its line (``"build-1": "text"``); the build
        calls in ``revert`` (``"build-1"``, or ``"build"`` for all) commit their
        change and then its revert."""
        defaults = {
            "plan": ["1. Append a line to log.txt."],
            "plan_review": ["The plan covers the ticket.\nVERDICT: approve"],
            "build": ["appended a line to log.txt"],
            "review": ["The change is right.\nVERDICT: approve"],
            "verification": ["Checked log.txt on the merge commit.\nVERDICT: confirmed"],
        }
        self.config.write_text(
            json.dumps(
                {
                    "markers": str(self.markers),
                    "prompts": str(self.prompts),
                    "line": LINE,
                    "sleep": sleep or {},
                    "readme": readme or {},
                    "revert": list(revert),
                    "answers": {**defaults, **(answers or {})},
                }
            )
        )

    def start(self) -> str:
        store = self.store()
        try:
            engine = Engine(self.repo, load_cartridge(self.repo), store)
            return engine.start(TITLE, "Append one line to log.txt.")
        finally:
            store.close()

    def store(self) -> Store:
        return open_store(load_cartridge(self.repo).store_url(self.repo))

    # -- processes --------------------------------------------------------------

    def worker(self) -> subprocess.Popen[bytes]:
        log = open(self.logs / f"worker-{len(self.workers) + 1}.log", "wb")  # noqa: SIM115
        with log:
            proc = subprocess.Popen(
                [str(PHASEGATE), "worker", "--repo", str(self.repo), "--poll", "0.2"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.workers.append(proc)
        return proc

    def sigkill(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def kill_agent(self, role: str, call: int) -> None:
        """SIGKILL a hanging agent's own process group, as a machine crash would."""
        pgid = json.loads((self.markers / f"{role}-{call}").read_text())["pgid"]
        cmdline = Path(f"/proc/{pgid}/cmdline")
        if pgid != os.getpgid(0) and cmdline.exists() and str(self.agent) in cmdline.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)

    def crash(self, method: str, when: str, nth: int = 1) -> int:
        proc = subprocess.run(
            [sys.executable, str(self.runner), str(self.repo), method, when, str(nth)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        (self.logs / f"crash-{method}-{when}.log").write_text(proc.stdout + proc.stderr)
        return proc.returncode

    def settle(self, workflow_id: str, until: tuple[str, ...] = STOPPED) -> dict[str, Any]:
        """A fresh worker runs the workflow until its status is in ``until``; the row."""
        worker = self.worker()
        try:
            return wait_until(
                lambda: (r := self.row(workflow_id))["status"] in until and r,
                f"workflow {workflow_id} to stop moving",
                on_timeout=self.log_tail,
            )
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGTERM)
                try:
                    worker.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.sigkill(worker)

    def cleanup(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                self.sigkill(proc)
        for marker in self.markers.glob("build-*"):
            self.kill_agent("build", int(marker.name.split("-")[1]))

    # -- observation ------------------------------------------------------------

    def row(self, workflow_id: str) -> dict[str, Any]:
        store = self.store()
        try:
            return store.workflow_row(workflow_id)
        finally:
            store.close()

    def calls(self, role: str) -> int:
        return len(list(self.markers.glob(f"{role}-*")))

    def prompt(self, role: str, n: int) -> str:
        return (self.prompts / f"{role}-{n}.txt").read_text()

    def milestones(self, workflow_id: str, kind: str) -> list[Any]:
        store = self.store()
        try:
            return [m for m in store.milestones(workflow_id) if m.kind == kind]
        finally:
            store.close()

    def accounting(self, workflow_id: str, rev: str) -> dict[str, list[int]]:
        store = self.store()
        try:
            return account_build_runs(store, self.repo, workflow_id, rev)
        finally:
            store.close()

    def log_tail(self) -> str:
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.logs.iterdir())
        )


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.cleanup()


def assert_base_holds_exactly_the_recorded_attempts(lab: Lab, workflow_id: str) -> list[int]:
    """Completed and merged; log.txt on the base has one line per kept attempt and
    every ok build run is accounted for. Returns the kept agent run ids."""
    row = lab.row(workflow_id)
    assert (row["current_phase"], row["status"]) == ("completed", "completed"), (
        f"{row['error']}\n{lab.log_tail()}"
    )
    merged = row["merge_sha"]
    lines = git(lab.repo, "show", f"{merged}:log.txt").splitlines()
    accounting = lab.accounting(workflow_id, merged)
    assert accounting["unaccounted"] == [], accounting
    assert lines == [LINE] * len(accounting["kept"]), (lines, accounting)
    tracked = git(lab.repo, "ls-tree", "-r", "--name-only", merged).split()
    assert "check-leftover.txt" not in tracked
    return accounting["kept"]


@pytest.mark.slow
def test_a_build_killed_mid_edit_is_discarded_and_the_base_holds_one_line(lab: Lab) -> None:
    lab.configure(sleep={"build-1": 30.0})
    workflow_id = lab.start()
    worker = lab.worker()
    wait_until(lambda: lab.calls("build") >= 1, "the first build to start", on_timeout=lab.log_tail)
    lab.sigkill(worker)
    lab.kill_agent("build", 1)
    worktree = Path(lab.row(workflow_id)["worktree_path"])
    assert git(worktree, "status", "--porcelain") == "?? log.txt"  # the half-made attempt

    lab.settle(workflow_id)

    kept = assert_base_holds_exactly_the_recorded_attempts(lab, workflow_id)
    assert lab.calls("build") == 2 and len(kept) == 1
    discarded = lab.milestones(workflow_id, "attempt_discarded")
    assert [(m.round, m.attempt, m.data["paths"]) for m in discarded] == [(1, 1, ["log.txt"])]
    assert discarded[0].data["agent_runs"] == []  # killed before its run was recorded
    assert len(discarded[0].data["diff_sha256"]) == 64


@pytest.mark.slow
def test_a_kill_right_after_the_commit_recognises_it_and_never_builds_on_it_again(
    lab: Lab,
) -> None:
    workflow_id = lab.start()
    worker = lab.worker()
    lab.arm.write_text(json.dumps({"pgid": worker.pid}))
    wait_until(lambda: worker.poll() is not None, "the check to kill the worker")
    assert not lab.arm.exists(), lab.log_tail()
    row = lab.row(workflow_id)
    assert row["current_phase"] == "development", row
    worktree = Path(row["worktree_path"])
    head_message = git(worktree, "log", "-1", "--format=%B")
    assert f"{ATTEMPT_TRAILER}: {workflow_id}/d1/a1/" in head_message
    assert "check-leftover.txt" in git(worktree, "status", "--porcelain")

    lab.settle(workflow_id)

    kept = assert_base_holds_exactly_the_recorded_attempts(lab, workflow_id)
    assert lab.calls("build") == 1 and len(kept) == 1  # the agent never ran again
    tests_run = lab.milestones(workflow_id, "tests_run")
    assert [m.data["recognised_after_restart"] for m in tests_run] == [True]
    assert lab.milestones(workflow_id, "attempt_discarded") == []


CRASH_POINTS = (
    # (method, when, build runs, kept, discarded): the build is asked again only
    # when the attempt died before its commit.
    ("commit_all", "before", 2, 1, 1),  # the run recorded ok, its edit uncommitted
    ("commit_all", "after", 1, 1, 0),  # committed, its phase result not
    ("run_checks", "after", 1, 1, 0),  # the checks ran and left files behind
    ("discard_changes", "after", 1, 1, 0),  # the checks' leftovers gone, no result
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "when", "runs", "kept", "discarded"),
    CRASH_POINTS,
    ids=[f"{m}-{w}" for m, w, *_ in CRASH_POINTS],
)
def test_a_crash_at_each_point_of_an_attempt_leaves_the_base_with_the_recorded_attempts(
    lab: Lab, method: str, when: str, runs: int, kept: int, discarded: int
) -> None:
    workflow_id = lab.start()
    for _ in range(3):  # the first passes may end in planning before the crash point
        code = lab.crash(method, when)
        if code == CRASH_EXIT:
            break
        assert code == 0, lab.log_tail()
    assert code == CRASH_EXIT, lab.log_tail()
    assert lab.row(workflow_id)["current_phase"] == "development"

    lab.settle(workflow_id)

    assert len(assert_base_holds_exactly_the_recorded_attempts(lab, workflow_id)) == kept
    assert lab.calls("build") == runs
    gone = lab.milestones(workflow_id, "attempt_discarded")
    assert sum(len(m.data["agent_runs"]) for m in gone) == discarded
    if discarded:
        assert gone[0].data["paths"] == ["log.txt"]


@pytest.mark.slow
def test_a_base_sync_left_half_done_by_a_crash_is_undone_and_merged_again(
    tmp_path: Path,
) -> None:
    # The last check refuses the conflict fork's resolution (phases/conflict.py), never
    # a build's commit: the child fails its 3 attempts and ci reverts to planning.
    checks = [
        "test -f log.txt",
        shlex.join([sys.executable, str(tmp_path / "check.py")]),
        "! git log -1 --format=%B | grep -q Phasegate-Conflict",
    ]
    lab = Lab(tmp_path, auto_merge=False, profile="ci", checks=checks)
    try:
        _base_sync_crash(lab)
    finally:
        lab.cleanup()


def _base_sync_crash(lab: Lab) -> None:
    lab.configure(readme={"build-1": "the branch's readme\n"})
    workflow_id = lab.start()
    assert lab.settle(workflow_id, (*STOPPED, "waiting"))["status"] == "waiting", lab.log_tail()
    (lab.repo / "README.md").write_text("main's readme\n")
    git(lab.repo, "commit", "-qam", "a conflicting readme on main")
    approve = ("approve-merge", workflow_id, "--by", "alice", "--no-advance")
    assert phasegate_cli(*approve, "--repo", str(lab.repo)).returncode == 0
    # The merge conflicts, its child fails (3 base merges, 3 builds), ci reverts to
    # planning with sync_base; the next build's start_base_merge (the 4th) leaves
    # README.md in conflict, and the process dies there.
    assert lab.crash("start_base_merge", "after", nth=4) == CRASH_EXIT, lab.log_tail()
    row = lab.row(workflow_id)
    worktree = Path(row["worktree_path"])
    assert (row["current_phase"], row["dev_round"]) == ("development", 2)
    assert git(worktree, "rev-parse", "-q", "--verify", "MERGE_HEAD")
    assert lab.calls("build") == 4

    assert lab.settle(workflow_id, (*STOPPED, "waiting"))["status"] == "waiting", lab.log_tail()
    gone = lab.milestones(workflow_id, "attempt_discarded")
    assert [(m.round, m.data["merge_in_progress"], m.data["agent_runs"]) for m in gone] == [
        (2, True, [])
    ]
    assert phasegate_cli(*approve, "--repo", str(lab.repo)).returncode == 0
    lab.settle(workflow_id)

    assert len(assert_base_holds_exactly_the_recorded_attempts(lab, workflow_id)) == 2
    assert git(lab.repo, "show", "main:README.md") == "resolved"
    assert lab.calls("build") == 5


# -- an empty net change ------------------------------------------------------------


@pytest.mark.slow
def test_a_build_agent_s_own_commit_and_revert_is_undone_and_its_retry_builds_it(
    tmp_path: Path,
) -> None:
    # phasegate makes the attempt's commit; an agent's own commits on
    # its branch are a ref_violation (undone), so a net-empty pair of commits never
    # reaches development's change accounting: the call is retried like a failed one.
    lab = Lab(tmp_path, checks=["true"])
    try:
        lab.configure(revert=("build-1",))
        workflow_id = lab.start()

        held = lab.settle(workflow_id, until=(*STOPPED, "waiting"))
        # The undone commits are a violation of the round: its merge waits for a person.
        assert held["status"] == "waiting", lab.log_tail()
        assert held["state"]["merge_hold"]["violations"][0]["name"] == "ref_violation"
        approve = phasegate_cli("approve-merge", workflow_id, "--repo", str(lab.repo))
        assert approve.returncode == 0, approve.stdout + approve.stderr

        row = lab.settle(workflow_id)
        assert row["status"] == "completed", lab.log_tail()
        assert git(lab.repo, "show", f"{row['merge_sha']}:log.txt").splitlines() == [LINE]
        assert "a line" not in git(lab.repo, "log", "--format=%s", row["merge_sha"])
        assert _build_error_kinds(lab, workflow_id) == ["ref_violation", None]
        assert lab.calls("build") == 2
    finally:
        lab.cleanup()


@pytest.mark.slow
def test_a_build_agent_that_always_commits_itself_never_merges(tmp_path: Path) -> None:
    lab = Lab(tmp_path, extra="[limits]\nmax_dev_retries = 1\n", checks=["true"])
    try:
        lab.configure(revert=("build",))
        workflow_id = lab.start()

        row = lab.settle(workflow_id)

        assert (row["current_phase"], row["status"]) == ("development", "failed"), lab.log_tail()
        assert "ref_violation" in row["error"]
        assert git(lab.repo, "rev-list", "--merges", "main") == ""
        assert lab.milestones(workflow_id, "pr_reviewed") == []
        assert _build_error_kinds(lab, workflow_id) == ["ref_violation"] * 3
    finally:
        lab.cleanup()


def _build_error_kinds(lab: Lab, workflow_id: str) -> list[str | None]:
    store = lab.store()
    try:
        return [r["error_kind"] for r in store.agent_runs(workflow_id) if r["role"] == "build"]
    finally:
        store.close()


def test_a_discarded_change_holding_a_key_is_accounted_for_without_keeping_the_key(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-live-leaked-424242"
    monkeypatch.setenv("SERVICE_API_KEY", secret)
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(
        '[[plan]]\ntext = "1. Write config.txt"\n[[plan_review]]\ntext = "VERDICT: approve"\n'
        f'[[build]]\ntext = "wrote config"\n[build.files]\n"config.txt" = "key = {secret}\\n"\n'
        '[[build]]\ntext = "wrote config"\n[build.files]\n"config.txt" = "key = from env\\n"\n'
        '[[review]]\ntext = "VERDICT: approve"\n[[verification]]\ntext = "VERDICT: confirmed"\n'
    )
    (repo / "phasegate.toml").write_text(scripted_cartridge())
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    engine, store = engine_for(repo)

    row = land_held(engine, engine.advance(engine.start("t", "ticket")), "secret_in_change")

    assert row["status"] == "completed", row["error"]
    accounting = account_build_runs(store, repo, row["id"], row["merge_sha"])
    (gone,) = [m for m in store.milestones(row["id"]) if m.kind == "attempt_discarded"]
    assert (gone.data["paths"], gone.data["diff"]) == (["config.txt"], "")
    assert accounting["discarded"] == gone.data["agent_runs"] and len(accounting["kept"]) == 1
    assert accounting["unaccounted"] == []
    stored = b"".join(f.read_bytes() for f in (repo / ".phasegate").glob("state.db*"))
    assert stored and secret.encode() not in stored
