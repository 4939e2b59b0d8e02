"""Crash and restart acceptance tests (docs/contracts/lifecycle.md: recovery and re-entry).

Everything is real: git repositories, the SQLite state file, the ``phasegate``
console script as a subprocess, and ``command`` agents that are a small Python
script. A worker is SIGKILLed inside each phase, restarted, and must finish the
workflow with exactly one issue, one pull request, one merge and no duplicate
comment: no duplicate issue, PR, comment or merge, whenever the process dies
(docs/contracts/lifecycle.md: journaled side effects).

How each phase is hit:

- agent phases (planning, development, pr_review, acceptance_verification):
  the first call of that phase's role writes a marker and hangs; the test
  SIGKILLs the worker's process group the moment the marker appears. The
  command runner starts agents in a session of their own, so the test kills
  the hanging agent's group too (its pgid is in the marker), as a machine
  crash would.
- preparation, report, merge: the crash hook ``python -m support.crash_worker
  --crash-after METHOD`` dies with ``os._exit`` right after a forge call
  succeeded and before the journal settled its milestone; it is run again
  until the crash lands in the wanted phase.
- wait: the workflow parks in ``waiting`` (auto_merge off for it); the worker
  is SIGKILLed there, the merge is approved, a new worker finishes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from phasegate.config.cartridge import load_cartridge
from phasegate.core.contract import MilestoneView
from phasegate.forge import LocalForge
from phasegate.git.workspace import Workspace
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store
from phasegate.testing import CRASH_EXIT_CODE

from conftest import alive, git, make_repo, phasegate_cli, scripted_cartridge

PHASEGATE = Path(sys.executable).parent / "phasegate"
FEATURE = "the feature\n"
TITLE = "Add the feature file"
TICKET = "Add feature.txt containing 'the feature'."
HANG_S = 30.0  # how long a hanging agent sleeps: far longer than any test waits for it
WAIT_S = 25.0  # bound on every wait for the worker; a test fails with a message after it
ROLES = ("plan", "plan_review", "build", "review", "verification")

# The agent: reads its prompt, edits the worktree when it is the build role,
# records the call (atomically, with its process group), sleeps, answers.
AGENT_SCRIPT = """\
import json, os, sys, time
from pathlib import Path

role = sys.argv[1]
cfg = json.loads(Path(sys.argv[2]).read_text())
sys.stdin.read()
markers = Path(cfg["markers"])
n = len(list(markers.glob(role + "-*"))) + 1
if role == "build":  # edit first: a kill now leaves an uncommitted change behind
    Path("feature.txt").write_text(cfg["feature"])
tmp = markers / f".{role}-{n}.tmp"
tmp.write_text(json.dumps({"pgid": os.getpgid(0), "cwd": os.getcwd()}))
os.replace(tmp, markers / f"{role}-{n}")
hang = cfg["hang_role"] == role and n == 1
time.sleep(cfg["hang_s"] if hang else 0.05)
print(cfg["answers"][role])
"""

T = TypeVar("T")


def wait_until(
    probe: Callable[[], T],
    what: str,
    timeout: float = WAIT_S,
    on_timeout: Callable[[], str] = lambda: "",
) -> T:
    """Poll ``probe`` every 50 ms until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}\n{on_timeout()}")
        time.sleep(0.05)


