"""Every process phasegate starts is accounted for.

Real processes only: small ``sh`` scripts whose descendants leave their process
group with ``setsid`` and sleep 600 s holding the output pipe, real ``phasegate
worker`` processes SIGKILLed while a check runs. Each survivor is named by
(pid, start ticks), so a recycled pid is never mistaken for it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from test_restart import Lab, wait_until

from phasegate.agents.process import run_agent_process
from phasegate.core.contract import WorkflowPaused
from phasegate.git.checks import run_checks
from phasegate.journal import ProcessJournal
from phasegate.proc.process import boot_id, kill_orphan_group, start_ticks
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from conftest import git, scripted_cartridge

# A descendant that leaves the process group, records (pid, start ticks) and
# sleeps 600 s with the check's stdout open; then the leader sleeps too.
ESCAPE = (
    'setsid sh -c \'echo "$$ $(cut -d" " -f22 /proc/$$/stat)" > {out}.tmp; '
    "mv {out}.tmp {out}; exec sleep 600' &\n"
)


def escaping(out: Path, then: str = "sleep 600") -> str:
    """A shell command that starts a setsid'd sleeper recording itself in ``out``."""
    return ESCAPE.format(out=out) + then


def recorded(path: Path, timeout: float = 10.0) -> tuple[int, int]:
    """The (pid, start ticks) a sleeper wrote to ``path``, once it exists."""
    wait_until(path.exists, f"{path.name} to be written", timeout=timeout)
    pid, ticks = path.read_text().split()
    return int(pid), int(ticks)


def running(pid: int, ticks: int) -> bool:
    """Whether the process started at ``ticks`` as ``pid`` still runs (zombies do not)."""
    if start_ticks(pid) != ticks:
        return False
    status = Path(f"/proc/{pid}/status")
    with contextlib.suppress(OSError):
        return "\nState:\tZ" not in status.read_text()
    return False


def gone_within(pid: int, ticks: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid, ticks):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def sleepers() -> Iterator[list[tuple[int, int]]]:
    """Sleepers a test recorded; any still running at the end is killed (and fails it)."""
    found: list[tuple[int, int]] = []
    yield found
    for pid, ticks in found:
        if running(pid, ticks):
            os.kill(pid, signal.SIGKILL)


# -- (a) timeouts, cancellation, a leader that exits --------------------------------


def test_a_check_timeout_ends_its_setsid_grandchild_and_returns_promptly(
    tmp_path: Path, sleepers: list[tuple[int, int]]
) -> None:
    out = tmp_path / "escaped"
    started = time.monotonic()
    [result] = run_checks([escaping(out)], tmp_path, timeout_s=1.5)
    took = time.monotonic() - started
    sleepers.append(recorded(out))
    assert result.timed_out and result.exit_code is None
    assert took < 6, f"run_checks took {took:.1f}s: the escaped sleeper held it up"
    assert gone_within(*sleepers[0], 2), "the setsid'd grandchild outlived the check's timeout"


