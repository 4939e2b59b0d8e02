"""The random kill-torture harness: whole workflows SIGKILLed at random moments.

One **trial** (``run_trial(root, seed)``) builds a fresh repository whose
cartridge binds every role to a ``command`` agent (a small Python script that
really edits files, sleeping small random amounts), under a profile that
merges unattended (``full-auto``). It files one workflow, then starts
``phasegate worker`` and sends 1–3 SIGKILLs at moments drawn from the seed:

- uniformly at random within the time an uninterrupted run takes, or
- aimed at a window: a journaled side effect written ``in_progress`` but not
  yet settled, a ``git`` process of the workflow running, the merge phase,
  acceptance verification, an agent running;

each kill either to the phasegate process alone (its agents, checks and git
children are orphaned, as when only the worker is OOM-killed) or to every
process of the trial (a machine crash). After the last kill a new worker
runs until the workflow settles, and the invariants are checked
(``Violation`` kinds in brackets):

- the workflow completed, as an uninterrupted run does [``not_completed``];
- exactly 1 issue, 1 pull request and 1 merge of the branch on the base
  [``issues``, ``pull_requests``, ``merges``]; no comment marker twice
  [``duplicate_comment``]; no milestone left ``in_progress`` [``in_progress``];
- no process of the trial alive once the worker stopped [``process_alive``];
- no git lock, no worktree but the person's, no scratch or half-made
  checkout left [``git_lock``, ``worktree_left``];
- the change on the base is exactly what the recorded attempts produced: the
  build agent appends one line per run, so the base holds one well-formed line
  per build run phasegate recorded as ``ok`` and kept, less the runs whose
  output it discarded as evidence [``change``];
- the base's checks pass [``base_checks``]; the person's repository still works
  (``git status``, ``git branch -D``) [``repository``].

A seed replays a trial's plan (its kill moments, kinds and the agents'
sleeps); timing on a busy machine still varies, so a violation is reported
with its seed and the trial's directory is kept for reading.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "KillPlan",
    "Trial",
    "Violation",
    "plan_kills",
    "run_trial",
    "run_uninterrupted",
    "trial_mode",
]

#: How a kill is aimed: at a random moment, or at the first moment a window opens.
AIMS = ("random", "journal_window", "git", "merge", "verification", "agent", "apply_arm")
#: Whom a kill hits: the phasegate worker alone, or every process of the trial.
TARGETS = ("phasegate", "everything")

SETTLE_S = 90.0  # bound on the last worker's run to a settled workflow
WINDOW_S = 20.0  # how long an aimed kill waits for its window before firing anyway
TERMINAL = ("completed", "failed", "paused", "planning_timeout")  # full-auto never waits

# The agents: read the prompt, sleep a little, answer; the build role appends one
# line in two writes with a sleep between, so a kill can leave half a line behind.
AGENT_SCRIPT = """\
import hashlib, json, os, random, sys, time
from pathlib import Path

role, config = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
prompt = sys.stdin.read()
rng = random.Random(f"{config['seed']}:{role}:{time.time_ns()}")
time.sleep(rng.uniform(0, config["max_sleep_s"]))
if role == "build":
    token = hashlib.sha1(os.urandom(8)).hexdigest()[:10]
    with open("changes.txt", "a") as out:
        out.write(f"run-{token}")
        out.flush()
        time.sleep(rng.uniform(0, config["max_sleep_s"]))
        out.write(" ok\\n")
    time.sleep(rng.uniform(0, config["max_sleep_s"]))
print(config["answers"][role])
"""

# The project's own test: every line of changes.txt is one whole line an agent wrote.
CHECK_SCRIPT = """\
import re, sys
from pathlib import Path

lines = Path("changes.txt").read_text().splitlines(keepends=True)
bad = [line for line in lines if not re.fullmatch(r"run-[0-9a-f]{10} ok\\n", line)]
if not lines or bad:
    sys.exit(f"changes.txt: {len(lines)} line(s), malformed: {bad[:3]!r}")
