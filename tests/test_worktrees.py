"""Worktrees prepared as a developer's (docs/worktrees.md): the cartridge's ignored
files copied or linked in, its setup run once per new worktree with its output in
the workflow's events, a port range reserved per workflow and given to agents and
checks, and failed or cancelled workflows' worktrees retired.

Real git, real processes, real sockets; the port store on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from phasegate import operations
from phasegate.agents import ports
from phasegate.config.cartridge import CartridgeError, cartridge_from_document
from phasegate.core import decisions
from phasegate.core.contract import PhaseResult, WorkflowPaused
from phasegate.git.checks import run_checks
from phasegate.git.worktree_files import bring_files
from phasegate.proc.ports import range_is_free
from phasegate.runtime.engine import Engine, LeaseHeld
from phasegate.runtime.retention import expire
from phasegate.store import PortsUnavailable, Store, open_store
from phasegate.web.views import describe_event

from conftest import HAPPY_ANSWERS, git, make_repo, new_workflow, phasegate_cli, scripted_cartridge

# -- the cartridge --------------------------------------------------------------------


def test_one_string_where_a_list_goes_is_refused_with_the_list_to_write(tmp_path: Path) -> None:
    with pytest.raises(CartridgeError) as refused:
        cartridge_from_document(tmp_path, {"landing_areas": {"copy": ".env"}})
    assert 'landing_areas.copy: Input should be a valid list; write copy = [".env"]' in str(
        refused.value
    )


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("../outside.env", "climbs out of the repository"),
        ("/etc/passwd", "not relative to the repository root"),
        ("~/.aws/credentials", "not relative to the repository root"),
        (".git/config", "inside .git"),
        (".phasegate/state.db", "inside .phasegate"),
    ],
)
def test_an_entry_reaching_outside_the_repository_is_refused_naming_its_key(
    tmp_path: Path, entry: str, said: str
) -> None:
    for key in ("copy", "link"):
        with pytest.raises(CartridgeError) as refused:
            cartridge_from_document(tmp_path, {"landing_areas": {key: [".env", entry]}})
        assert f"landing_areas.{key}" in str(refused.value)
        assert said in str(refused.value)


def test_copy_skips_every_symbolic_link_whose_real_place_is_outside_the_repository(
    tmp_path: Path,
) -> None:
    outside = tmp_path / "ext"
    outside.mkdir()
    (outside / "key.txt").write_text("a key\n")
    ignored = "extdir\nout_link\nconf/\ninside_link\n"
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ignored})
    (repo / "extdir").symlink_to(outside, target_is_directory=True)
    (repo / "out_link").symlink_to(outside / "key.txt")
    (repo / "conf").mkdir()
    (repo / "conf" / "local.cfg").write_text("a=1\n")
    (repo / "conf" / "leak").symlink_to(outside / "key.txt")
    (repo / "inside_link").symlink_to(repo / "README.md")
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "--detach", str(worktree))

    brought = bring_files(
        repo, worktree, ["extdir", "extdir/key.txt", "out_link", "conf", "inside_link"]
    )
    assert brought.copied == ["conf", "inside_link"]
    skipped = {s.get("path"): s["why"] for s in brought.skipped}
    assert set(skipped) == {"extdir", "extdir/key.txt", "out_link", "conf/leak"}
    assert all(
        why.startswith("its real place is outside the repository") for why in skipped.values()
    )
    assert not any(os.path.lexists(worktree / p) for p in ("extdir", "out_link", "conf/leak"))
    assert (worktree / "conf" / "local.cfg").read_text() == "a=1\n"


# -- the port store: SQLite and PostgreSQL ---------------------------------------------


def _free_span(size: int) -> int:
    """The first of ``size`` ports all free now, below the kernel's ephemeral range (no
    outgoing connection takes one meanwhile), from a random start: tests running
    side by side rarely look at the same ports."""
    start = random.randrange(21000, 31000)
    for base in range(start, 32000 - size, size):
        if range_is_free(base, size):
            return base
    raise AssertionError(f"no {size} free ports from {start}")


def test_port_ranges_never_overlap_skip_busy_ports_and_come_back_when_the_workflow_ends(
    store_url: str,
) -> None:
    stores = [open_store(store_url), open_store(store_url)]  # two workers, one store
    try:
        ids = [new_workflow(stores[0]) for _ in range(6)]
        first = _free_span(6 * 3)
        span = (first, first + 6 * 3)
        got: dict[str, tuple[int, int]] = {}

        def reserve(i: int) -> None:
            store = stores[i % 2]
            got[ids[i]] = store.reserve_ports(ids[i], 3, host="here", free=range_is_free, span=span)

        # The machine holds a port of the first range: it is skipped.
        with socket.socket() as held:
            held.bind(("0.0.0.0", first + 1))
            threads = [threading.Thread(target=reserve, args=(i,)) for i in range(5)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        ranges = sorted(got.values())
        assert len(ranges) == 5 and all(count == 3 for _, count in ranges)
        ports = [p for base, count in ranges for p in range(base, base + count)]
        assert len(ports) == len(set(ports)), ranges  # no two overlap
        assert first + 1 not in ports  # in use on the machine
        after = (first + 3, span[1])  # the five ranges fill it
        # Held by its workflow, whichever worker asks again.
        assert (
            stores[1].reserve_ports(ids[0], 3, host="x", free=lambda *_: False, span=span)
            == (got[ids[0]])
        )
        with pytest.raises(PortsUnavailable, match="landing_areas.ports"):
            stores[0].reserve_ports(ids[5], 3, host="here", free=range_is_free, span=after)
        # An ended workflow's range goes back, in the commit that ends it.
        ctx = stores[0].load_context(ids[0])
        stores[0].commit_phase_result(ctx, PhaseResult("failed", reason="broke"))
        assert stores[0].reserved_ports(ids[0]) is None
        assert stores[0].reserve_ports(ids[5], 3, host="here", free=range_is_free, span=after)
        assert stores[1].release_ports(ids[1]) and stores[1].reserved_ports(ids[1]) is None
    finally:
        for store in stores:
            store.close()


def test_a_range_is_free_only_when_every_port_binds() -> None:
    base = _free_span(2)
    assert range_is_free(base, 2)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", base + 1))
        listener.listen()
        assert not range_is_free(base, 2)
    assert range_is_free(base, 2)  # every probe socket was closed


# -- preparation: files, setup, ports --------------------------------------------------

#: Ignored in every test repository: phasegate's own, the local config, a cache (its
#: link is a file to git: no trailing slash), what the setup leaves.
IGNORED = ".phasegate/\n.env\ncache\n.setup-ran\n"


def _repo(
    tmp_path: Path, landing: str, *, build: str | None = None, checks: list[str] = ()
) -> Path:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": IGNORED})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    cartridge = scripted_cartridge(
        auto_merge=False,
        checks=list(checks),
        role_overrides={"build": build} if build else None,
    )
    cartridge = cartridge.replace("check_timeout = 60\n", "check_timeout = 60\n" + landing)
    (repo / "phasegate.toml").write_text(cartridge)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


def _events(store: Store, workflow_id: str, kind: str) -> list[dict[str, Any]]:
    return [e["data"] for e in store.events(workflow_id) if e["type"] == kind]


def test_a_new_worktree_gets_the_copied_and_linked_files_and_the_setup_output_in_its_events(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    landing = (
        'copy = [".env", "notes.txt", "missing.cfg"]\n'
        'link = ["cache"]\n'
        'setup = \'echo "setup on port $PHASEGATE_PORT_BASE+$PHASEGATE_PORT_COUNT"; '
        "cat .env; touch .setup-ran'\n"
        "ports = 2\n"
    )
    repo = _repo(tmp_path, landing)
    (repo / ".env").write_text("LOCAL_SETTING=on\n")
    (repo / "notes.txt").write_text("a person's notes, not ignored\n")
    (repo / "cache").mkdir()
    (repo / "cache" / "big.bin").write_text("cached\n")
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row

    worktree = Path(row["worktree_path"])
    assert (worktree / ".env").read_text() == "LOCAL_SETTING=on\n"
    assert (worktree / "cache").is_symlink()
    assert (worktree / "cache").resolve() == (repo / "cache").resolve()
    assert not (worktree / "notes.txt").exists()  # not ignored: a commit would take it
    assert (worktree / ".setup-ran").exists()
    # Nothing brought reached the branch.
    committed = git(repo, "ls-tree", "-r", "--name-only", row["branch_name"]).split()
    assert not {".env", "cache", ".setup-ran", "notes.txt"} & set(committed)

    [files] = _events(store, workflow_id, "worktree_files")
    assert (files["copied"], files["linked"]) == ([".env"], ["cache"])
    skipped = {s.get("entry") or s.get("path"): s["why"] for s in files["skipped"]}
    assert skipped["missing.cfg"] == "not in the main checkout"
    assert "does not ignore" in skipped["notes.txt"]

    base, count = store.reserved_ports(workflow_id) or (0, 0)
    [setup] = _events(store, workflow_id, "worktree_setup")
    assert setup["passed"] and setup["exit_code"] == 0
    assert f"setup on port {base}+2" in setup["output"] and count == 2
    [reserved] = _events(store, workflow_id, "ports_reserved")
    assert (reserved["base"], reserved["count"]) == (base, 2)
    assert "LOCAL_SETTING=on" in setup["output"]
    # The timeline has it: the dashboard's activity line, and show's milestones.
    line = describe_event({"type": "worktree_setup", "data": setup})
    assert line.startswith("worktree setup passed: setup on port")
    shown = json.loads(phasegate_cli("show", workflow_id, "--repo", str(repo), "--json").stdout)
    [prepared] = [m for m in shown["milestones"] if m["kind"] == "worktree_setup"]
    assert prepared["status"] == "completed" and "passed" in prepared["summary"]

    # The worktree is lost: the self-heal makes it again, and prepares it again.
    git(repo, "worktree", "remove", "--force", str(worktree))
    engine.decide(workflow_id, lambda ctx: decisions.approve_merge(ctx, "ana"))
    assert engine.advance(workflow_id)["status"] == "completed"
    assert _events(store, workflow_id, "worktree_healed")
    runs = _events(store, workflow_id, "worktree_setup")
    assert [(r.get("generation"), r["passed"]) for r in runs] == [
        (1, True),
        (2, True),
        (None, True),
    ]
    assert runs[-1]["checkout"] == "merge commit"  # the acceptance checks' checkout
    assert [f["copied"] for f in _events(store, workflow_id, "worktree_files")] == [[".env"]] * 3
    assert store.reserved_ports(workflow_id) is None  # ended: its ports are back


def test_a_failing_setup_pauses_naming_the_key_and_a_resume_runs_it_again(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    ready = tmp_path / "ready"
    landing = f"setup = 'test -e {ready} || {{ echo dependencies missing; exit 3; }}; echo ok'\n"
    repo = _repo(tmp_path, landing)
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert (row["status"], row["current_phase"]) == ("paused", "preparation")
    assert "landing_areas.setup failed (exit 3)" in row["error"]
    assert "dependencies missing" in row["error"]

    ready.touch()
    engine.decide(workflow_id, decisions.resume)
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row
    runs = _events(store, workflow_id, "worktree_setup")
    assert [r["exit_code"] for r in runs] == [3, 0]
    [milestone] = [m for m in store.milestones(workflow_id) if m.kind == "worktree_setup"]
    assert milestone.status == "completed"  # the same row, settled again


def test_a_setup_timing_out_names_its_seconds_and_a_resume_finds_the_files_already_there(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    ready = tmp_path / "ready"
    landing = f'copy = [".env"]\nsetup = "test -e {ready} || sleep 30"\nsetup_timeout = 0.3\n'
    repo = _repo(tmp_path, landing)
    (repo / ".env").write_text("A=1\n")
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert (row["status"], row["current_phase"]) == ("paused", "preparation")
    said = "landing_areas.setup timed out after 0.3 s (landing_areas.setup_timeout) in "
    assert said in row["error"], row["error"]
    ready.touch()
    engine.decide(workflow_id, decisions.resume)
    assert engine.advance(workflow_id)["status"] == "waiting"
    [milestone] = [m for m in store.milestones(workflow_id) if m.kind == "worktree_setup"]
    assert milestone.summary.endswith("0 copied, 0 linked, 1 already there, 0 skipped")


def test_a_shutdown_during_the_setup_names_the_setup_not_a_check(tmp_path: Path) -> None:
    shutdown = threading.Event()
    shutdown.set()  # the worker is told to stop while the setup runs
    with pytest.raises(WorkflowPaused) as paused:
        run_checks(["sleep 30"], tmp_path, 60, shutdown, key="landing_areas.setup")
    assert str(paused.value) == "shutdown while landing_areas.setup 'sleep 30' ran"


def test_a_setup_killed_with_its_worker_runs_again_on_resume(tmp_path: Path) -> None:
    started, done = tmp_path / "started", tmp_path / "done"
    # The first run waits (its worker is killed meanwhile); the next one finishes.
    landing = (
        f"setup = 'if [ -e {started} ]; then echo second run; touch {done}; "
        f"else touch {started}; sleep 60; fi'\n"
    )
    repo = _repo(tmp_path, landing)
    exe = Path(sys.executable).parent / "phasegate"
    with subprocess.Popen(
        [str(exe), "run", "--repo", str(repo), "--json", "Add the feature"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    ) as run:
        deadline = time.monotonic() + 60
        while not started.exists():  # the setup is running
            assert run.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        os.killpg(run.pid, signal.SIGKILL)
    status = json.loads(phasegate_cli("status", "--repo", str(repo), "--json").stdout)
    [workflow_id] = [w["id"] for w in status]

    resumed = phasegate_cli("resume", workflow_id, "--repo", str(repo), "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "waiting"
    assert done.exists()
    store = open_store(f"sqlite:///{repo}/.phasegate/state.db")
    try:
        rows = [m for m in store.milestones(workflow_id) if m.kind == "worktree_setup"]
        assert [m.status for m in rows] == ["completed"]  # interrupted, then run again
        [setup] = _events(store, workflow_id, "worktree_setup")
        assert "second run" in setup["output"]
        # The resume settled the killed run first: its row and its process's.
        notes = [e["note"] for e in _events(store, workflow_id, "reconciled")]
        assert "worktree_setup: interrupted" in notes, notes
        assert any(n.startswith("orphaned check (pgid") for n in notes), notes
    finally:
        store.close()


#: A check binding every port of its workflow's range and holding them until the
#: other workflow's check holds its own (a file each in the barrier directory).
BIND_PORTS = """\
import os, pathlib, socket, sys, time
base, count = int(os.environ["PHASEGATE_PORT_BASE"]), int(os.environ["PHASEGATE_PORT_COUNT"])
held = []
for port in range(base, base + count):
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    held.append(sock)
barrier = pathlib.Path(sys.argv[1])
(barrier / str(base)).write_text(str(count))
deadline = time.monotonic() + 30
while len(list(barrier.iterdir())) < 2:
    if time.monotonic() > deadline:
        sys.exit("the other workflow's check never held its ports")
    time.sleep(0.01)