class Lab:
    """One repository with command agents, and the processes a test starts on it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.repo = make_repo(
            root / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"}
        ).resolve()
        self.markers = root / "markers"
        self.markers.mkdir()
        self.logs = root / "logs"
        self.logs.mkdir()
        self.config = root / "agent.json"
        self.agent = root / "agent.py"
        self.agent.write_text(AGENT_SCRIPT)
        self.db = self.repo / ".phasegate" / "state.db"
        self.workers: list[subprocess.Popen[bytes]] = []
        self.configure()
        argv = [sys.executable, str(self.agent)]
        overrides = {
            role: (
                'runner = "command"\n'
                f"command = {json.dumps(shlex.join(argv + [role, str(self.config)]))}\n"
                "timeout = 60\n"
            )
            for role in ROLES
        }
        (self.repo / "phasegate.toml").write_text(
            scripted_cartridge(checks=["test -f feature.txt"], role_overrides=overrides)
        )
        git(self.repo, "add", "-A")
        git(self.repo, "commit", "-q", "-m", "cartridge")

    # -- set-up -----------------------------------------------------------------

    def configure(self, hang_role: str | None = None, verdict: str = "confirmed") -> None:
        """Which role hangs on its first call, and what the verifier answers."""
        answers = {
            "plan": "1. Write feature.txt containing 'the feature'.",
            "plan_review": "The plan covers the ticket.\nVERDICT: approve",
            "build": "wrote feature.txt",
            "review": "The change is right.\nVERDICT: approve",
            "verification": f"Checked feature.txt on the merge commit.\nVERDICT: {verdict}",
        }
        self.config.write_text(
            json.dumps(
                {
                    "markers": str(self.markers),
                    "feature": FEATURE,
                    "hang_role": hang_role,
                    "hang_s": HANG_S,
                    "answers": answers,
                }
            )
        )

    def start(self, *, auto_merge: bool | None = None) -> str:
        """File a workflow through the Engine API without running it; returns its id."""
        cartridge = load_cartridge(self.repo)
        store = open_store(cartridge.store_url(self.repo))
        try:
            return Engine(self.repo, cartridge, store).start(TITLE, TICKET, auto_merge=auto_merge)
        finally:
            store.close()

    # -- processes --------------------------------------------------------------

    def worker(self) -> subprocess.Popen[bytes]:
        """``phasegate worker`` in a process group of its own, its output in logs/."""
        log = open(self.logs / f"worker-{len(self.workers) + 1}.log", "wb")  # noqa: SIM115
        with log:
            proc = subprocess.Popen(
                [str(PHASEGATE), "worker", "--repo", str(self.repo), "--poll", "0.2"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "COLUMNS": "200"},
            )
        self.workers.append(proc)
        return proc

    def sigkill(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL the worker's whole process group and reap it."""
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGTERM (a clean stop), then SIGKILL if it has not exited within 10 s."""
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.sigkill(proc)

    def kill_agent(self, role: str, call: int) -> None:
        """SIGKILL the process group of a hanging agent call (its own session)."""
        pgid = self.call(role, call)["pgid"]
        cmdline = Path(f"/proc/{pgid}/cmdline")
        # Only a group whose leader is still our agent: never a recycled pgid.
        if pgid != os.getpgid(0) and cmdline.exists() and str(self.agent) in cmdline.read_text():
            with contextlib.suppress(ProcessLookupError):  # exited meanwhile
                os.killpg(pgid, signal.SIGKILL)

    def crash(self, method: str) -> int:
        """One pass of the crash hook; returns its exit code."""
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "support.crash_worker",
                "--repo",
                str(self.repo),
                "--crash-after",
                method,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        with (self.logs / f"crash-{method}.log").open("a") as log:
            log.write(proc.stdout + proc.stderr)
        return proc.returncode

    def cleanup(self) -> None:
        """Kill what the test started."""
        for proc in self.workers:
            if proc.poll() is None:
                self.sigkill(proc)
        for role in ROLES:
            if self.calls(role):  # only a first call can hang
                self.kill_agent(role, 1)

    # -- observation ------------------------------------------------------------

    def calls(self, role: str) -> int:
        """How many times ``role`` has been called."""
        return len(list(self.markers.glob(f"{role}-*")))

    def call(self, role: str, n: int) -> dict[str, Any]:
        return json.loads((self.markers / f"{role}-{n}").read_text())

    def _query(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        # A plain sqlite3 reader, so polling never runs migrations or takes a write lock.
        conn = sqlite3.connect(self.db, timeout=10)
        try:
            return conn.execute(sql, args).fetchall()
        finally:
            conn.close()

    def row(self, workflow_id: str) -> dict[str, Any]:
        columns = ("current_phase", "status", "error", "pr_number", "branch_name", "worktree_path")
        values = self._query(
            f"SELECT {', '.join(columns)} FROM workflows WHERE id = ?", workflow_id
        )[0]
        return dict(zip(columns, values, strict=True))

    def in_progress(self, workflow_id: str) -> list[tuple[str, str]]:
        """(phase, kind) of every milestone left in_progress."""
        return [
            (phase, kind)
            for phase, kind in self._query(
                "SELECT phase, kind FROM milestones WHERE workflow_id = ? "
                "AND status = 'in_progress' ORDER BY id",
                workflow_id,
            )
        ]

    def log_tail(self) -> str:
        parts = []
        for path in sorted(self.logs.iterdir()):
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.name} ---\n{text[-3000:]}")
        return "\n".join(parts)

    # -- driving ----------------------------------------------------------------

    def kill_during(self, role: str, workflow_id: str) -> dict[str, Any]:
        """Start a worker, SIGKILL it while ``role``'s first call runs; the row after."""
        worker = self.worker()
        wait_until(
            lambda: self.calls(role) >= 1 or worker.poll() is not None,
            f"the {role} agent to start",
            on_timeout=self.log_tail,
        )
        assert worker.poll() is None, f"the worker exited early\n{self.log_tail()}"
        self.sigkill(worker)
        self.kill_agent(role, 1)
        return self.row(workflow_id)

    def crash_in(self, method: str, phase: str, workflow_id: str) -> None:
        """Run the crash hook until it dies after ``method`` inside ``phase``."""
        for _ in range(5):
            code = self.crash(method)
            assert code == CRASH_EXIT_CODE, (
                f"the crash hook on {method} exited {code} instead of crashing\n{self.log_tail()}"
            )
            if self.row(workflow_id)["current_phase"] == phase:
                return
        pytest.fail(f"five crashes after {method} and none in {phase}")

    def run_to_completion(self, workflow_id: str) -> None:
        """A fresh worker runs the workflow until it stops moving; it must be completed."""
        worker = self.worker()
        try:
            row = wait_until(
                lambda: (
                    (r := self.row(workflow_id))["status"]
                    in ("completed", "failed", "paused", "planning_timeout")
                    and r
                ),
                f"workflow {workflow_id} to finish",
                on_timeout=self.log_tail,
            )
        finally:
            self.stop(worker)
        assert row["status"] == "completed", f"{row}\n{self.log_tail()}"


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.cleanup()


