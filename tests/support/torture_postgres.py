"""The kill torture on PostgreSQL with two workers: several
workflows on a PostgreSQL store, two ``phasegate worker`` processes advancing them
at once, SIGKILLs at random moments aimed at one of the workers (sometimes both).

One **trial** (``run_postgres_trial(root, seed, postgres_url=...)``) makes a
schema of its own on the server (``support.postgres.fresh_schema``),
a classic repository whose cartridge's ``store.url`` names it, files
``WORKFLOWS`` workflows (each build agent appends to a changes file of its
workflow's own, so their merges never conflict) and starts two workers of
``--concurrency CONCURRENCY``: the first claims some, the second the rest. It
then sends 1–3 kills drawn from the seed (``postgres_plan``): moments and aims
as ``torture.plan_kills`` draws them (a window opening on any workflow), and
whom a kill hits (``POSTGRES_TARGETS``):

- ``phasegate``: one worker's phasegate process alone (its agents, checks and
  git children are orphaned; the other worker takes its workflows over at
  once, their holder being a gone process of this host);
- ``tree``: one worker and every process under it (its container OOM-killed);
- ``both``: both workers' phasegate processes;
- ``everything``: every process of the trial (a machine crash).

An aimed kill hits the worker holding the workflow whose window opened (for
``git``, the worker the git process runs under). After each kill the dead
worker is replaced, so two run again; after the last, the two run until every
workflow settles, and the invariants are checked: those of
``support.torture`` for every workflow (one issue, one pull request
and one merge on main per workflow, no comment twice, nothing left
``in_progress``, each changes file exactly what the recorded runs wrote, the
base's checks, no process, lock or worktree left), and two of the pair's
[``lease_taken``, ``worker_error``]: no worker lost a lease it held while it
lived (a lease is taken over by expiry or from a gone process, never from a
live one; the TTL far outlasts a trial), and no worker's log holds a
traceback. A trial's schema is dropped when it passed and kept (its URL in
``store_url.txt`` in its directory) when it did not.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from support.postgres import drop_schema, fresh_schema
from support.torture import (
    AIMS,
    SETTLE_S,
    TERMINAL,
    WINDOW_S,
    KillPlan,
    Trial,
    _window_open,
)
from support.torture_invariants import Violation, check_invariants
from support.torture_lab import (
    TITLE,
    Lab,
    comm,
    kill_all,
    phasegate_exe,
    trial_processes,
    wait_for,
)

__all__ = [
    "CONCURRENCY",
    "POSTGRES_TARGETS",
    "WORKFLOWS",
    "check_workers",
    "postgres_plan",
    "run_postgres_trial",
    "run_postgres_uninterrupted",
]

#: Workflows of one trial, and each worker's ``--concurrency``: the first worker to
#: start claims ``CONCURRENCY`` of them, the second the rest, so both have work.
WORKFLOWS = 3
CONCURRENCY = 2
#: Whom a kill hits, and how often each (one worker three times as often as both).
POSTGRES_TARGETS = ("phasegate", "tree", "both", "everything")
POSTGRES_WEIGHTS = (3, 3, 1, 1)
#: What a worker's log says when it lost a lease it held (heartbeat.Heartbeat,
#: Engine.advance): a live worker's lease was taken over.
_LEASE_LOST = re.compile(r"was taken over|advance of \S+ stopped")


def postgres_plan(seed: int, span_s: float) -> list[KillPlan]:
    """1–3 kills for postgres trial ``seed``: moments uniform in [0, ``span_s``]
    seconds, aims as ``plan_kills`` draws them (half ``random``), targets among
    ``POSTGRES_TARGETS`` and the worker a kill of one hits (``victim``: 0 or 1)."""
    rng = random.Random(f"postgres:{seed}")
    return [
        KillPlan(
            at_s=rng.uniform(0.0, span_s),
            aim=rng.choice(AIMS) if rng.random() < 0.5 else "random",
            target=rng.choices(POSTGRES_TARGETS, POSTGRES_WEIGHTS)[0],
            before_claim=rng.random() < 0.1,
            victim=rng.randrange(2),
        )
        for _ in range(rng.randint(1, 3))
    ]


# -- processes ------------------------------------------------------------------------


def _parents() -> dict[int, int]:
    """pid → parent pid of every live process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone
            found[int(entry.name)] = int(stat.rsplit(")", 1)[-1].split()[1])
    return found


def _descendants(pid: int) -> set[int]:
    parents = _parents()
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _ancestor_among(pid: int, candidates: set[int]) -> int | None:
    """The first of ``candidates`` on ``pid``'s line of parents, or None."""
    parents = _parents()
    seen: set[int] = set()
    while pid not in candidates:
        if pid in seen or pid not in parents:
            return None
        seen.add(pid)
        pid = parents[pid]
    return pid