"""

ANSWERS = {
    "plan": "1. Append one line to changes.txt.",
    "plan_review": "The plan covers the ticket.\nVERDICT: approve",
    "build": "appended one line to changes.txt",
    "review": "The change is right.\nVERDICT: approve",
    "verification": "changes.txt holds the line on the merge commit.\nVERDICT: confirmed",
}
ROLES = tuple(ANSWERS)
_START_LOCK = threading.Lock()
TITLE = "Append one line to changes.txt"
TICKET = "Append one line to changes.txt; check_changes.py must pass."


@dataclass(frozen=True)
class KillPlan:
    """One kill: when (seconds after its worker started, for ``random``), how it is
    aimed, and whom it hits."""

    at_s: float
    aim: str
    target: str
    before_claim: bool = False  # a random kill while the worker is still starting up


@dataclass(frozen=True)
class Violation:
    kind: str
    detail: str


@dataclass
class Trial:
    """What one trial did and found."""

    seed: int
    root: Path
    mode: str = "classic"
    kills: list[dict[str, Any]] = field(default_factory=list)
    resumes: int = 0
    status: str = ""
    violations: list[Violation] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations


def plan_kills(seed: int, span_s: float) -> list[KillPlan]:
    """1–3 kills for trial ``seed``: moments uniform in [0, ``span_s``] seconds (the
    length of an uninterrupted run), aims and targets drawn from the seed."""
    rng = random.Random(seed)
    return [
        KillPlan(
            at_s=rng.uniform(0.0, span_s),
            aim=rng.choice(AIMS) if rng.random() < 0.5 else "random",
            target=rng.choice(TARGETS),
            before_claim=rng.random() < 0.1,
        )
        for _ in range(rng.randint(1, 3))
    ]


# -- processes of a trial ---------------------------------------------------------


def trial_processes(root: Path) -> list[int]:
    """Every live process whose working directory is inside ``root`` (the trial's
    repository, worktrees and scratch checkouts), this one excepted."""
    found = []
    prefix = str(root.resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue  # gone, or not ours to read
        if state not in ("Z", "X") and (cwd == prefix or cwd.startswith(prefix + "/")):
            found.append(int(entry.name))
    return found


def _kill_all(root: Path, worker: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL every process of the trial, as a machine crash would, until none is left."""
    if worker is not None:
        with contextlib.suppress(ProcessLookupError):
            worker.kill()
    for _ in range(50):
        pids = trial_processes(root)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    if worker is not None:
        worker.wait(timeout=10)


# -- the lab ------------------------------------------------------------------------


