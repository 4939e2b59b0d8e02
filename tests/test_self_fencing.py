"""Self-fencing: an agent or check never outlives the lease it was started under.

Its supervisor holds the lease's deadline, which the heartbeat moves on after
each renewal, and stops the process tree when the deadline passes unmoved,
whether the worker is stopped (SIGSTOP), hung, or cut off from its store; a
worker that finds its lease taken over stops its agents and checks at once.

Real parts: real supervised process trees whose descendants leave their group
with ``setsid``; a caller stopped with SIGSTOP; a real store's lease taken
over; and, for the acceptance, real ``phasegate worker`` processes in two
clones of the fake GitHub's repository (behind Prism) on one real PostgreSQL
server, one of them SIGSTOPped past its lease, or cut off from the server by a
TCP relay in this process. Two machines are played on one by
``PHASEGATE_HOSTNAME``, so the worker taking over cannot reach the stale
agent: only its own supervisor can stop it.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from test_processes import escaping, recorded, running
from test_restart import wait_until

from phasegate.agents.process import run_agent_process
from phasegate.config.cartridge import load_cartridge
from phasegate.core.contract import WorkflowPaused
from phasegate.git.checks import run_checks
from phasegate.proc.deadline import KILL_SHARE, LeaseDeadline, deadline_clock, governing
from phasegate.proc.process import run_supervised
from phasegate.runtime.engine import Engine
from phasegate.runtime.heartbeat import Heartbeat
from phasegate.store import Fence, open_store

from conftest import (
    ANSWERS_BUT_BUILD,
    HAPPY_ANSWERS,
    GitHubLab,
    git,
    github_repo,
    make_repo,
    new_workflow,
    scripted_cartridge,
    writes_held,
)

PHASEGATE = Path(sys.executable).parent / "phasegate"
HOST = os.uname().nodename


@pytest.fixture
def sleepers() -> Iterator[list[tuple[int, int]]]:
    """Processes a test recorded as (pid, start ticks); any still running at the end
    is killed."""
    found: list[tuple[int, int]] = []
    yield found
    for pid, ticks in found:
        if running(pid, ticks):
            os.kill(pid, signal.SIGKILL)


def gone_within(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` (running now) exits within ``seconds``: awaited on a
    pidfd, which becomes readable as the process exits."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], seconds)
        return bool(ready)
    finally:
        os.close(fd)


def state_of(pid: int) -> str:
    """The one-letter state in /proc/PID/status ("T": stopped, "Z": zombie), "" if gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""
    match = re.search(r"^State:\s+(\S)", status, re.M)
    return match.group(1) if match else ""


# -- the supervisor's deadline ------------------------------------------------------

#: A caller of run_supervised under a lease of ``ttl`` seconds from now that is
#: never renewed: what a worker stopped right after it started an agent leaves.
CALLER = """\
import sys
from pathlib import Path
from phasegate.proc.deadline import LeaseDeadline, deadline_clock, governing
from phasegate.proc.process import run_supervised
ttl, command, cwd = float(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
with governing(LeaseDeadline(ttl, deadline_clock())):
    done = run_supervised(command, cwd=cwd, env=None, stdin=None, timeout_s=600, cancel=None)
print(done.stopped, done.returncode, flush=True)
"""


