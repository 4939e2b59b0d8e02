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

on a remote forge (``mode`` its rig's name: ``github``, ``gitlab``, ``gitea``;
``support.torture_forge``, one rig module per forge) also at a request in
flight (``<name>_request``): the fake forge holds the next changing request a
moment, the kill lands while it is held, and the forge acts for the dead client;

each kill either to the phasegate process alone (its agents, checks and git
children are orphaned, as when only the worker is OOM-killed) or to every
process of the trial (a machine crash). After the last kill a new worker
runs until the workflow settles, and the invariants are checked
(``Violation`` kinds in brackets):

- the workflow completed, as an uninterrupted run does [``not_completed``];
- exactly 1 issue, 1 pull request and 1 merge of the branch on the base
  [``issues``, ``pull_requests``, ``merges``]; no comment marker twice
  [``duplicate_comment``]; no milestone left ``in_progress`` [``in_progress``];
  on a forge these are read on its fake, with more of its own (the issue
  closed once after the verdict, its labels, the token nowhere, what the
  forge's own API description refuses: ``torture_github``, ``torture_gitlab``,
  ``torture_gitea``);
- no process of the trial alive once the worker stopped [``process_alive``];
- no git lock, no worktree but the person's, no scratch or half-made
  checkout left [``git_lock``, ``worktree_left``];
- the change on the base (the forge's main, on a forge) is exactly what the
  recorded attempts produced: the build agent appends one line per run, so the
  base holds one well-formed line per build run phasegate recorded as ``ok``
  and kept, less the runs whose output it discarded as evidence [``change``];
- the base's checks pass [``base_checks``]; the person's repository still works
  (``git status``, ``git branch -D``) [``repository``].

On a PostgreSQL store with two workers sharing several workflows, one of
them killed at random: ``support.torture_postgres``, the
same invariants for every workflow.

A seed replays a trial's plan (its kill moments, kinds and the agents'
sleeps); timing on a busy machine still varies, so a violation is reported
with its seed and the trial's directory is kept for reading.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from phasegate.store import tables as t

from support.fake_http import Fault
from support.torture_forge import HOLD_S, ForgeRig, TrialForge, request_aim
from support.torture_invariants import Violation, check_invariants
from support.torture_lab import (
    Lab,
    comm,
    kill_all,
    phasegate_exe,
    trial_processes,
    wait_for,
)

__all__ = [
    "FORGE_WEIGHTS",
    "GITHUB_AIMS",
    "KillPlan",
    "Trial",
    "Violation",
    "forge_aims",
    "forge_plan",
    "github_plan",
    "plan_kills",
    "run_trial",
    "run_uninterrupted",
    "trial_mode",
]

#: How a kill is aimed: at a random moment, or at the first moment a window opens.
AIMS = ("random", "journal_window", "git", "merge", "verification", "agent", "apply_arm")
#: A forge trial's aims (``forge_aims``): every other one, and a request to the forge
#: in flight, drawn as often as five others together: it is what the mode is for.
FORGE_WEIGHTS = (*(1,) * len(AIMS), 5)
#: Whom a kill hits: the phasegate worker alone, or every process of the trial.
TARGETS = ("phasegate", "everything")

SETTLE_S = 90.0  # bound on the last worker's run to a settled workflow
WINDOW_S = 20.0  # how long an aimed kill waits for its window before firing anyway
TERMINAL = ("completed", "failed", "paused", "planning_timeout")  # full-auto never waits


@dataclass(frozen=True)
class KillPlan:
    """One kill: when (seconds after its worker started, for ``random``), how it is
    aimed, and whom it hits."""

    at_s: float
    aim: str
    target: str
    before_claim: bool = False  # a random kill while the worker is still starting up
    victim: int = 0  # which worker a kill of one hits, when two run (torture_postgres)


@dataclass
class Trial:
    """What one trial did and found."""

    seed: int
    root: Path
    mode: str = "classic"
    kills: list[dict[str, Any]] = field(default_factory=list)
    forge_requests: int = 0  # requests the fake forge answered over the trial
    resumes: int = 0
    status: str = ""
    violations: list[Violation] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations


def plan_kills(
    seed: int,
    span_s: float,
    aims: tuple[str, ...] = AIMS,
    weights: tuple[int, ...] | None = None,
) -> list[KillPlan]:
    """1–3 kills for trial ``seed``: moments uniform in [0, ``span_s``] seconds (the
    length of an uninterrupted run), aims (among ``aims``, by ``weights``; half of
    the kills are ``random``) and targets drawn from the seed. A ``<forge>_request``
    kill is armed at its moment."""
    rng = random.Random(seed)

    def aim() -> str:
        return rng.choice(aims) if weights is None else rng.choices(aims, weights)[0]

    return [
        KillPlan(
            at_s=rng.uniform(0.0, span_s),
            aim=aim() if rng.random() < 0.5 else "random",
            target=rng.choice(TARGETS),
            before_claim=rng.random() < 0.1,
        )
        for _ in range(rng.randint(1, 3))
    ]