print(f"held {base}..{base + count - 1}")
"""


def test_two_concurrent_workflows_checks_bind_their_own_ports_and_agents_see_them(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    build = (
        'runner = "command"\n'
        'command = \'echo "port $PHASEGATE_PORT_BASE of $PHASEGATE_PORT_COUNT" > feature.txt; '
        "echo built'\ntimeout = 60\n"
    )
    repo = _repo(
        tmp_path,
        "ports = 3\n",
        build=build,
        checks=(f"python3 bind_ports.py {barrier}",),
    )
    (repo / "bind_ports.py").write_text(BIND_PORTS)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the port check")
    engine, store = engine_for(repo)
    ids = [engine.start(f"Feature {n}", "Write feature.txt") for n in (1, 2)]
    engine.run_worker(once=True, concurrency=2, poll_s=0.05)

    ranges = {}
    for workflow_id in ids:
        row = store.workflow_row(workflow_id)
        assert row["status"] == "waiting", (row["status"], row["error"])
        base, count = store.reserved_ports(workflow_id) or (0, 0)
        ranges[workflow_id] = range(base, base + count)
        # The build agent saw the same range its checks bound.
        feature = git(repo, "show", f"{row['branch_name']}:feature.txt")
        assert feature == f"port {base} of 3"
        [checked] = [m for m in store.milestones(workflow_id) if m.kind == "tests_run"]
        assert f"held {base}..{base + 2}" in json.dumps(checked.data)
    first, second = ranges.values()
    assert len(first) == len(second) == 3 and not set(first) & set(second)
    assert sorted(p.name for p in barrier.iterdir()) == sorted(
        str(r.start) for r in (first, second)
    )

    # Cancelling a workflow gives its ports back; the other keeps its own.
    operations.cancel(engine, ids[0], by="ana")
    assert store.reserved_ports(ids[0]) is None
    assert store.reserved_ports(ids[1]) == (second.start, 3)


# -- retention and cleanup --all -------------------------------------------------------


def _there(repo: Path, row: dict[str, Any]) -> tuple[bool, bool]:
    """Whether the workflow's worktree, and its branch, are still in ``repo``."""
    branch = git(repo, "branch", "--list", row["branch_name"])
    return Path(row["worktree_path"]).exists(), bool(branch)