class _Lab:
    def __init__(self, root: Path, seed: int, max_sleep_s: float, mode: str = "classic") -> None:
        self.mode = mode
        self.root = root.resolve()
        self.repo = self.root / "repo"
        self.db = self.repo / ".phasegate" / "state.db"
        self.logs = self.root / "logs"
        self.workers = 0
        self.logs.mkdir(parents=True, exist_ok=True)
        config = self.root / "agent.json"
        config.write_text(
            json.dumps({"seed": seed, "max_sleep_s": max_sleep_s, "answers": ANSWERS})
        )
        agent = self.root / "agent.py"
        agent.write_text(AGENT_SCRIPT)
        if mode == "graph":
            self._make_graph_repo()
        else:
            self._make_repo(agent, config)
        self.base_commits = len(self._git("rev-list", "main").split())

    def _make_graph_repo(self) -> None:
        """The demo's sample project through the development graph (scripted agents, a
        build answering with a diff), under full-auto: the apply arm lands the patch."""
        from phasegate.demo import make_sample_project

        make_sample_project(self.repo, graph=True)
        cartridge = self.repo / "phasegate.toml"
        cartridge.write_text(
            cartridge.read_text().replace('profile = "auto"', 'profile = "full-auto"', 1)
        )
        self._git("add", "-A")
        self._git(
            "-c", "user.name=person", "-c", "user.email=person@localhost",
            "commit", "-q", "-m", "full-auto",
        )  # fmt: skip

    def _git(self, *args: str, cwd: Path | None = None) -> str:
        return subprocess.run(
            ["git", *args], cwd=cwd or self.repo, check=True, capture_output=True, text=True
        ).stdout.strip()

    def _make_repo(self, agent: Path, config: Path) -> None:
        self.repo.mkdir(parents=True)
        (self.repo / "README.md").write_text("# torture sample\n")
        (self.repo / ".gitignore").write_text(".phasegate/\n__pycache__/\n")
        (self.repo / "check_changes.py").write_text(CHECK_SCRIPT)
        roles = "\n".join(
            f'[roles.{role}]\nrunner = "command"\ntimeout = 60\ncommand = '
            + json.dumps(shlex.join([sys.executable, str(agent), role, str(config)]))
            + "\n"
            for role in ROLES
        )
        (self.repo / "phasegate.toml").write_text(
            '[workflow]\nbase_branch = "main"\nprofile = "full-auto"\n\n'
            f'[landing_areas]\nchecks = ["{sys.executable} check_changes.py"]\n'
            "check_timeout = 60\n\n" + roles
        )
        self._git("init", "-q", "-b", "main")
        self._git("add", "-A")
        self._git(
            "-c", "user.name=person", "-c", "user.email=person@localhost",
            "commit", "-q", "-m", "initial",
        )  # fmt: skip

    def start_workflow(self) -> str:
        """File the workflow through the Engine API without running it; returns its id."""
        from phasegate.cartridge import load_cartridge
        from phasegate.engine import Engine
        from phasegate.store import open_store

        with _START_LOCK:  # alembic's migration context is process-global, not per thread
            cartridge = load_cartridge(self.repo)
            store = open_store(cartridge.store_url(self.repo))
            try:
                if self.mode == "graph":
                    from phasegate.demo import DEMO_TICKET, DEMO_TITLE

                    return Engine(self.repo, cartridge, store).start(DEMO_TITLE, DEMO_TICKET)
                return Engine(self.repo, cartridge, store).start(TITLE, TICKET)
            finally:
                store.close()

    def worker(self) -> subprocess.Popen[bytes]:
        self.workers += 1
        with open(self.logs / f"worker-{self.workers}.log", "wb") as log:
            return subprocess.Popen(
                [_phasegate(), "worker", "--repo", str(self.repo), "--poll", "0.1"],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "COLUMNS": "200"},
            )

    def query(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        # A plain reader: never migrates, never takes the write lock.
        if not self.db.exists():
            return []
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10)
        try:
            return conn.execute(sql, args).fetchall()
        except sqlite3.OperationalError:
            return []  # the schema is still being made
        finally:
            conn.close()

    def claimed_by(self, workflow_id: str, pid: int) -> bool:
        """Whether the worker ``pid`` holds the workflow's lease (owner ``host:pid:...``)."""
        rows = self.query("SELECT lease_owner FROM workflows WHERE id = ?", workflow_id)
        return bool(rows and rows[0][0] and f":{pid}:" in rows[0][0])

    def row(self, workflow_id: str) -> dict[str, Any]:
        rows = self.query(
            "SELECT current_phase, status, error, branch_name FROM workflows WHERE id = ?",
            workflow_id,
        )
        if not rows:
            return {"current_phase": "", "status": "", "error": None, "branch_name": None}
        phase, status, error, branch = rows[0]
        return {"current_phase": phase, "status": status, "error": error, "branch_name": branch}


def _phasegate() -> str:
    found = Path(sys.executable).parent / "phasegate"
    return str(found) if found.exists() else "phasegate"


# -- aiming -------------------------------------------------------------------------