def forge_aims(name: str) -> tuple[str, ...]:
    """The aims of a trial on forge ``name``: ``AIMS`` and its request in flight."""
    return (*AIMS, request_aim(name))


#: A github trial's aims.
GITHUB_AIMS = forge_aims("github")


def forge_plan(seed: int, span_s: float, name: str) -> list[KillPlan]:
    """The kills of trial ``seed`` on forge ``name`` (``plan_kills`` over its aims,
    by ``FORGE_WEIGHTS``): the same moments and targets on every forge."""
    return plan_kills(seed, span_s, forge_aims(name), FORGE_WEIGHTS)


def github_plan(seed: int, span_s: float) -> list[KillPlan]:
    """The kills of github trial ``seed`` (``forge_plan`` on GitHub)."""
    return forge_plan(seed, span_s, "github")


# -- aiming -------------------------------------------------------------------------


#: The journaled side effects a ``journal_window`` kill is aimed at
#: (docs/contracts/lifecycle.md: journaled side effects).
JOURNALED = (
    "issue_created", "branch_created", "branch_pushed", "pr_created", "pr_updated",
    "comment_posted", "merge_completed", "issue_closed",
)  # fmt: skip


def _in_progress(lab: Lab, workflow_id: str, kinds: tuple[str, ...]) -> bool:
    m = t.milestones.c
    return bool(
        lab.read(
            sa.select(m.id)
            .where(m.workflow_id == workflow_id, m.status == "in_progress", m.kind.in_(kinds))
            .limit(1)
        )
    )


def _window_open(lab: Lab, workflow_id: str, aim: str) -> bool:
    if aim == "journal_window":
        return _in_progress(lab, workflow_id, JOURNALED)
    if aim == "git":
        return any(comm(pid) == "git" for pid in trial_processes(lab.root))
    if aim == "merge":
        return lab.row(workflow_id)["current_phase"] == "merge"
    if aim == "verification":
        return lab.row(workflow_id)["current_phase"] == "acceptance_verification"
    if aim == "apply_arm":  # a draft PR the policy let through, not yet landed
        p = t.proposals.c
        return (
            bool(
                lab.read(
                    sa.select(p.id).where(
                        p.workflow_id == workflow_id,
                        p.kind == "draft_pr_create",
                        p.mode == "auto",
                        p.status != "applied",
                    )
                )
            )
            or lab.row(workflow_id)["current_phase"] == "pr_review"
        )
    if aim == "agent":
        return _in_progress(lab, workflow_id, ("agent_process",))
    return False


def _settled(lab: Lab, workflow_id: str) -> bool:
    return lab.row(workflow_id)["status"] in TERMINAL


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
    rig: ForgeRig | None = None,
) -> Trial:
    """Run trial ``seed`` in the empty directory ``root``; returns what it did and found.

    ``span_s`` is the length of an uninterrupted run in seconds (random kills
    fall within it); ``max_sleep_s`` bounds each agent's random sleeps;
    ``mode`` is ``classic``, ``graph`` (default: ``trial_mode(seed)``) or a
    forge's name, which needs ``rig``: that forge's rig, which starts the
    trial's fake forge (default with a rig: its name; ValueError when they
    disagree).
    """
    started = time.monotonic()
    mode = mode or (rig.name if rig is not None else trial_mode(seed))
    if rig is not None and rig.name != mode:
        raise ValueError(f"a {mode} trial runs on no {rig.name} rig")
    forge = rig.forge_for(root) if rig is not None else None
    trial = Trial(seed=seed, root=root, mode=mode)
    lab = None
    try:
        lab = Lab(root, seed, max_sleep_s, mode, forge)
        workflow_id = lab.start_workflow()
        for plan in forge_plan(seed, span_s, forge.name) if forge else plan_kills(seed, span_s):
            if _settled(lab, workflow_id):
                break
            # On a forge a moment is drawn over what is left of the run (by the changes
            # an uninterrupted run makes): a later kill lands on more than a done workflow.
            left = forge.left(rig.changes_per_run) if forge and rig else 1.0
            trial.kills.append(_kill_once(lab, workflow_id, plan, left))
        trial.resumes, trial.status = _settle(lab, workflow_id)
        trial.violations = check_invariants(lab, [workflow_id])
        trial.forge_requests = len(forge.answered()) if forge else 0
    finally:
        if lab is not None:
            lab.close()
        if forge is not None:
            forge.stop()
    trial.duration_s = round(time.monotonic() - started, 2)
    return trial