def _open(repo: Path) -> Store:
    return open_store(load_cartridge(repo).store_url(repo))


def _milestones(repo: Path, workflow_id: str) -> list[MilestoneView]:
    store = _open(repo)
    try:
        return store.milestones(workflow_id)
    finally:
        store.close()


def assert_exactly_once(repo: Path, workflow_id: str) -> None:
    """Completed, with one issue (closed), one PR (merged), one merge commit on main,
    no duplicate comment, no milestone left in_progress, the build's change on main."""
    store = _open(repo)
    try:
        row = store.workflow_row(workflow_id)
        assert (row["current_phase"], row["status"]) == ("completed", "completed"), row["error"]
        forge = LocalForge(store, repo, Workspace())

        issues = forge.issues()
        assert [(i.number, i.state) for i in issues] == [(row["issue_number"], "closed")]

        prs = forge.pull_requests()
        assert len(prs) == 1, prs
        assert (prs[0].number, prs[0].state, prs[0].merge_sha) == (
            row["pr_number"],
            "merged",
            row["merge_sha"],
        )
        assert git(repo, "rev-list", "--merges", "main").split() == [row["merge_sha"]]

        markers = [c["marker"] for c in forge.comment_rows()]
        assert markers and None not in markers
        assert sorted({m for m in markers if markers.count(m) > 1}) == []

        stuck = [
            (m.phase, m.kind) for m in store.milestones(workflow_id) if m.status == "in_progress"
        ]
        assert stuck == []
    finally:
        store.close()
    assert git(repo, "show", "main:feature.txt") + "\n" == FEATURE
    worktrees = [
        line
        for line in git(repo, "worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]
    assert worktrees == [f"worktree {repo}"], "a checkout was left behind"


# -- 1. SIGKILL inside each phase, restart, completed ---------------------------------


@dataclass(frozen=True)
class Crash:
    phase: str
    role: str | None = None  # SIGKILL the worker while this role's agent runs
    method: str | None = None  # or: the crash hook dies after this forge method
    journaled: str | None = None  # the milestone the crash leaves in_progress


CRASHES = (
    Crash("preparation", method="create_issue", journaled="issue_created"),
    Crash("planning", role="plan"),
    Crash("development", role="build"),
    Crash("pr_review", role="review"),
    Crash("report", method="comment", journaled="comment_posted"),
    Crash("wait"),
    Crash("merge", method="merge_pull_request", journaled="merge_completed"),
    Crash("acceptance_verification", role="verification", journaled="acceptance_verification"),
)


@pytest.mark.slow
@pytest.mark.parametrize("crash", CRASHES, ids=lambda c: c.phase)
def test_sigkill_inside_each_phase_then_restart_completes_exactly_once(
    lab: Lab, crash: Crash
) -> None:
    lab.configure(hang_role=crash.role)
    workflow_id = lab.start(auto_merge=False if crash.phase == "wait" else None)

    if crash.role:
        row = lab.kill_during(crash.role, workflow_id)
        assert row["current_phase"] == crash.phase, row
        if crash.phase == "development":  # the killed build left its edit uncommitted
            worktree = Path(lab.call("build", 1)["cwd"])
            assert git(worktree, "status", "--porcelain") == "?? feature.txt"
    elif crash.method:
        lab.crash_in(crash.method, crash.phase, workflow_id)
    else:  # wait: park, die while parked, approve, restart
        worker = lab.worker()
        wait_until(
            lambda: lab.row(workflow_id)["status"] == "waiting",
            "the workflow to wait",
            on_timeout=lab.log_tail,
        )
        time.sleep(0.3)  # at least one more poll of the parked workflow
        lab.sigkill(worker)
        assert lab.row(workflow_id)["current_phase"] == "wait"
        approved = phasegate_cli(
            "approve-merge",
            workflow_id,
            "--by",
            "alice",
            "--no-advance",
            "--repo",
            str(lab.repo),
            timeout=30,
        )
        assert approved.returncode == 0, approved.stderr

    if crash.journaled:
        # The crash hit between the side effect and its settlement.
        assert (crash.phase, crash.journaled) in lab.in_progress(workflow_id)

    lab.run_to_completion(workflow_id)
    assert_exactly_once(lab.repo, workflow_id)
    if crash.role:
        assert lab.calls(crash.role) == 2  # the killed call, then one rerun
    if crash.method:
        # The restart found the effect the dead process made instead of repeating it.
        summaries = [
            m.summary
            for m in _milestones(lab.repo, workflow_id)
            if (m.phase, m.kind) == (crash.phase, crash.journaled)
        ]
        assert any(s.endswith("(found after restart)") for s in summaries), summaries
    if crash.phase == "wait":
        approvals = [
            m.summary for m in _milestones(lab.repo, workflow_id) if m.kind == "merge_approved"
        ]
        assert approvals == ["alice"]


# -- 2. Faults seen in public reports -------------------------------------------------


@pytest.mark.slow
def test_leftover_directory_at_the_worktree_path_does_not_block_preparation(lab: Lab) -> None:
    workflow_id = lab.start()
    leftover = lab.repo / ".phasegate" / "worktrees" / workflow_id
    (leftover / "src").mkdir(parents=True)
    (leftover / "junk.txt").write_text("left by a dead process\n")
    (leftover / "src" / "half_written.py").write_text("def f(:\n")
    (leftover / ".git").write_text("gitdir: /nonexistent/.git/worktrees/gone\n")

    result = phasegate_cli("worker", "--once", "--repo", str(lab.repo), timeout=60)
    assert result.returncode == 0, result.stderr

    ready = [m for m in _milestones(lab.repo, workflow_id) if m.kind == "worktree_ready"]
    assert [(m.status, m.data["path"]) for m in ready] == [("completed", str(leftover))]
    assert_exactly_once(lab.repo, workflow_id)
    tracked = git(lab.repo, "ls-tree", "-r", "--name-only", "main").split()
    assert "junk.txt" not in tracked and "src/half_written.py" not in tracked


# A git reference-transaction hook that SIGKILLs the process group of the git
# command running it (the worker's, which has a session of its own) once the
# workflow branch is deleted for good: right after merge's cleanup, before
# merge commits. Armed by a file, it fires once, and never in the test's group.
# A git on PATH that SIGKILLs the worker's process group once, right after its
# own `git branch -D phasegate/...` succeeded (phasegate's git runs no hook, so
# the kill point is a wrapper, not a reference-transaction hook).
KILL_AFTER_BRANCH_DELETE = """\
#!{python}
import json, os, signal, subprocess, sys
from pathlib import Path

done = subprocess.run([{real!r}, *sys.argv[1:]]).returncode
arm = Path({arm!r})
args = sys.argv[1:]
while args[:1] == ["-c"]:
    args = args[2:]
deleted = args[:2] == ["branch", "-D"] and any(a.startswith("phasegate/") for a in args)
if done == 0 and deleted and arm.exists():
    cfg = json.loads(arm.read_text())
    if os.getpgid(0) != cfg["test_pgid"]:
        arm.unlink()
        os.killpg(os.getpgid(0), signal.SIGKILL)
sys.exit(done)
"""


@pytest.mark.slow
def test_sigkill_after_the_merge_removed_its_branch_and_worktree_still_completes(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pull request is merged and its branch and worktree are gone on
    # purpose, but the workflow row still says merge: the restart must not
    # try to "heal" the worktree from a branch that was meant to go.
    arm = lab.root / "arm.json"
    arm.write_text(json.dumps({"test_pgid": os.getpgid(0)}))
    wrapper = lab.root / "bin" / "git"
    wrapper.parent.mkdir()
    script = KILL_AFTER_BRANCH_DELETE.format(
        python=sys.executable, arm=str(arm), real=shutil.which("git")
    )
    wrapper.write_text(script)
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    workflow_id = lab.start()

    worker = lab.worker()
    wait_until(
        lambda: worker.poll() is not None, "the hook to kill the worker", on_timeout=lab.log_tail
    )
    assert worker.returncode == -signal.SIGKILL and not arm.exists(), lab.log_tail()
    row = lab.row(workflow_id)
    assert (row["current_phase"], row["status"]) == ("merge", "merging")
    assert not Path(row["worktree_path"]).exists()
    assert git(lab.repo, "branch", "--list", row["branch_name"]) == ""

    lab.run_to_completion(workflow_id)
    assert_exactly_once(lab.repo, workflow_id)


@pytest.mark.slow
def test_crash_right_after_the_pull_request_is_created_gives_one_pull_request(
    lab: Lab,
) -> None:
    workflow_id = lab.start()
    lab.crash_in("create_pull_request", "pr_review", workflow_id)
    # The PR exists on the forge, but the workflow row never learned its number.
    assert lab.row(workflow_id)["pr_number"] is None
    assert ("pr_review", "pr_created") in lab.in_progress(workflow_id)
    store = _open(lab.repo)
    try:
        assert len(LocalForge(store, lab.repo, Workspace()).pull_requests()) == 1
    finally:
        store.close()

    lab.run_to_completion(workflow_id)
    assert_exactly_once(lab.repo, workflow_id)


@pytest.mark.slow
def test_branch_failure_after_the_issue_was_created_does_not_create_a_second_issue(
    lab: Lab,
) -> None:
    # A ref named ``phasegate`` makes every ``phasegate/<id>-...`` branch impossible.
    blocker = lab.repo / ".git" / "refs" / "heads" / "phasegate"
    blocker.write_text(git(lab.repo, "rev-parse", "main") + "\n")

    ran = phasegate_cli(
        "run", "--json", "--repo", str(lab.repo), TICKET, "--title", TITLE, timeout=60
    )
    assert ran.returncode == 1, ran.stdout + ran.stderr
    summary = json.loads(ran.stdout)
    workflow_id = summary["id"]
    assert (summary["current_phase"], summary["status"]) == ("preparation", "failed")

    shown = phasegate_cli("show", workflow_id, "--repo", str(lab.repo), timeout=30)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "reason: preparation: GitError: git branch phasegate/" in text, shown.stdout
    assert "'refs/heads/phasegate' exists" in text, shown.stdout

    store = _open(lab.repo)
    try:
        kinds = {m.kind: m.status for m in store.milestones(workflow_id)}
        assert kinds["issue_created"] == "completed"
        assert kinds["branch_created"] == "failed"
        assert len(LocalForge(store, lab.repo, Workspace()).issues()) == 1
    finally:
        store.close()

    blocker.unlink()
    resumed = phasegate_cli("resume", workflow_id, "--json", "--repo", str(lab.repo), timeout=60)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "completed"
    assert_exactly_once(lab.repo, workflow_id)


@pytest.mark.slow
def test_the_merge_never_closes_the_issue_only_a_confirmed_verification_does(
    lab: Lab,
) -> None:
    lab.configure(verdict="rejected")
    workflow_id = lab.start()

    result = phasegate_cli("worker", "--once", "--repo", str(lab.repo), timeout=60)
    assert result.returncode == 0, result.stderr
    row = lab.row(workflow_id)
    assert (row["current_phase"], row["status"]) == ("acceptance_verification", "paused")
    assert "acceptance verification rejected" in row["error"]
    assert len(git(lab.repo, "rev-list", "--merges", "main").split()) == 1
    store = _open(lab.repo)
    try:
        forge = LocalForge(store, lab.repo, Workspace())
        assert [i.state for i in forge.issues()] == ["open"]  # merged, yet still open
        assert [pr.state for pr in forge.pull_requests()] == ["merged"]
    finally:
        store.close()

    override = phasegate_cli(
        "verify-override",
        workflow_id,
        "--verdict",
        "confirmed",
        "--by",
        "alice",
        "--repo",
        str(lab.repo),
        timeout=30,
    )
    assert override.returncode == 0, override.stdout + override.stderr

    shown = phasegate_cli("show", workflow_id, "--json", "--repo", str(lab.repo), timeout=30)
    assert shown.returncode == 0, shown.stderr
    detail = json.loads(shown.stdout)
    assert detail["workflow"]["status"] == "completed"
    verdicts = [
        (m["data"].get("verdict"), m["data"].get("verified_by"))
        for m in detail["milestones"]
        if m["kind"] == "acceptance_verification"
    ]
    assert verdicts == [("rejected", "verifier"), ("confirmed", "alice")]
    assert_exactly_once(lab.repo, workflow_id)


@pytest.mark.slow
def test_an_agent_dies_with_its_sigkilled_worker_and_the_restart_finishes(lab: Lab) -> None:
    """Only the phasegate process is SIGKILLed: the agent's supervisor sees its
    parent die and stops the agent, so nothing edits the worktree unwatched;
    the restart settles the agent's milestone and finishes the workflow."""
    lab.configure(hang_role="build")
    workflow_id = lab.start()
    worker = lab.worker()
    wait_until(lambda: lab.calls("build") >= 1, "the build agent to start", on_timeout=lab.log_tail)
    pgid = lab.call("build", 1)["pgid"]  # the agent's supervisor leads its group
    members = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _pgid(p) == pgid]
    assert len(members) >= 2, "the supervisor and the agent should both be running"
    os.kill(worker.pid, signal.SIGKILL)  # phasegate only, not its process group
    worker.wait(timeout=10)
    wait_until(
        lambda: not any(alive(int(p.name)) and _pgid(p) == pgid for p in members),
        "the agent to die with its worker",
        timeout=5,
    )
    assert ("development", "agent_process") in lab.in_progress(workflow_id)

    lab.run_to_completion(workflow_id)
    store = _open(lab.repo)
    try:
        notes = [e["data"]["note"] for e in store.events(workflow_id) if e["type"] == "reconciled"]
    finally:
        store.close()
    assert f"orphaned agent (pgid {pgid}): already gone" in notes, notes
    assert_exactly_once(lab.repo, workflow_id)


def _pgid(proc_dir: Path) -> int | None:
    """The process group of /proc/PID, None once it is gone."""
    try:
        return int((proc_dir / "stat").read_text().rsplit(")", 1)[-1].split()[2])
    except OSError:
        return None
