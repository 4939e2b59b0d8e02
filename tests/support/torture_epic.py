"""The kill-torture of an epic: its worker SIGKILLed at random points of its chain of pieces.

One trial (``run_epic_trial(root, seed)``) files an epic whose scope names three
pieces, each after the one before it, under ``full-auto`` (the item_create is
applied at once, every piece merges unattended). It starts ``phasegate worker``
and SIGKILLs it 1–3 times, each kill drawn from the seed: at a random moment, while
a piece's ticket is being filed (its journal row ``in_progress``), or once a piece
was released by the one before it; the worker alone, or every process of the
trial. Then a worker runs until the parent settles (a pause is resumed, at most
three times), and the invariants are checked:

- the parent and its three pieces completed [``not_completed``];
- exactly four workflows and four issues, no issue marker twice [``workflows``,
  ``issues``], each piece's issue filed under the parent's [``sub_issues``]; no
  milestone left ``in_progress`` [``in_progress``];
- each piece released only after the one before it completed [``order``];
- each piece's change on the base [``change``]; no branch of phasegate's left
  [``branches``]; no process of the trial left [``process_alive``].
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from phasegate.store import Store, open_store
from phasegate.store import tables as t

from support.torture_lab import Violation, kill_all, phasegate_exe, trial_processes, wait_for

__all__ = ["ANSWERS", "BUILD", "CHAIN", "EpicTrial", "run_epic_trial"]

#: Three pieces, each after the one before it.
CHAIN = "SUBTASK: the parser\\nSUBTASK: the printer [after 1]\\nSUBTASK: the docs [after 2]"
#: The scripted answers of every role but build.
ANSWERS = f"""
[[scope_epic]]
text = "{CHAIN}"
[[plan]]
text = "1. Write the piece's file."
[[review]]
text = "Correct.\\nVERDICT: approve"
[[verification]]
text = "VERDICT: confirmed"
"""
#: The build agent: a new file named by its workflow, as a diff (the graph's build answers so).
BUILD = """#!/bin/sh
f="piece-$PHASEGATE_WORKFLOW_ID.txt"
printf 'Adds %s.\\n\\n```diff\\n--- /dev/null\\n+++ b/%s\\n@@ -0,0 +1 @@\\n+done\\n```\\n' "$f" "$f"
"""
_SCRIPTED = 'runner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n'
_CARTRIDGE = (
    '[workflow]\nbase_branch = "main"\nprofile = "full-auto"\n\n'
    "[graph]\nenabled = true\n\n"
    + "".join(f"[roles.{role}]\n{_SCRIPTED}\n" for role in ("scope_epic", "plan", "review"))
    + f"[roles.verification]\n{_SCRIPTED}\n"
    + '[roles.build]\nrunner = "command"\ncommand = "sh build.sh"\ntimeout = 30\n'
)
AIMS = ("random", "filing", "chain")
TARGETS = ("phasegate", "everything")
SETTLE_S = 120.0


@dataclass
class EpicTrial:
    """What one epic trial did and found."""

    seed: int
    root: Path
    kills: list[dict[str, Any]] = field(default_factory=list)
    status: str = ""
    violations: list[Violation] = field(default_factory=list)
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.violations


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout.strip()


def _make_repo(repo: Path) -> None:
    repo.mkdir(parents=True)
    (repo / "README.md").write_text("# report tool\n")
    (repo / ".gitignore").write_text(".phasegate/\n")
    (repo / "answers.toml").write_text(ANSWERS)
    (repo / "build.sh").write_text(BUILD)
    (repo / "phasegate.toml").write_text(_CARTRIDGE)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=p", "-c", "user.email=p@localhost", "commit", "-qm", "initial")


class _EpicLab:
    def __init__(self, root: Path) -> None:
        from phasegate.config.cartridge import load_cartridge
        from phasegate.runtime.engine import Engine

        self.root = root.resolve()
        self.repo = self.root / "repo"
        self.logs = self.root / "logs"
        self.logs.mkdir(parents=True)
        _make_repo(self.repo)
        cartridge = load_cartridge(self.repo)
        self.store: Store = open_store(cartridge.store_url(self.repo))
        self.parent = Engine(self.repo, cartridge, self.store).start(
            "Build the report tool", "Build the report tool: a parser, a printer, its docs."
        )
        self.workers = 0

    def worker(self) -> subprocess.Popen[bytes]:
        self.workers += 1
        with open(self.logs / f"worker-{self.workers}.log", "wb") as log:
            return subprocess.Popen(
                [phasegate_exe(), "worker", "--repo", str(self.repo), "--poll", "0.1"],
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "COLUMNS": "200"},
            )

    def read(self, statement: sa.Executable) -> list[Any]:
        for _ in range(50):
            try:
                with self.store.reading() as conn:
                    return list(conn.execute(statement).all())
            except Exception:  # a killed writer's WAL being recovered: read again
                time.sleep(0.05)
        raise RuntimeError(f"{self.root}: the store stayed unreadable")

    def status(self, workflow_id: str) -> str:
        rows = self.read(sa.select(t.workflows.c.status).where(t.workflows.c.id == workflow_id))
        return str(rows[0][0]) if rows else ""

    def window(self, aim: str) -> bool:
        m = t.milestones.c
        if aim == "filing":
            found = self.read(
                sa.select(m.id).where(m.kind == "ticket_filed", m.status == "in_progress")
            )
        else:
            found = self.read(sa.select(t.events.c.id).where(t.events.c.type == "dependencies_met"))
        return bool(found) or self.status(self.parent) == "completed"

    def close(self) -> None:
        self.store.close()


def _stop(lab: _EpicLab, worker: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        kill_all(lab.root, worker)


def run_epic_trial(root: Path, seed: int, *, span_s: float = 3.0) -> EpicTrial:
    """Run epic trial ``seed`` in the empty directory ``root`` (random kills within
    ``span_s`` seconds of its worker's start); returns what it did and found."""
    started = time.monotonic()
    trial = EpicTrial(seed=seed, root=root)
    rng = random.Random(seed)
    lab = _EpicLab(root)
    try:
        for _ in range(rng.randint(1, 3)):
            if lab.status(lab.parent) == "completed":
                break
            aim, target = rng.choice(AIMS), rng.choice(TARGETS)
            worker = lab.worker()
            if aim == "random":
                threading.Event().wait(rng.uniform(0.2, span_s))  # the moment is the point
            else:
                wait_for(lambda a=aim: lab.window(a), 30.0)
            if target == "everything":
                kill_all(lab.root, worker)
            else:
                worker.kill()
                worker.wait(timeout=10)
            trial.kills.append({"aim": aim, "target": target, "parent": lab.status(lab.parent)})
        trial.status = _settle(lab)
        wait_for(lambda: not trial_processes(lab.root), 5.0)  # a process just exiting
        trial.violations = _check(lab)
    finally:
        lab.close()
    trial.duration_s = round(time.monotonic() - started, 2)
    return trial


_STOPPED = sa.select(t.workflows.c.id).where(t.workflows.c.status.in_(("paused", "failed")))


def _settle(lab: _EpicLab) -> str:
    """A worker runs the epic until its parent completes; a stopped workflow is
    resumed (at most three times). Returns the parent's status."""
    for _ in range(4):
        worker = lab.worker()
        try:
            wait_for(
                lambda: lab.status(lab.parent) == "completed" or bool(lab.read(_STOPPED)),
                SETTLE_S,
                poll_s=0.05,
            )
        finally:
            _stop(lab, worker)
        stopped = lab.read(_STOPPED)
        if not stopped:
            break
        for (workflow_id,) in stopped:
            subprocess.run(
                [phasegate_exe(), "resume", "--no-advance", "--repo", str(lab.repo), workflow_id],
                capture_output=True, timeout=60, cwd=lab.root,
            )  # fmt: skip
    return lab.status(lab.parent)


def _check(lab: _EpicLab) -> list[Violation]:
    found: list[Violation] = []
    rows = lab.read(sa.select(t.workflows.c.id, t.workflows.c.status))
    if len(rows) != 4:
        found.append(Violation("workflows", f"{len(rows)} workflows, not the parent and 3 pieces"))
    unfinished = [(wid, status) for wid, status in rows if status != "completed"]
    if unfinished:
        found.append(Violation("not_completed", repr(unfinished)))
    issues = lab.read(sa.select(t.forge_issues.c.marker, t.forge_issues.c.parent))
    markers = [m for m, _ in issues]
    if len(markers) != 4 or any(n > 1 for n in Counter(markers).values()):
        found.append(Violation("issues", f"{len(markers)} issues: {markers}"))
    if sorted(p is None for _, p in issues) != [False, False, False, True]:
        found.append(Violation("sub_issues", f"parents {[p for _, p in issues]}"))
    m = t.milestones.c
    left = lab.read(sa.select(m.dedupe_key).where(m.status == "in_progress"))
    if left:
        found.append(Violation("in_progress", repr(left)))
    pieces = [e["depends_on"] for e in lab.store.dependencies(lab.parent) if e["kind"] == "piece"]
    for before, after in zip(pieces, pieces[1:], strict=False):
        ended = max(e["id"] for e in lab.store.events(before, types=["phase_change"]))
        met = [e["id"] for e in lab.store.events(after, types=["dependencies_met"])]
        if not met or min(met) < ended:
            found.append(Violation("order", f"{after} released before {before} completed"))
    for piece in pieces:
        try:
            _git(lab.repo, "show", f"main:piece-{piece}.txt")
        except subprocess.CalledProcessError:
            found.append(Violation("change", f"piece-{piece}.txt is not on main"))
    left_behind = _git(lab.repo, "branch", "--list", "phasegate/*")
    if left_behind:
        found.append(Violation("branches", left_behind))
    if trial_processes(lab.root):
        found.append(Violation("process_alive", repr(trial_processes(lab.root))))
    return found