def _window_open(lab: _Lab, workflow_id: str, aim: str) -> bool:
    if aim == "journal_window":
        return bool(
            lab.query(
                "SELECT 1 FROM milestones WHERE workflow_id = ? AND status = 'in_progress' "
                "AND kind IN ('issue_created', 'branch_created', 'branch_pushed', 'pr_created',"
                " 'pr_updated', 'comment_posted', 'merge_completed', 'issue_closed')",
                workflow_id,
            )
        )
    if aim == "git":
        return any(_comm(pid) == "git" for pid in trial_processes(lab.root))
    if aim == "merge":
        return lab.row(workflow_id)["current_phase"] == "merge"
    if aim == "verification":
        return lab.row(workflow_id)["current_phase"] == "acceptance_verification"
    if aim == "apply_arm":  # a draft PR the policy let through, not yet landed
        return (
            bool(
                lab.query(
                    "SELECT 1 FROM proposals WHERE workflow_id = ? AND kind = 'draft_pr_create' "
                    "AND mode = 'auto' AND status != 'applied'",
                    workflow_id,
                )
            )
            or lab.row(workflow_id)["current_phase"] == "pr_review"
        )
    if aim == "agent":
        return bool(
            lab.query(
                "SELECT 1 FROM milestones WHERE workflow_id = ? AND status = 'in_progress' "
                "AND kind = 'agent_process'",
                workflow_id,
            )
        )
    return False


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _settled(lab: _Lab, workflow_id: str) -> bool:
    return lab.row(workflow_id)["status"] in TERMINAL