def test_a_shutdown_stops_a_check_and_its_setsid_grandchild_at_once(
    tmp_path: Path, sleepers: list[tuple[int, int]]
) -> None:
    out = tmp_path / "escaped"
    cancel = threading.Event()

    def shut_down_once_escaped() -> None:
        sleepers.append(recorded(out))
        cancel.set()

    threading.Thread(target=shut_down_once_escaped, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(WorkflowPaused, match="shutdown while the check"):
        run_checks([escaping(out)], tmp_path, timeout_s=600, cancel=cancel)
    took = time.monotonic() - started
    assert took < 8, f"shutdown waited {took:.1f}s for the check"
    assert gone_within(*sleepers[0], 2), "the setsid'd grandchild outlived the shutdown"


def test_what_a_passing_check_leaves_running_is_stopped_and_does_not_hold_it_up(
    tmp_path: Path, sleepers: list[tuple[int, int]]
) -> None:
    out = tmp_path / "escaped"
    started = time.monotonic()
    # The leader waits for the sleeper to record itself, then exits 0 at once.
    [result] = run_checks(
        [escaping(out, then=f"while [ ! -e {out} ]; do sleep 0.05; done; echo done")],
        tmp_path,
        timeout_s=60,
    )
    sleepers.append(recorded(out))
    assert result.passed and result.output == "done\n"
    assert time.monotonic() - started < 6
    assert gone_within(*sleepers[0], 1), "a sleeper the check left behind still runs"


@pytest.mark.parametrize("stop", ["timeout", "interrupted"])
def test_an_agent_process_is_stopped_with_its_setsid_grandchild(
    tmp_path: Path, sleepers: list[tuple[int, int]], stop: str
) -> None:
    out = tmp_path / "escaped"
    cancel = threading.Event()
    if stop == "interrupted":
        threading.Thread(
            target=lambda: (sleepers.append(recorded(out)), cancel.set()), daemon=True
        ).start()
    spawned: list[int] = []
    started = time.monotonic()
    outcome = run_agent_process(
        "cat; " + escaping(out),
        cwd=tmp_path,
        env=dict(os.environ),
        stdin="the prompt\n",
        timeout_s=2.0 if stop == "timeout" else 600,
        cancel=cancel,
        on_spawn=spawned.append,
    )
    took = time.monotonic() - started
    if stop == "timeout":
        sleepers.append(recorded(out))
    assert outcome.stopped == stop and outcome.stdout == "the prompt\n"
    assert took < 8, f"the agent took {took:.1f}s to stop"
    assert gone_within(*sleepers[0], 2), "the agent's setsid'd grandchild outlived it"
    assert len(spawned) == 1 and not Path(f"/proc/{spawned[0]}").exists()


def test_a_supervisor_sigkilled_alone_leaves_no_setsid_grandchild_running(
    tmp_path: Path, sleepers: list[tuple[int, int]]
) -> None:
    # The OOM killer picks the supervisor, phasegate lives on: the command dies of
    # its death signal, the setsid'd sleeper (re-parented to init) would not.
    out = tmp_path / "escaped"
    spawned: list[int] = []

    def kill_the_supervisor_once_escaped() -> None:
        sleepers.append(recorded(out))
        os.kill(spawned[0], signal.SIGKILL)

    threading.Thread(target=kill_the_supervisor_once_escaped, daemon=True).start()
    started = time.monotonic()
    outcome = run_agent_process(
        escaping(out),
        cwd=tmp_path,
        env=dict(os.environ),
        stdin="",
        timeout_s=600,
        cancel=threading.Event(),
        on_spawn=spawned.append,
    )
    assert outcome.returncode == -signal.SIGKILL and outcome.stopped is None
    assert time.monotonic() - started < 8
    assert gone_within(*sleepers[0], 2), "the setsid'd grandchild outlived its supervisor"


def test_an_agent_program_that_cannot_start_is_a_spawn_error(tmp_path: Path) -> None:
    outcome = run_agent_process(
        [str(tmp_path / "no-such-agent")],
        cwd=tmp_path,
        env=dict(os.environ),
        stdin="",
        timeout_s=10,
        cancel=threading.Event(),
    )
    assert outcome.spawn_error is not None and "no-such-agent" in outcome.spawn_error


# -- (b) a worker SIGKILLed while a check runs ---------------------------------------

# The first run of the check hangs: a setsid'd sleeper (``escaped``) and one
# that stays in the check's group (``member``), each recording itself. Later
# runs only check the build's file.
CHECK_SCRIPT = """\
M={markers}
if [ ! -e "$M/check-hung" ]; then
  : > "$M/check-hung"
  setsid sh -c 'echo "$$ $(cut -d" " -f22 /proc/$$/stat)" > "$1/escaped.tmp"
    mv "$1/escaped.tmp" "$1/escaped"; exec sleep 600' _ "$M" &
  sh -c 'echo "$$ $(cut -d" " -f22 /proc/$$/stat)" > "$1/member.tmp"
    mv "$1/member.tmp" "$1/member"; exec sleep 600' _ "$M" &
  sleep 600
fi
test -f feature.txt
"""


class CheckLab(Lab):
    """Lab whose check hangs on its first run, leaving two sleepers."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        script = root / "check.sh"
        script.write_text(CHECK_SCRIPT.format(markers=self.markers))
        toml = self.repo / "phasegate.toml"
        text = toml.read_text()
        assert '"test -f feature.txt"' in text
        toml.write_text(text.replace('"test -f feature.txt"', json.dumps(f"sh {script}")))
        git(self.repo, "commit", "-q", "-am", "a check that hangs once")

    def check_supervisor(self, workflow_id: str) -> int:
        """The pgid the running check's ``check_process`` milestone names."""
        rows = self._query(
            "SELECT data FROM milestones WHERE workflow_id = ? AND kind = 'check_process' "
            "AND status = 'in_progress'",
            workflow_id,
        )
        assert len(rows) == 1, rows
        return int(json.loads(rows[0][0])["pgid"])

    def notes(self, workflow_id: str) -> list[str]:
        rows = self._query(
            "SELECT data FROM events WHERE workflow_id = ? AND type = 'reconciled'", workflow_id
        )
        return [json.loads(data)["note"] for (data,) in rows]


@pytest.fixture
def check_lab(tmp_path: Path) -> Iterator[CheckLab]:
    lab = CheckLab(tmp_path)
    try:
        yield lab
    finally:
        lab.cleanup()


def _hang_in_the_check(lab: CheckLab, sleepers: list[tuple[int, int]]) -> tuple[str, object]:
    workflow_id = lab.start()
    worker = lab.worker()
    for name in ("escaped", "member"):
        sleepers.append(recorded(lab.markers / name, timeout=60))
    assert ("development", "check_process") in lab.in_progress(workflow_id)
    return workflow_id, worker


@pytest.mark.slow
@pytest.mark.parametrize("crash", ["processes", "groups"])
def test_a_restarted_worker_stops_the_check_tree_a_crash_left_running(
    check_lab: CheckLab, sleepers: list[tuple[int, int]], crash: str
) -> None:
    """The worker and the check's supervisor die by SIGKILL together (a crash that
    spares the rest); what survives them is stopped by the restart's reconcile."""
    workflow_id, worker = _hang_in_the_check(check_lab, sleepers)
    supervisor = check_lab.check_supervisor(workflow_id)
    # Both are stopped before either is killed: the supervisor's death signal
    # fires the moment the worker dies, and a supervisor still running then
    # stops the tree itself (the next test), which is not the crash meant here.
    kill = os.kill if crash == "processes" else os.killpg
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        # processes: the two only, the check's group lives on;
        # groups: both whole groups, only the setsid'd sleeper lives on
        kill(worker.pid, sig)
        kill(supervisor, sig)
    worker.wait(timeout=10)
    escaped, member = sleepers
    time.sleep(1.0)  # nothing of ours is left to stop them: they must still run
    assert running(*escaped), "the test lost its power: the setsid'd sleeper died alone"
    if crash == "processes":
        assert running(*member), "the test lost its power: the group's sleeper died alone"

    check_lab.run_to_completion(workflow_id)
    assert not running(*escaped) and not running(*member), "a check process outlived the restart"
    notes = check_lab.notes(workflow_id)
    assert f"orphaned check (pgid {supervisor}): stopped" in notes, notes
    assert check_lab.in_progress(workflow_id) == []


@pytest.mark.slow
def test_a_check_tree_dies_with_its_sigkilled_worker(
    check_lab: CheckLab, sleepers: list[tuple[int, int]]
) -> None:
    """Only the worker is SIGKILLed: its check's supervisor notices and stops the
    whole tree, the setsid'd sleeper included, before any restart."""
    workflow_id, worker = _hang_in_the_check(check_lab, sleepers)
    supervisor = check_lab.check_supervisor(workflow_id)
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    for pid, ticks in sleepers:
        assert gone_within(pid, ticks, 5), "a check process outlived its worker"
    assert gone_within(supervisor, start_ticks(supervisor) or -1, 5)

    check_lab.run_to_completion(workflow_id)
    notes = check_lab.notes(workflow_id)
    assert f"orphaned check (pgid {supervisor}): already gone" in notes, notes


# -- the journal ----------------------------------------------------------------------


def test_each_check_process_is_journaled_in_progress_while_it_runs_then_settled(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = happy_repo
    db = repo / ".phasegate" / "state.db"
    probe = (
        "import os, sqlite3; "
        f"rows = sqlite3.connect({str(db)!r}).execute("
        "\"SELECT status FROM milestones WHERE kind = 'check_process'\").fetchall(); "
        "print(rows, os.environ['PHASEGATE_PROCESS_TAGS'])"
    )
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(checks=[shlex.join([sys.executable, "-c", probe])])
    )
    engine, store = engine_for(repo)
    workflow_id = engine.start("t", "a ticket")
    deps = engine.deps_for(store.load_context(workflow_id))

    [result] = deps.run_checks(repo)

    seen, tag = result.output.rsplit(" ", 1)
    assert result.passed and seen == "[('in_progress',)]", result.output
    [row] = [m for m in store.milestones(workflow_id) if m.kind == "check_process"]
    assert row.status == "completed" and row.phase == "preparation"
    data = row.data
    assert data["host"] == os.uname().nodename and data["boot"] == boot_id()
    # The tag the check carried names the journaled supervisor: what reconcile looks for.
    assert tag.strip() == f"{boot_id()[:8]}.{data['pgid']}.{data['ticks']}"


def test_reconcile_settles_a_process_row_from_an_earlier_boot_without_killing(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(happy_repo)
    workflow_id = engine.start("t", "a ticket")
    deps = engine.deps_for(store.load_context(workflow_id))
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        with ProcessJournal(store, workflow_id).spawning("development", "check_process") as rec:
            rec(bystander.pid, "check 'x'", "k")
            [row] = store.in_progress_milestones(workflow_id)
            store.settle_milestone(row, "in_progress", data={"boot": "an-earlier-boot"})
            notes = deps.effects.reconcile()
        assert notes == [
            f"orphaned check (pgid {bystander.pid}): already gone (the machine restarted)"
        ]
        assert bystander.poll() is None, "a process of this boot was killed for a row of another"
    finally:
        bystander.kill()
        bystander.wait()


def test_kill_orphan_group_never_kills_a_reused_pid(tmp_path: Path) -> None:
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        ticks = start_ticks(bystander.pid)
        assert ticks is not None
        # The journal named a process that started earlier with this pid: not this one.
        assert kill_orphan_group(bystander.pid, ticks - 1) is False
        assert bystander.poll() is None
        assert kill_orphan_group(bystander.pid, ticks) is True
        assert bystander.wait(timeout=5) == -signal.SIGKILL
    finally:
        bystander.kill()
        bystander.wait()