def test_retention_removes_failed_and_cancelled_worktrees_after_their_days_and_nothing_else(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = _repo(tmp_path, "keep_failed_days = 2\nkeep_cancelled_days = 0\n")
    engine, store = engine_for(repo)
    ids = [engine.start(f"Feature {n}", "Write feature.txt") for n in "abcd"]
    for workflow_id in ids:
        assert engine.advance(workflow_id)["status"] == "waiting"
    failed, cancelled, waiting, failed_too = ids
    for workflow_id in (failed, failed_too):
        engine.decide(workflow_id, lambda ctx: PhaseResult("failed", reason="the build broke"))
    operations.cancel(engine, cancelled, by="ana")
    rows = {w: store.workflow_row(w) for w in ids}
    head = git(repo, "rev-parse", rows[failed]["branch_name"])

    # A worker's pass: the cancelled one's 0 days are over, the failed ones' 2 are not.
    engine.run_worker(once=True)
    assert _there(repo, rows[cancelled]) == (False, False)
    assert all(_there(repo, rows[w]) == (True, True) for w in (failed, waiting, failed_too))
    [event] = _events(store, cancelled, "worktree_retired")
    assert event["why"] == "retention" and store.workflow_row(cancelled)["status"] == "cancelled"

    now = store.clock.now()
    assert expire(engine, now + timedelta(days=1), busy=LeaseHeld) == []  # not yet
    # A person's checkout holds one branch: git refuses, nothing is committed.
    person = tmp_path / "person"
    git(repo, "worktree", "add", "-f", str(person), rows[failed_too]["branch_name"])
    retired = expire(engine, now + timedelta(days=3), busy=LeaseHeld)
    assert [(r["id"], r["retired"]) for r in retired] == [
        (failed, "completed"),
        (failed_too, "failed"),
    ]
    assert "deleting the branch" in retired[1]["reason"]
    assert _events(store, failed_too, "worktree_retired") == []
    git(repo, "worktree", "remove", str(person))
    [again] = expire(engine, now + timedelta(days=3), busy=LeaseHeld)  # tried again
    assert (again["id"], again["retired"]) == (failed_too, "completed")
    assert retired[0]["head"] == head and retired[0]["commits"] == 1
    assert retired[0]["unpushed"]  # the local forge's branches are the repository's
    assert _there(repo, rows[failed]) == _there(repo, rows[failed_too]) == (False, False)
    after = store.workflow_row(failed)
    assert (after["status"], after["error"]) == ("failed", "the build broke")  # as it was
    assert _there(repo, rows[waiting]) == (True, True)  # a waiting workflow is never touched


def test_cleanup_all_asks_first_then_removes_failed_and_cancelled_worktrees_only(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    repo = _repo(tmp_path, "")  # no retention: kept for good, until --all
    engine, store = engine_for(repo)
    cancelled, waiting = (engine.start(f"Feature {n}", "Write feature.txt") for n in "ab")
    for workflow_id in (cancelled, waiting):
        assert engine.advance(workflow_id)["status"] == "waiting"
    operations.cancel(engine, cancelled, by="ana")
    rows = {w: store.workflow_row(w) for w in (cancelled, waiting)}
    engine.run_worker(once=True)
    assert _there(repo, rows[cancelled]) == (True, True)  # retention unset: kept

    asked = phasegate_cli("cleanup", "--all", "--repo", str(repo), "--json")
    assert asked.returncode == 2 and "--yes" in json.loads(asked.stdout)["error"]["message"]
    exe = [str(Path(sys.executable).parent / "phasegate"), "cleanup", "--all", "--repo", str(repo)]
    no_terminal = subprocess.run(exe, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    assert no_terminal.returncode == 2, no_terminal.stdout + no_terminal.stderr
    assert "add --yes" in no_terminal.stdout + no_terminal.stderr
    # On a terminal, answering no is a choice: nothing removed, exit 0.
    terminal, typed = os.openpty()
    with subprocess.Popen(exe, stdin=typed, stdout=subprocess.PIPE, text=True) as asking:
        os.close(typed)
        os.write(terminal, b"n\n")
        said, _ = asking.communicate(timeout=60)
    os.close(terminal)
    assert asking.returncode == 0, said
    assert f"{cancelled} (cancelled)" in said and "nothing removed" in said
    assert _there(repo, rows[cancelled]) == (True, True)
    done = phasegate_cli("cleanup", "--all", "--yes", "--repo", str(repo), "--json", "--by", "bo")
    assert done.returncode == 0, done.stdout + done.stderr
    [outcome] = json.loads(done.stdout)
    assert (outcome["id"], outcome["cleanup"], outcome["retried"]) == (cancelled, "retired", True)
    assert outcome["retired"]["status"] == "cancelled"
    assert _there(repo, rows[cancelled]) == (False, False)
    assert _there(repo, rows[waiting]) == (True, True)  # a waiting workflow is never touched
    assert store.workflow_row(waiting)["status"] == "waiting"
    [event] = _events(store, cancelled, "worktree_retired")
    assert event["why"] == "cleanup --all by bo"
    again = phasegate_cli("cleanup", "--all", "--yes", "--repo", str(repo))
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_no_free_port_range_pauses_the_workflow_and_a_resume_goes_on(
    tmp_path: Path,
    engine_for: Callable[..., tuple[Engine, Store]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = _free_span(2)
    monkeypatch.setattr(ports, "PORT_RANGE", (first, first + 2))  # room for one range
    repo = _repo(tmp_path, "ports = 2\n")
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    with socket.socket() as taken:  # another program listens on a port of it
        taken.bind(("127.0.0.1", first + 1))
        taken.listen()
        row = engine.advance(workflow_id)
    assert row["status"] == "paused", row
    assert "landing_areas.ports: no range of 2 free ports" in row["error"]
    engine.decide(workflow_id, decisions.resume)
    assert engine.advance(workflow_id)["status"] == "waiting"
    assert store.reserved_ports(workflow_id) == (first, 2)


def test_doctor_names_a_setup_whose_program_is_missing(tmp_path: Path) -> None:
    repo = _repo(tmp_path, 'setup = "no-such-setup-tool install --frozen"\n')
    proc = phasegate_cli("doctor", "--repo", str(repo), "--json")
    assert proc.returncode == 1, proc.stdout
    [problem] = [m for m in json.loads(proc.stdout)["missing"] if "setup" in m]
    assert problem.startswith("landing_areas.setup cannot run:") and "no-such-setup-tool" in problem


def test_workflows_that_ended_during_their_preparation_leave_nothing_behind(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    # The setup fails: each workflow pauses in preparation with its branch, its
    # worktree and its copied .env there, none of them committed to its row yet.
    landing = 'copy = [".env"]\nsetup = "exit 3"\nkeep_failed_days = 0\n'
    repo = _repo(tmp_path, landing)
    (repo / ".env").write_text("SECRET=1\n")
    engine, store = engine_for(repo)
    ids = [engine.start(f"Feature {n}", "Write feature.txt") for n in "abc"]
    for workflow_id in ids:
        assert engine.advance(workflow_id)["status"] == "paused"
    cancelled, failed, paused = ids
    operations.cancel(engine, cancelled, by="ana")
    engine.decide(failed, lambda ctx: PhaseResult("failed", reason="given up"))
    root = repo / ".phasegate" / "worktrees"

    def left(workflow_id: str) -> tuple[bool, bool]:
        branches = git(repo, "branch", "--list", f"phasegate/{workflow_id}-*")
        return (root / workflow_id / ".env").exists(), bool(branches)

    assert all(left(w) == (True, True) for w in ids)
    assert store.workflow_row(cancelled)["worktree_path"] is None
    engine.run_worker(once=True)  # the failed one's 0 days are over; cancelled: kept
    assert left(failed) == (False, False)
    assert left(cancelled) == (True, True)
    done = phasegate_cli("cleanup", "--all", "--yes", "--repo", str(repo), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    [outcome] = json.loads(done.stdout)
    assert (outcome["id"], outcome["cleanup"]) == (cancelled, "retired")
    assert outcome["retired"]["worktree"] == str(root / cancelled)
    assert left(cancelled) == (False, False)
    assert left(paused) == (True, True)  # a paused workflow is never touched
    listed = git(repo, "worktree", "list")
    assert cancelled not in listed and failed not in listed and paused in listed


def test_the_merge_commit_checkout_is_prepared_as_the_worktree_was_before_its_checks(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    landing = 'copy = [".env"]\nlink = ["cache"]\nsetup = "echo set up; touch .setup-ran"\n'
    check = "grep -q LOCAL .env && test -e .setup-ran && test -e cache/big.bin"
    repo = _repo(tmp_path, landing, checks=[check])
    (repo / ".env").write_text("LOCAL_SETTING=on\n")
    (repo / "cache").mkdir()
    (repo / "cache" / "big.bin").write_text("cached\n")
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "waiting"
    engine.decide(workflow_id, lambda ctx: decisions.approve_merge(ctx, "ana"))
    row = engine.advance(workflow_id)
    assert row["status"] == "completed", row["error"]

    [verified] = [m for m in store.milestones(workflow_id) if m.kind == "acceptance_verification"]
    assert [c["passed"] for c in verified.data["checks"]] == [True]
    files = _events(store, workflow_id, "worktree_files")
    assert [(f.get("checkout"), f["copied"], f["linked"]) for f in files] == [
        (None, [".env"], ["cache"]),
        ("merge commit", [".env"], ["cache"]),
    ]
    setups = _events(store, workflow_id, "worktree_setup")
    assert [(s.get("checkout"), s["passed"]) for s in setups] == [
        (None, True),
        ("merge commit", True),
    ]
    assert "set up" in setups[1]["output"]


def test_a_setup_failing_on_the_merge_commit_fails_its_checks_and_show_prints_why(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    # The merge commit holds the build's feature.txt; the new worktree did not yet.
    landing = "setup = 'test -e feature.txt && { echo no room left; exit 4; }; true'\n"
    repo = _repo(tmp_path, landing, checks=["true"])
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    assert engine.advance(workflow_id)["status"] == "waiting"
    engine.decide(workflow_id, lambda ctx: decisions.approve_merge(ctx, "ana"))
    row = engine.advance(workflow_id)
    assert row["status"] == "paused" and "a check failed on the merge commit" in row["error"]
    [verified] = [m for m in store.milestones(workflow_id) if m.kind == "acceptance_verification"]
    [check] = verified.data["checks"]
    assert (check["exit_code"], check["output"].strip()) == (4, "no room left")
    shown = phasegate_cli("show", workflow_id, "--repo", str(repo))
    assert shown.returncode == 0, shown.stderr
    assert "✗ test -e feature.txt" in shown.stdout and "no room left" in shown.stdout