def _kill_tree(worker: subprocess.Popen[bytes]) -> None:
    """SIGKILL the worker and every process under it, none left to fork another:
    each is stopped (SIGSTOP) as it is found, then all are killed at once."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(worker.pid, signal.SIGSTOP)
    stopped: set[int] = set()
    while new := _descendants(worker.pid) - stopped:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in (worker.pid, *stopped):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    worker.wait(timeout=10)


class _Pair:
    """The trial's two workers: started, replaced when dead, stopped."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.workers: list[subprocess.Popen[bytes]] = []
        self.started_at: dict[int, float] = {}

    def fill(self) -> None:
        """Replace the dead workers: two run again."""
        self.workers = [w for w in self.workers if w.poll() is None]
        while len(self.workers) < 2:
            worker = self.lab.worker(CONCURRENCY)
            self.started_at[worker.pid] = time.monotonic()
            self.workers.append(worker)

    def holder(self, workflow_id: str) -> subprocess.Popen[bytes] | None:
        """The worker holding the workflow's lease, if one of the pair does."""
        owner = self.lab.row(workflow_id)["lease_owner"] or ""
        return next((w for w in self.workers if f":{w.pid}:" in owner), None)

    def stop(self) -> None:
        """SIGTERM both (a clean stop); every process of the trial killed if one hangs."""
        for worker in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.wait(timeout=30)
            except subprocess.TimeoutExpired:
                kill_all(self.lab.root, worker)
        self.workers = []


# -- one trial --------------------------------------------------------------------------


def _all_settled(lab: Lab, ids: Sequence[str]) -> bool:
    return all(lab.row(i)["status"] in TERMINAL for i in ids)


def _window(lab: Lab, ids: Sequence[str], aim: str, pair: _Pair) -> Callable[[], Any]:
    """A probe: the worker to kill once ``aim``'s window opens on any workflow (the
    one holding that workflow; for ``git``, the one the git process runs under),
    True when it opened under no worker of the pair, None while it is shut."""

    def probe() -> Any:
        if aim == "git":
            pids = {w.pid: w for w in pair.workers}
            for pid in trial_processes(lab.root):
                if comm(pid) == "git":
                    under = _ancestor_among(pid, set(pids))
                    return pids[under] if under is not None else True
            return None
        for workflow_id in ids:
            if lab.row(workflow_id)["status"] not in TERMINAL and _window_open(
                lab, workflow_id, aim
            ):
                return pair.holder(workflow_id) or True
        return None

    return probe


def _kill_once(lab: Lab, ids: Sequence[str], pair: _Pair, plan: KillPlan) -> dict[str, Any]:
    """One kill as ``plan`` says, while both workers run; what it hit."""
    begun = time.monotonic()
    victim = pair.workers[plan.victim]
    hit: Any = True
    if plan.aim == "random" and plan.before_claim:
        victim = max(pair.workers, key=lambda w: pair.started_at[w.pid])  # the newest
        time.sleep(max(0.0, pair.started_at[victim.pid] + plan.at_s % 0.8 - time.monotonic()))
        phase = "before_claim"
    else:
        # Moments are drawn over the workflows' run, not over Python's start-up.
        wait_for(
            lambda: any(pair.holder(i) for i in ids) or _all_settled(lab, ids), 15.0, poll_s=0.02
        )
        if plan.aim == "random":
            time.sleep(plan.at_s)
            # A kill of one worker hits one that holds a workflow, when one does.
            holding = [w for w in pair.workers if any(pair.holder(i) is w for i in ids)]
            if holding and victim not in holding:
                victim = holding[plan.victim % len(holding)]
        else:
            probe, opened = _window(lab, ids, plan.aim, pair), None
            deadline = time.monotonic() + WINDOW_S
            while opened is None and time.monotonic() < deadline:
                opened = probe() or (True if _all_settled(lab, ids) else None)
                time.sleep(0.005)
            hit = opened is not None
            if isinstance(opened, subprocess.Popen):
                victim = opened
        held = [i for i in ids if pair.holder(i) is victim]
        phase = lab.row(held[0])["current_phase"] if held else "idle"
    if plan.target == "phasegate":
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
    elif plan.target == "tree":
        _kill_tree(victim)
    elif plan.target == "both":
        for worker in pair.workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
    else:
        kill_all(lab.root, None)
        for worker in pair.workers:
            worker.wait(timeout=10)
    return {
        "phase": phase,
        "aim": plan.aim,
        "target": plan.target,
        "worker": "both" if plan.target in ("both", "everything") else victim.pid,
        "after_s": round(time.monotonic() - begun, 3),
        "window_hit": bool(hit),
    }