def test_a_deadline_not_renewed_stops_the_tree_of_a_stopped_caller_setsid_grandchild_included(
    tmp_path: Path, sleepers: list[tuple[int, int]]
) -> None:
    out, leader = tmp_path / "escaped", tmp_path / "leader"
    command = f"echo $$ $(cut -d' ' -f22 /proc/$$/stat) > {leader}; " + escaping(out)
    script = tmp_path / "caller.py"
    script.write_text(CALLER)
    ttl = 4.0
    caller = subprocess.Popen(
        [sys.executable, str(script), str(ttl), command, str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        sleepers.append(recorded(out))
        sleepers.append(recorded(leader))
        os.kill(caller.pid, signal.SIGSTOP)  # it can neither renew nor stop anything now
        stopped_at = time.monotonic()
        assert all(running(*s) for s in sleepers), "stopped before the deadline"
        # The deadline counts from before the caller was stopped: the tree is gone
        # by its kill instant, within the lease, the caller stopped all along.
        assert gone_within(sleepers[0][0], ttl), "the setsid'd grandchild outlived the deadline"
        assert gone_within(sleepers[1][0], 1.0), "the command outlived the deadline"
        took = time.monotonic() - stopped_at
        assert took < ttl * KILL_SHARE
        assert state_of(caller.pid) == "T"  # the supervisor did it alone
        os.kill(caller.pid, signal.SIGCONT)
        said, _ = caller.communicate(timeout=30)
        assert said.split() == ["fenced", "None"]  # the caller learns why it ended
        assert caller.returncode == 0
    finally:
        if caller.poll() is None:
            os.kill(caller.pid, signal.SIGKILL)
            os.kill(caller.pid, signal.SIGCONT)
            caller.wait()


def test_each_renewal_moves_the_deadline_on_and_the_process_runs_to_its_end(
    tmp_path: Path,
) -> None:
    ttl = 1.0  # unrenewed, the command is stopped after 0.75 s
    deadline = LeaseDeadline(ttl, deadline_clock())
    beating = threading.Event()

    def heartbeat() -> None:
        while not beating.wait(ttl / 4):
            deadline.extend(deadline_clock())

    beat = threading.Thread(target=heartbeat, daemon=True)
    beat.start()
    try:
        with governing(deadline):
            done = run_supervised(
                "sleep 2.5; echo done",
                cwd=tmp_path,
                env=None,
                stdin=None,
                timeout_s=60,
                cancel=None,
            )
    finally:
        beating.set()
        beat.join()
        deadline.close()
    assert (done.stopped, done.returncode, done.stdout) == (None, 0, "done\n")
    assert done.duration_s > 2.5 > ttl
    assert not deadline.fenced.is_set()


def test_a_command_whose_lease_deadline_passed_never_starts(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    deadline = LeaseDeadline(1.0, deadline_clock() - 10)
    with governing(deadline), pytest.raises(WorkflowPaused, match="lease was not renewed"):
        run_checks([f"touch {marker}"], tmp_path, timeout_s=60)
    assert not marker.exists()
    deadline.close()


def test_the_deadline_files_a_killed_worker_left_are_removed_by_the_next_process(
    tmp_path: Path,
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp / f"phasegate-lease-{dead.pid}-x1"  # a SIGKILLed worker's
    stale.mkdir()
    (stale / "deadline").write_text("1.0 2.0\n")
    live = tmp / f"phasegate-lease-{os.getpid()}-x2"  # a running worker's
    live.mkdir()
    lease = (
        "from phasegate.proc.deadline import LeaseDeadline, deadline_clock\n"
        "d = LeaseDeadline(60, deadline_clock()); print(d.file()); d.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", lease],
        env={**os.environ, "TMPDIR": str(tmp)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(done.stdout.strip()).parent.parent == tmp
    assert list(tmp.iterdir()) == [live]  # the stale one swept, its own closed


def test_a_lease_taken_over_stops_the_running_agent_at_once(
    store_url: str, tmp_path: Path, sleepers: list[tuple[int, int]]
) -> None:
    store = open_store(store_url)
    try:
        wf = new_workflow(store)
        owner = f"{HOST}:{os.getpid()}:a"
        fence = Fence(store, wf, owner, store.claim(wf, owner, 600) or 0)
        # A deadline far off: only the takeover can stop the agent within the test.
        deadline = LeaseDeadline(600, deadline_clock(), fence.lost)
        beat = Heartbeat(store, fence, 0.6, deadline)  # a renewal every 0.2 s
        beat.start()
        out = tmp_path / "escaped"
        taken: list[float] = []

        def take_over_once_running() -> None:
            sleepers.append(recorded(out))
            store.release(wf, owner)  # as an expiry would let it go
            assert store.claim(wf, "elsewhere:1:b", 60) == fence.value + 1
            taken.append(time.monotonic())

        thief = threading.Thread(target=take_over_once_running, daemon=True)
        thief.start()
        try:
            with governing(deadline):
                outcome = run_agent_process(
                    escaping(out),
                    cwd=tmp_path,
                    env=dict(os.environ),
                    stdin="the prompt\n",
                    timeout_s=30,
                    cancel=threading.Event(),
                )
            ended = time.monotonic()
        finally:
            thief.join(10)
            beat.stopped.set()
            beat.join(5)
            deadline.close()
        assert outcome.stopped == "fenced", outcome
        assert outcome.failure(30) is not None
        assert outcome.failure(30).error_kind == "self_fenced"  # type: ignore[union-attr]
        assert ended - taken[0] < 3.0, f"the agent ran {ended - taken[0]:.1f}s past the takeover"
        assert fence.lost.is_set() and deadline.fenced.is_set()
        assert not running(*sleepers[0]), "the setsid'd grandchild outlived the takeover"
    finally:
        store.close()


def test_an_agent_stopped_at_its_deadline_under_a_lease_still_held_pauses_the_phase(
    tmp_path: Path,
) -> None:
    # The store takes no write for longer than the margin the deadline leaves, but
    # for less than the lease: the build is stopped, the lease stays this worker's,
    # and the phase starts again from its last commit.
    started, first = tmp_path / "build-started", tmp_path / "first-build"
    script = (
        f"echo $$ >> {started}; if [ ! -e {first} ]; then touch {first}; exec sleep 60; fi; "
        "echo the feature > feature.txt; echo built"
    )
    build = f"runner = \"command\"\ntimeout = 60\ncommand = '''{script}'''\n"
    repo = make_repo(tmp_path / "repo", {"README.md": "# s\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge(role_overrides={"build": build}))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    url = f"sqlite:///{repo / '.phasegate' / 'state.db'}"
    store = open_store(url, busy_timeout_s=10)
    ttl = 3.0
    engine = Engine(repo, load_cartridge(repo), store, lease_ttl_s=ttl)
    wf = engine.start("Add the feature file", "Add feature.txt.")
    try:

        def hold_writes_once_building() -> None:
            wait_until(started.exists, "the build agent to start")
            with writes_held(url):  # past the deadline (3/4 of the TTL), short of the TTL
                time.sleep(ttl * 0.85)

        holder = threading.Thread(target=hold_writes_once_building)
        holder.start()
        row = engine.advance(wf)
        holder.join(30)
        (agent,) = (int(pid) for pid in started.read_text().split())
        assert gone_within(agent, 0), "the stopped build still runs"
        assert (row["current_phase"], row["status"]) == ("development", "developing"), row
        (fenced,) = [e for e in store.events(wf) if e["type"] == "self_fenced"]
        assert fenced["data"]["phase"] == "development"
        assert "build agent was stopped" in fenced["data"]["note"]
        assert [r["role"] for r in store.agent_runs(wf)] == ["plan", "plan_review"]

        row = engine.advance(wf)  # the next pass takes it up again
        assert row["status"] == "completed", row["error"]
        assert len(started.read_text().split()) == 2
        assert [r["role"] for r in store.agent_runs(wf)].count("build") == 1
    finally:
        store.close()


# -- two clones on PostgreSQL: the acceptance -------------------------------------------

TTL_S = 6.0  # the workers' lease: a renewal every 2 s


def _build_role(ticks: Path, first: Path) -> str:
    """A build agent that logs ``start``, a ``tick`` every 0.2 s and ``end`` with its
    pid and the time to ``ticks``: 30 s of ticks the first time it runs (``first``
    is not there yet), 1 s after that."""
    script = (
        f"if [ ! -e {first} ]; then touch {first}; n=150; else n=5; fi; "
        f'echo "start $$ $(date +%s.%N)" >> {ticks}; i=0; '
        f'while [ $i -lt $n ]; do echo "tick $$ $(date +%s.%N)" >> {ticks}; sleep 0.2; '
        "i=$((i+1)); done; echo feature $$ > feature.txt; "
        f'echo "end $$ $(date +%s.%N)" >> {ticks}; echo built'
    )
    return f"runner = \"command\"\ncommand = '''{script}'''\ntimeout = 120\n"


def _spans(ticks: Path) -> dict[int, tuple[float, float]]:
    """Each build agent's pid → (its first, its last line's time), in seconds."""
    spans: dict[int, tuple[float, float]] = {}
    if not ticks.exists():
        return spans
    for line in ticks.read_text().splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue  # a line being written
        pid, at = int(parts[1]), float(parts[2])
        first, _last = spans.get(pid, (at, at))
        spans[pid] = (first, at)
    return spans


def _clone(lab: GitHubLab, path: Path) -> Path:
    url = f"{lab.server.url}/git/{lab.repository}.git"
    header = f"http.extraHeader=Authorization: token {lab.bot.token}"
    subprocess.run(["git", "-c", header, "clone", "-q", url, str(path)], check=True)
    return path.resolve()


def _worker(repo: Path, host: str, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(PHASEGATE), "worker", "--repo", str(repo), "--concurrency", "1"]
            + ["--poll", "0.5", "--lease-ttl", str(TTL_S)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PHASEGATE_HOSTNAME": host, "COLUMNS": "200", **env},
        )


class Relay:
    """A TCP relay on 127.0.0.1 to ``host:port`` that ``cut()`` severs: every relayed
    connection is closed and new ones are refused (nothing listens any more)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.severed = False
        threading.Thread(target=self._accept, daemon=True, name="relay").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # cut
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.severed:
                    client.close()
                    upstream.close()
                    return
                self.sockets += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for end in (src, dst):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self.lock:
            self.severed = True
            with contextlib.suppress(OSError):
                self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
            self.listener.close()
            for end in self.sockets:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()


def _stale_agent_never_overlaps(
    lab: GitHubLab,
    tmp_path: Path,
    url: str,
    cartridge_url: str,
    env_a: dict[str, str],
    env_b: dict[str, str],
    fault: Callable[[subprocess.Popen[bytes]], None],
    after: Callable[[subprocess.Popen[bytes]], None],
    then: Callable[[subprocess.Popen[bytes], Path], None],
) -> float:
    """Two clones, A's worker first; ``fault(A)`` while A's long build agent runs;
    B takes over; ``after(A)`` once B's build started. Checks that A's agent was
    gone within the lease and that no two build agents, nor two agent runs of the
    workflow, ever overlapped; then ``then(A, A's log)`` while A still runs.
    Returns how long (seconds) A's agent outlived the fault."""
    ticks, first = tmp_path / "ticks", tmp_path / "first-build"
    text = scripted_cartridge(
        role_overrides={"build": _build_role(ticks, first)},
        auto_merge=True,
        extra=f'[store]\nurl = "{cartridge_url}"\n',
    )
    files = {"README.md": "# widgets\n", ".gitignore": ".phasegate/\n"}
    github_repo(lab, tmp_path / "seed", text, {**files, "answers.toml": ANSWERS_BUT_BUILD})
    clone_a = _clone(lab, tmp_path / "machine-a" / "widgets")
    clone_b = _clone(lab, tmp_path / "machine-b" / "widgets")
    store = open_store(url)
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    workers: list[subprocess.Popen[bytes]] = []

    def tails() -> str:
        return "\n".join(log.read_text(errors="replace")[-3000:] for log in logs if log.exists())

    try:
        workflow_id = Engine(clone_a, load_cartridge(clone_a), store).start("Add it", "Write it")
        workers.append(_worker(clone_a, "machine-a", logs[0], env_a))
        (agent_a,) = wait_until(lambda: list(_spans(ticks)), "A's build agent to start", 120, tails)
        assert store.workflow_row(workflow_id)["lease_owner"].startswith("machine-a:")
        workers.append(_worker(clone_b, "machine-b", logs[1], env_b))

        fault(workers[0])
        faulted = time.monotonic()
        assert gone_within(agent_a, TTL_S), f"A's agent outlived its lease\n{tails()}"
        outlived = time.monotonic() - faulted

        def b_building() -> bool:
            return any(pid != agent_a for pid in _spans(ticks))

        wait_until(b_building, "B's build agent to start", 120, tails)
        after(workers[0])

        def completed() -> bool:
            status = store.workflow_row(workflow_id)["status"]
            assert status not in ("failed", "paused"), tails()
            return status == "completed"

        wait_until(completed, "B to complete the workflow", 180, tails)

        # No two build agents ever ran at once: A's last tick came before B's start.
        spans = sorted(_spans(ticks).values())
        assert len(spans) == 2, spans
        assert spans[0][1] < spans[1][0], f"two builds overlapped: {spans}"
        # Nor two recorded agent runs of the workflow.
        runs = sorted(
            (r["created_at"] - timedelta(seconds=r["duration_s"]), r["created_at"])
            for r in store.agent_runs(workflow_id)
        )
        assert runs and all(a[1] <= b[0] for a, b in zip(runs, runs[1:], strict=False)), runs
        row = store.workflow_row(workflow_id)
        assert row["repo_path"] == str(clone_b) and row["merge_sha"]
        counts = lab.server.counts(lab.repository)
        assert (counts["issues"], counts["pulls"], counts["merges"]) == (1, 1, 1)
        # B could not reach A's agent: it said so, and who stopped it.
        notes = [e["data"]["note"] for e in store.events(workflow_id) if e["type"] == "reconciled"]
        assert any("(pgid " in n and "on host machine-a, not reachable" in n for n in notes), notes
        then(workers[0], logs[0])
        return outlived
    finally:
        for proc in workers:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                    os.killpg(proc.pid, signal.SIGCONT)
                proc.wait(timeout=60)
        store.close()


def test_a_worker_stopped_past_its_lease_leaves_no_agent_beside_the_one_taking_over(
    github: GitHubLab, pg_url: str, tmp_path: Path
) -> None:
    def continued(a: subprocess.Popen[bytes], log: Path) -> None:
        # A, continued, found its lease taken over and stopped without a word more.
        wait_until(lambda: "this worker stops" in log.read_text(), "A to see the takeover", 30)
        assert a.poll() is None, log.read_text()
        assert "Traceback" not in log.read_text()

    outlived = _stale_agent_never_overlaps(
        github,
        tmp_path,
        pg_url,
        pg_url,
        {},
        {},
        fault=lambda a: os.killpg(a.pid, signal.SIGSTOP),
        after=lambda a: os.killpg(a.pid, signal.SIGCONT),
        then=continued,
    )
    assert outlived < TTL_S * KILL_SHARE


def test_a_worker_cut_off_from_postgresql_leaves_no_agent_beside_the_one_taking_over(
    github: GitHubLab, pg_url: str, tmp_path: Path
) -> None:
    server = sa.engine.make_url(pg_url)
    host, port = server.host or "127.0.0.1", server.port or 5432
    # One cartridge for both clones, its URL without a host: each worker's PGHOST and
    # PGPORT say where its PostgreSQL is. A's is the relay.
    hostless = pg_url.replace(f"@{host}:{port}/", "@/", 1)
    assert hostless != pg_url
    relay = Relay(host, port)

    def riding_it_out(a: subprocess.Popen[bytes], log: Path) -> None:
        assert a.poll() is None, log.read_text()
        said = log.read_text()
        assert "expired unrenewed" in said and "Traceback" not in said, said

    outlived = _stale_agent_never_overlaps(
        github,
        tmp_path,
        pg_url,
        hostless,
        {"PGHOST": "127.0.0.1", "PGPORT": str(relay.port)},
        {"PGHOST": host, "PGPORT": str(port)},
        fault=lambda a: relay.cut(),
        after=lambda a: None,
        then=riding_it_out,
    )
    assert outlived < TTL_S * KILL_SHARE