def _kill_once(lab: Lab, workflow_id: str, plan: KillPlan, left: float) -> dict[str, Any]:
    """One worker started and killed as ``plan`` says, its moment scaled by ``left``
    (the share of the run still to come, 0..1); what the kill hit."""
    worker = lab.worker()
    begun = time.monotonic()
    claimed = plan.aim != "random" or not plan.before_claim
    if claimed:
        # Kill moments are drawn over the workflow's run, not over Python's start-up.
        claimed = wait_for(
            lambda w=worker: lab.claimed_by(workflow_id, w.pid) or _settled(lab, workflow_id),
            15.0,
        )
    held: list[Fault] = []
    if plan.aim == "random":
        time.sleep(plan.at_s * left if claimed else plan.at_s % 0.8)
        hit = True
    elif lab.forge is not None and plan.aim == request_aim(lab.forge.name):
        time.sleep(plan.at_s * left)
        held = lab.forge.hold_changes()
        hit = wait_for(
            lambda: any(f.times == 0 for f in held) or _settled(lab, workflow_id), WINDOW_S
        )
    else:
        hit = wait_for(
            lambda aim=plan.aim: _window_open(lab, workflow_id, aim) or _settled(lab, workflow_id),
            WINDOW_S,
        )
    answered = len(lab.forge.answered()) if lab.forge else 0
    phase = lab.row(workflow_id)["current_phase"] if claimed else "before_claim"
    if plan.target == "phasegate":
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGKILL)
        worker.wait(timeout=10)
    else:
        kill_all(lab.root, worker)
    kill = {
        "phase": phase,
        "aim": plan.aim,
        "target": plan.target,
        "after_s": round(time.monotonic() - begun, 3),
        "window_hit": hit,
    }
    if held:
        kill["request"] = _held_request(lab.forge, held, answered)  # type: ignore[arg-type]
    return kill


def _held_request(forge: TrialForge, held: list[Fault], answered: int) -> str:
    """Which request the kill caught in flight (``METHOD /path``; "" if none was):
    the first the fake answers after the kill that a hold reached (its method, its
    path matching), once its hold ends."""
    caught = [f for f in held if f.times == 0]
    forge.release(held)
    if not caught:
        return ""
    found: list[str] = []

    def answered_since() -> bool:
        later = forge.answered()[answered:]
        found[:] = [
            f"{method} {path}"
            for method, path in later
            if any(f.method == method and re.search(f.path_regex, path) for f in caught)
        ]
        return bool(found)

    wait_for(answered_since, HOLD_S + 5.0, poll_s=0.02)
    return found[0] if found else "?"


def run_uninterrupted(
    root: Path,
    *,
    max_sleep_s: float = 0.15,
    mode: str | None = None,
    rig: ForgeRig | None = None,
    inspect: Callable[[Lab, str], None] | None = None,
) -> float:
    """The same workflow with no kill: seconds from its worker's start to settled.

    The span random kills are drawn from, and the peer a trial is measured
    against (``mode`` and ``rig`` as for ``run_trial``, ``classic`` without
    either; on a forge it sets ``rig.changes_per_run``, what later kills are
    spread over). Raises RuntimeError when even the uninterrupted run does not
    complete or violates an invariant: the harness itself would be wrong.
    ``inspect(lab, workflow_id)`` then runs on the settled run while its fake
    forge still serves (a test that breaks an invariant on purpose, to see it
    caught).
    """
    mode = mode or (rig.name if rig is not None else "classic")
    if rig is not None and rig.name != mode:
        raise ValueError(f"a {mode} run runs on no {rig.name} rig")
    forge = rig.forge_for(root) if rig is not None else None
    lab = None
    try:
        lab = Lab(root, 0, max_sleep_s, mode, forge)
        workflow_id = lab.start_workflow()
        worker = lab.worker()
        try:
            wait_for(
                lambda: lab.claimed_by(workflow_id, worker.pid) or _settled(lab, workflow_id),
                15.0,
            )
            started = time.monotonic()
            wait_for(lambda: _settled(lab, workflow_id), SETTLE_S, poll_s=0.02)
            elapsed = time.monotonic() - started
        finally:
            _stop(lab, worker)
        status = lab.row(workflow_id)["status"]
        violations = check_invariants(lab, [workflow_id])
        if status != "completed" or violations:
            raise RuntimeError(f"the uninterrupted run in {root} ended {status}: {violations}")
        if rig is not None and forge is not None:
            rig.changes_per_run = forge.changes()
        if inspect is not None:
            inspect(lab, workflow_id)
    finally:
        if lab is not None:
            lab.close()
        if forge is not None:
            forge.stop()
    return elapsed


def _stop(lab: Lab, worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM the worker (a clean stop); every process of the trial killed if it hangs."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        kill_all(lab.root, worker)


def _settle(lab: Lab, workflow_id: str) -> tuple[int, str]:
    """A worker runs the workflow until it settles; a pause is resumed (at most
    three times). Returns the resumes it took and the final status."""
    resumes = 0
    while True:
        worker = lab.worker()
        try:
            wait_for(lambda: _settled(lab, workflow_id), SETTLE_S, poll_s=0.05)
        finally:
            _stop(lab, worker)
        status = lab.row(workflow_id)["status"]
        if status != "paused" or resumes >= 3:
            return resumes, status
        resumes += 1
        subprocess.run(
            [phasegate_exe(), "resume", "--no-advance", "--repo", str(lab.repo), workflow_id],
            capture_output=True, timeout=60, cwd=lab.root, env=lab.env,
        )  # fmt: skip