def _settle(lab: Lab, ids: Sequence[str], pair: _Pair) -> tuple[int, str]:
    """The two workers run until every workflow settles; paused ones are resumed (at
    most three times). Returns the resumes it took and the statuses ("completed"
    when all completed)."""
    resumes = 0
    while True:
        pair.fill()
        try:
            wait_for(lambda: _all_settled(lab, ids), SETTLE_S * 2, poll_s=0.05)
        finally:
            pair.stop()
        statuses = [lab.row(i)["status"] for i in ids]
        paused = [i for i, s in zip(ids, statuses, strict=True) if s == "paused"]
        if not paused or resumes >= 3:
            return resumes, ",".join(sorted(set(statuses)))
        resumes += 1
        for workflow_id in paused:
            subprocess.run(
                [phasegate_exe(), "resume", "--no-advance", "--repo", str(lab.repo), workflow_id],
                capture_output=True, timeout=60, cwd=lab.root, env=lab.env,
            )  # fmt: skip


def check_workers(lab: Lab) -> list[Violation]:
    """No worker lost a lease while it lived; no worker's log holds a traceback."""
    found = []
    for log in sorted(lab.logs.glob("worker-*.log")):
        text = log.read_text(errors="replace")
        lost = [line for line in text.splitlines() if _LEASE_LOST.search(line)]
        if lost:
            found.append(Violation("lease_taken", f"{log.name}: {lost[0][:300]}"))
        if "Traceback" in text:
            at = text.index("Traceback")
            found.append(Violation("worker_error", f"{log.name}: {text[at : at + 600]}"))
    return found


def _start(lab: Lab, workflows: int) -> list[str]:
    return [lab.start_workflow(f"{TITLE} ({n + 1})") for n in range(workflows)]


def run_postgres_trial(
    root: Path,
    seed: int,
    *,
    postgres_url: str,
    span_s: float = 10.0,
    max_sleep_s: float = 0.15,
    workflows: int = WORKFLOWS,
) -> Trial:
    """Run postgres trial ``seed`` in the empty directory ``root`` on the PostgreSQL
    server at ``postgres_url`` (a superuser's URL: the trial makes a schema of its
    own there); returns what it did and found (``Trial.mode`` "postgres").

    ``span_s``: seconds an uninterrupted run takes (``run_postgres_uninterrupted``;
    random kills fall within it); ``max_sleep_s`` bounds each agent's random
    sleeps; ``workflows`` how many the two workers share. Raises
    PostgresUnavailable / psycopg errors when the server cannot make a schema.
    """
    started = time.monotonic()
    name, url = fresh_schema(postgres_url)
    trial = Trial(seed=seed, root=root, mode="postgres")
    lab = None
    try:
        lab = Lab(root, seed, max_sleep_s, "postgres", store_url=url)
        ids = _start(lab, workflows)
        pair = _Pair(lab)
        pair.fill()
        try:
            for plan in postgres_plan(seed, span_s):
                if _all_settled(lab, ids):
                    break
                trial.kills.append(_kill_once(lab, ids, pair, plan))
                pair.fill()
            trial.resumes, trial.status = _settle(lab, ids, pair)
        finally:
            pair.stop()
        trial.violations = check_invariants(lab, ids) + check_workers(lab)
    finally:
        if lab is not None:
            lab.close()
        if trial.ok and trial.status:
            drop_schema(postgres_url, name)
        else:
            (root / "store_url.txt").write_text(url + "\n")
    trial.duration_s = round(time.monotonic() - started, 2)
    return trial


def run_postgres_uninterrupted(
    root: Path, *, postgres_url: str, max_sleep_s: float = 0.15, workflows: int = WORKFLOWS
) -> float:
    """The same workflows and two workers with no kill: seconds from the first claim
    to every workflow settled (the span postgres trials draw their moments from).

    Raises RuntimeError when even this run does not complete every workflow,
    violates an invariant, or one worker advanced none of them (the pair would
    not be two workers' run): the harness itself would be wrong.
    """
    name, url = fresh_schema(postgres_url)
    lab = None
    try:
        lab = Lab(root, 0, max_sleep_s, "postgres", store_url=url)
        ids = _start(lab, workflows)
        pair = _Pair(lab)
        pair.fill()
        pids = [w.pid for w in pair.workers]
        try:
            wait_for(lambda: any(pair.holder(i) for i in ids), 15.0, poll_s=0.02)
            began = time.monotonic()
            held: set[int] = set()

            def settled() -> bool:
                held.update(w.pid for i in ids if (w := pair.holder(i)) is not None)
                return _all_settled(lab, ids)

            wait_for(settled, SETTLE_S * 2, poll_s=0.02)
            elapsed = time.monotonic() - began
        finally:
            pair.stop()
        statuses = [lab.row(i)["status"] for i in ids]
        violations = check_invariants(lab, ids) + check_workers(lab)
        if set(statuses) != {"completed"} or violations or held != set(pids):
            raise RuntimeError(
                f"the uninterrupted run in {root} ended {statuses}: {violations}; "
                f"workers holding a workflow: {sorted(held)} of {pids}"
            )
    finally:
        if lab is not None:
            lab.close()
    drop_schema(postgres_url, name)
    return elapsed