def _wait_for(probe: Callable[[], bool], timeout_s: float, poll_s: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if probe():
            return True
        time.sleep(poll_s)
    return False


# -- one trial ----------------------------------------------------------------------


def trial_mode(seed: int) -> str:
    """Which workflow trial ``seed`` runs: one in four goes through the development graph."""
    return "graph" if seed % 4 == 0 else "classic"


def run_trial(
    root: Path,
    seed: int,
    *,
    span_s: float = 6.0,
    max_sleep_s: float = 0.15,
    mode: str | None = None,
) -> Trial:
    """Run trial ``seed`` in the empty directory ``root``; returns what it did and found.

    ``span_s`` is the length of an uninterrupted run in seconds (random kills
    fall within it); ``max_sleep_s`` bounds each agent's random sleeps;
    ``mode`` is ``classic`` or ``graph`` (default: ``trial_mode(seed)``).
    """
    started = time.monotonic()
    mode = mode or trial_mode(seed)
    trial = Trial(seed=seed, root=root, mode=mode)
    lab = _Lab(root, seed, max_sleep_s, mode)
    workflow_id = lab.start_workflow()
    for plan in plan_kills(seed, span_s):
        if _settled(lab, workflow_id):
            break
        worker = lab.worker()
        begun = time.monotonic()
        claimed = plan.aim != "random" or not plan.before_claim
        if claimed:
            # Kill moments are drawn over the workflow's run, not over Python's start-up.
            claimed = _wait_for(
                lambda w=worker: lab.claimed_by(workflow_id, w.pid) or _settled(lab, workflow_id),
                15.0,
            )
        if plan.aim == "random":
            time.sleep(plan.at_s if claimed else plan.at_s % 0.8)
            hit = True
        else:
            hit = _wait_for(
                lambda aim=plan.aim: (
                    _window_open(lab, workflow_id, aim) or _settled(lab, workflow_id)
                ),
                WINDOW_S,
            )
        phase = lab.row(workflow_id)["current_phase"] if claimed else "before_claim"
        if plan.target == "phasegate":
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
        else:
            _kill_all(lab.root, worker)
        trial.kills.append(
            {
                "phase": phase,
                "aim": plan.aim,
                "target": plan.target,
                "after_s": round(time.monotonic() - begun, 3),
                "window_hit": hit,
            }
        )
    trial.resumes, trial.status = _settle(lab, workflow_id)
    trial.violations = check_invariants(lab, workflow_id)
    trial.duration_s = round(time.monotonic() - started, 2)
    return trial


def run_uninterrupted(root: Path, *, max_sleep_s: float = 0.15, mode: str = "classic") -> float:
    """The same workflow with no kill: seconds from its worker's start to settled.

    The span random kills are drawn from, and the peer a trial is measured
    against. Raises RuntimeError when even the uninterrupted run does not
    complete or violates an invariant: the harness itself would be wrong.
    """
    lab = _Lab(root, 0, max_sleep_s, mode)
    workflow_id = lab.start_workflow()
    worker = lab.worker()
    try:
        _wait_for(
            lambda: lab.claimed_by(workflow_id, worker.pid) or _settled(lab, workflow_id), 15.0
        )
        started = time.monotonic()
        _wait_for(lambda: _settled(lab, workflow_id), SETTLE_S, poll_s=0.02)
        elapsed = time.monotonic() - started
    finally:
        _stop(lab, worker)
    status = lab.row(workflow_id)["status"]
    violations = check_invariants(lab, workflow_id)
    if status != "completed" or violations:
        raise RuntimeError(f"the uninterrupted run in {root} ended {status}: {violations}")
    return elapsed


def _stop(lab: _Lab, worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM the worker (a clean stop); every process of the trial killed if it hangs."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        _kill_all(lab.root, worker)


def _settle(lab: _Lab, workflow_id: str) -> tuple[int, str]:
    """A worker runs the workflow until it settles; a pause is resumed (at most
    three times). Returns the resumes it took and the final status."""
    resumes = 0
    while True:
        worker = lab.worker()
        try:
            _wait_for(lambda: _settled(lab, workflow_id), SETTLE_S, poll_s=0.05)
        finally:
            _stop(lab, worker)
        status = lab.row(workflow_id)["status"]
        if status != "paused" or resumes >= 3:
            return resumes, status
        resumes += 1
        subprocess.run(
            [_phasegate(), "resume", "--no-advance", "--repo", str(lab.repo), workflow_id],
            capture_output=True, timeout=60, cwd=lab.root,
        )  # fmt: skip


# -- the invariants -------------------------------------------------------------------


def check_invariants(lab: _Lab, workflow_id: str) -> list[Violation]:
    """Every invariant of the module docstring, checked on the settled trial."""
    found: list[Violation] = []

    def expect(ok: bool, kind: str, detail: str) -> None:
        if not ok:
            found.append(Violation(kind, detail))

    row = lab.row(workflow_id)
    expect(row["status"] == "completed", "not_completed", f"{row['status']}: {row['error']}")
    repo_key = str(lab.repo)
    issues = lab.query("SELECT count(*) FROM forge_issues")[0][0]
    prs = lab.query("SELECT count(*) FROM forge_pull_requests")[0][0]
    expect(issues == 1, "issues", f"{issues} issues in {repo_key}")
    expect(prs == 1, "pull_requests", f"{prs} pull requests")
    markers = lab.query(
        "SELECT marker, count(*) FROM forge_comments WHERE marker IS NOT NULL "
        "GROUP BY marker HAVING count(*) > 1"
    )
    expect(not markers, "duplicate_comment", f"markers posted twice: {markers}")
    stuck = lab.query(
        "SELECT phase, kind FROM milestones WHERE workflow_id = ? AND status = 'in_progress'",
        workflow_id,
    )
    expect(not stuck, "in_progress", f"milestones left in_progress: {stuck}")

    merges = lab._git("rev-list", "--first-parent", "--merges", "main").split()
    expect(len(merges) == 1, "merges", f"{len(merges)} merge commits on main")
    first_parent = lab._git("rev-list", "--first-parent", "main").split()
    expect(
        len(first_parent) == lab.base_commits + 1,
        "merges",
        f"main's first-parent line has {len(first_parent)} commits; "
        f"{lab.base_commits} + one merge expected",
    )

    _wait_for(lambda: not trial_processes(lab.root), 5.0, poll_s=0.1)
    alive = [f"{pid} {_cmdline(pid)}" for pid in trial_processes(lab.root)]
    expect(not alive, "process_alive", f"still running: {alive}")
    _kill_all(lab.root, None)

    git_dir = lab.repo / ".git"
    locks = [str(p.relative_to(git_dir)) for p in git_dir.rglob("*.lock")]
    locks = [p for p in locks if not p.startswith("phasegate/")]  # phasegate's own flock files
    expect(not locks, "git_lock", f"lock files left: {locks}")
    worktrees = [
        line[len("worktree ") :]
        for line in lab._git("worktree", "list", "--porcelain").splitlines()
        if line.startswith("worktree ")
    ]
    expect(worktrees == [str(lab.repo)], "worktree_left", f"worktrees: {worktrees}")
    leftovers = [
        str(p)
        for folder in (lab.repo / ".phasegate" / "worktrees", git_dir / "phasegate")
        if folder.is_dir()
        for p in folder.iterdir()
        if p.is_dir()
    ]
    expect(not leftovers, "worktree_left", f"checkout directories left: {leftovers}")

    found += _check_change(lab, workflow_id)

    with contextlib.suppress(subprocess.CalledProcessError):
        lab._git("stash", "list")  # harmless; makes sure the person's git still runs
    probe = subprocess.run(
        ["git", "-c", "user.name=p", "-c", "user.email=p@l", "branch", "torture-probe"],
        cwd=lab.repo, capture_output=True, text=True,
    )  # fmt: skip
    deleted = subprocess.run(
        ["git", "branch", "-D", "torture-probe"], cwd=lab.repo, capture_output=True, text=True
    )
    status = subprocess.run(["git", "status"], cwd=lab.repo, capture_output=True, text=True)
    expect(
        probe.returncode == 0 and deleted.returncode == 0 and status.returncode == 0,
        "repository",
        f"git branch/-D/status: {probe.stderr}{deleted.stderr}{status.stderr}".strip(),
    )
    return found


def _check_change(lab: _Lab, workflow_id: str) -> list[Violation]:
    """The base holds one whole line per build run recorded ``ok`` and kept (classic);
    the applied proposal's patch exactly once (graph)."""
    if lab.mode == "graph":
        return _check_graph_change(lab, workflow_id)
    found = []
    try:
        text = lab._git("show", "main:changes.txt") + "\n"
    except subprocess.CalledProcessError:
        text = ""
    lines = text.splitlines(keepends=True) if text.strip() else []
    recorded = lab.query(
        "SELECT count(*) FROM agent_runs WHERE workflow_id = ? AND role = 'build' "
        "AND outcome = 'ok'",
        workflow_id,
    )[0][0]
    discarded = lab.query(
        "SELECT count(*) FROM milestones WHERE workflow_id = ? AND kind = 'attempt_discarded' "
        "AND json_extract(data, '$.recorded_run') = 1",
        workflow_id,
    )[0][0]
    kept = recorded - discarded
    if len(lines) != kept:
        found.append(
            Violation(
                "change",
                f"main's changes.txt has {len(lines)} line(s); {recorded} build run(s) "
                f"recorded ok, {discarded} of them discarded: {kept} expected",
            )
        )
    check = subprocess.run(
        [sys.executable, "check_changes.py"], cwd=lab.repo, capture_output=True, text=True
    )
    if check.returncode != 0 and row_completed(lab, workflow_id):
        found.append(Violation("base_checks", (check.stderr or check.stdout).strip()[-300:]))
    return found


def _check_graph_change(lab: _Lab, workflow_id: str) -> list[Violation]:
    from phasegate.demo import _CALC_AFTER

    found = []
    applied = lab.query(
        "SELECT count(*) FROM proposals WHERE workflow_id = ? AND kind = 'draft_pr_create' "
        "AND status = 'applied'",
        workflow_id,
    )[0][0]
    if applied != 1:
        found.append(Violation("change", f"{applied} draft PR proposals applied, 1 expected"))
    landed = lab._git("log", "--format=%B", "main").count("Phasegate-Proposal:")
    if landed != 1:
        found.append(Violation("change", f"{landed} Phasegate-Proposal commits on main"))
    try:
        calc = lab._git("show", "main:calc/__init__.py") + "\n"
    except subprocess.CalledProcessError:
        calc = ""
    if calc != _CALC_AFTER:
        found.append(
            Violation(
                "change", f"main's calc/__init__.py is not the patch applied once: {calc[-200:]!r}"
            )
        )
    check = subprocess.run(
        [sys.executable, "-m", "unittest", "discover", "-s", "tests"],
        cwd=lab.repo, capture_output=True, text=True,
    )  # fmt: skip
    if check.returncode != 0:
        found.append(Violation("base_checks", check.stderr.strip()[-300:]))
    return found


def row_completed(lab: _Lab, workflow_id: str) -> bool:
    return lab.row(workflow_id)["status"] == "completed"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()[:200]
    except OSError:
        return "?"
