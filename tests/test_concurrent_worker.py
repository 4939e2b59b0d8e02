"""The concurrent worker.

Real ``phasegate worker`` processes with ``--concurrency`` on one repository
and one store (the acceptance run on a SQLite file and on a PostgreSQL schema):
many workflows advanced at once, each under its own lease, never one by two
threads; a shutdown stops every running agent and the
workflows resume; ``status`` names the worker holding each; a dead worker's
leases are taken back a batch at a time.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_flaky_git import distinct_builds_repo

from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import Store, open_store

from conftest import HAPPY_ANSWERS, alive, git, make_repo, scripted_cartridge

PHASEGATE = Path(sys.executable).parent / "phasegate"
#: The bar is 120 (two workers × concurrency 8); fewer while developing.
WORKFLOWS = int(os.environ.get("PHASEGATE_TEST_CONCURRENT_WORKFLOWS", "120"))
WAIT_S = 1200.0  # bound on the whole run: a failure message, never a speed judgement


def _worker(repo: Path, log: Path, concurrency: int, poll: float = 1.0) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                str(PHASEGATE),
                "worker",
                "--repo",
                str(repo),
                "--concurrency",
                str(concurrency),
                "--poll",
                str(poll),
            ],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "COLUMNS": "200"},
        )


def _stop(proc: subprocess.Popen[bytes], timeout: float = 60) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode


def _settle(store: Store, ids: list[str], logs: list[Path], wanted: str = "completed") -> None:
    """Wait until every workflow is ``wanted``; fail at once on a failed or paused one."""
    deadline = time.monotonic() + WAIT_S
    while True:
        rows = [store.workflow_row(i) for i in ids]
        if all(r["status"] == wanted for r in rows):
            return
        stuck = [r for r in rows if r["status"] in ("failed", "paused", "cancelled")]
        if stuck or time.monotonic() > deadline:
            tails = "\n".join(p.read_text(errors="replace")[-3000:] for p in logs)
            late = [(r["id"], r["current_phase"], r["status"]) for r in rows if r not in stuck]
            raise AssertionError(
                f"{[(r['id'], r['status'], r['error']) for r in stuck]} {late[:5]}\n{tails}"
            )
        time.sleep(0.5)


def _count(store: Store, sql: str) -> list[tuple[object, ...]]:
    with store.reading() as conn:
        return [tuple(r) for r in conn.exec_driver_sql(sql).all()]


def _on_store(repo: Path, url: str) -> None:
    """Point the repository's cartridge at the store ``url`` (committed: workers read it)."""
    cartridge = repo / "phasegate.toml"
    cartridge.write_text(cartridge.read_text() + f'\n[store]\nurl = "{url}"\n')
    git(repo, "commit", "-q", "-am", "store")


def test_two_workers_of_concurrency_8_complete_120_workflows_with_no_duplicate(
    tmp_path: Path, store_url: str
) -> None:
    repo = distinct_builds_repo(tmp_path / "repo")
    _on_store(repo, store_url)
    cartridge = load_cartridge(repo)
    assert cartridge.store_url(repo) == store_url
    store = open_store(cartridge.store_url(repo))
    engine = Engine(repo, cartridge, store)
    logs = [tmp_path / "worker-1.log", tmp_path / "worker-2.log"]
    workers = []
    try:
        ids = [engine.start(f"feature {n}", "ticket") for n in range(WORKFLOWS)]
        workers = [_worker(repo, log, concurrency=8) for log in logs]
        _settle(store, ids, logs)
        merge_shas = [store.workflow_row(i)["merge_sha"] for i in ids]
        issues = _count(store, "SELECT count(*), count(DISTINCT number) FROM forge_issues")
        prs = _count(store, "SELECT count(*), count(DISTINCT head) FROM forge_pull_requests")
        twice = _count(
            store,
            "SELECT marker FROM forge_comments WHERE marker IS NOT NULL "
            "GROUP BY marker HAVING count(*) > 1",
        )
        stuck = _count(store, "SELECT workflow_id, kind FROM milestones WHERE status='in_progress'")
    finally:
        codes = [_stop(proc) for proc in workers]
        store.close()

    assert issues == [(WORKFLOWS, WORKFLOWS)], "one issue per workflow"
    assert prs == [(WORKFLOWS, WORKFLOWS)], "one pull request per workflow"
    assert twice == [], "no comment posted twice"
    assert stuck == [], "no side effect left in_progress"
    merges = git(repo, "rev-list", "--merges", "--first-parent", "main").split()
    assert sorted(merges) == sorted(merge_shas), "one merge on main per workflow"
    on_main = git(repo, "ls-tree", "--name-only", "main").split()
    assert sorted(n.removesuffix(".txt") for n in on_main if n.endswith(".txt")) == sorted(ids)
    texts = [p.read_text(errors="replace") for p in logs]
    assert all("Traceback" not in text and "cannot lock ref" not in text for text in texts)
    # both processes advanced workflows: the run was two workers', not one's
    assert all(sum(text.count(f"{i} → ") for i in ids) > 0 for text in texts), texts
    assert codes == [130, 130], "each worker stopped cleanly on SIGTERM"


# The build agent: records its pid, then sleeps while the config says hang.
AGENT = """\
import json, os, pathlib, sys, time
cfg = json.loads(pathlib.Path(sys.argv[1]).read_text())
sys.stdin.read()
here = pathlib.Path.cwd()
(pathlib.Path(cfg["pids"]) / str(os.getpid())).write_text(here.name)
if cfg["hang"]:
    time.sleep(600)
(here / (here.name + ".txt")).write_text("built\\n")
print("wrote it")
"""


def _hanging_builds_repo(root: Path) -> tuple[Path, Path, Path]:
    """A repository whose build agent hangs until its config says otherwise; returns
    the repository, the config file and the directory of the agents' pid files."""
    repo = make_repo(root / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    pids = root / "pids"
    pids.mkdir()
    config = root / "agent.json"
    config.write_text(json.dumps({"pids": str(pids), "hang": True}))
    agent = root / "agent.py"
    agent.write_text(AGENT)
    command = json.dumps(shlex.join([sys.executable, str(agent), str(config)]))
    build = f'runner = "command"\ncommand = {command}\ntimeout = 900\n'
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge(role_overrides={"build": build}))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo, config, pids


def _wait_for(probe, what: str, logs: list[Path], timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            tails = "\n".join(p.read_text(errors="replace")[-3000:] for p in logs)
            raise AssertionError(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.1)


def test_shutdown_stops_every_running_agent_and_the_workflows_resume_to_completion(
    tmp_path: Path,
) -> None:
    running = 4
    repo, config, pids = _hanging_builds_repo(tmp_path)
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    engine = Engine(repo, cartridge, store)
    logs = [tmp_path / "worker-1.log", tmp_path / "worker-2.log"]
    try:
        ids = [engine.start(f"feature {n}", "ticket") for n in range(running)]
        first = _worker(repo, logs[0], concurrency=running)
        try:
            _wait_for(lambda: len(list(pids.iterdir())) == running, "every build agent", logs)
            # status names the worker holding each workflow while it runs
            shown = subprocess.run(
                [str(PHASEGATE), "status", "--repo", str(repo), "--json"],
                capture_output=True,
                text=True,
                check=True,
            )
            holders = {r["id"]: r["worker"] for r in json.loads(shown.stdout)}
            table = subprocess.run(
                [str(PHASEGATE), "status", "--repo", str(repo)],
                capture_output=True,
                text=True,
                check=True,
                env={**os.environ, "COLUMNS": "200"},
            ).stdout
        finally:
            code = _stop(first, timeout=120)
        agents = [int(p.name) for p in pids.iterdir()]
        said = logs[0].read_text(errors="replace")
        assert code == 130, said[-3000:]
        assert not any(alive(pid) for pid in agents), "an agent outlived its worker"
        # The notice names what the signal stopped: the workflows running then.
        notice = " ".join(said[said.index("stopping the worker") :].split())
        assert f"{running} running workflow(s)" in notice, said[-3000:]
        assert all(i in notice for i in ids), notice
        assert sorted(holders) == sorted(ids)
        assert all(
            str(h).startswith(f"{os.uname().nodename}:{first.pid}:") for h in holders.values()
        )
        assert f"{os.uname().nodename}:{first.pid}" in table and "worker" in table
        rows = [store.workflow_row(i) for i in ids]
        assert [(r["current_phase"], r["status"]) for r in rows] == [
            ("development", "developing")
        ] * running, "each interrupted phase is left resumable, not failed"
        assert all(r["lease_owner"] is None for r in rows), "every lease released"
        paused = [e for i in ids for e in store.events(i) if e["type"] == "paused_by_shutdown"]
        assert len(paused) == running

        config.write_text(json.dumps({"pids": str(pids), "hang": False}))
        second = _worker(repo, logs[1], concurrency=running)
        try:
            _settle(store, ids, logs)
        finally:
            _stop(second)
        assert [store.workflow_row(i)["status"] for i in ids] == ["completed"] * running
    finally:
        store.close()


def test_an_idle_worker_stopped_says_nothing_was_running(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge())
    log = tmp_path / "worker.log"
    worker = _worker(repo, log, concurrency=2)
    # Up and waiting: its store exists once it has migrated it.
    _wait_for(lambda: (repo / ".phasegate" / "state.db").exists(), "the worker's store", [log])
    time.sleep(1.0)
    code = _stop(worker)
    said = " ".join(log.read_text(errors="replace").split())
    assert code == 130, said
    assert "stopping the worker: no workflow was running" in said
    assert "resume" not in said, "nothing was stopped, so there is nothing to resume"


def test_a_workers_progress_lines_each_name_their_workflow(happy_repo: Path) -> None:
    repo = happy_repo
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    try:
        engine = Engine(repo, cartridge, store)
        ids = [engine.start(f"feature {n}", f"ticket {n}") for n in range(2)]
    finally:
        store.close()
    done = subprocess.run(
        [str(PHASEGATE), "worker", "--repo", str(repo), "--once", "--concurrency", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    # Two workflows' lines interleave: each says whose it is.
    lines = [line.split("s ", 1)[-1] for line in done.stderr.splitlines()]
    for workflow_id in ids:
        assert f"{workflow_id} → planning" in lines, done.stderr
        assert f"  {workflow_id}: plan agent (scripted), round 1" in lines, done.stderr
    steps = [line for line in lines if line.startswith("  ")]
    assert steps and all(line.split(":")[0].strip() in ids for line in steps), done.stderr


def test_a_dead_workers_leases_are_taken_back_in_one_statement_and_a_live_ones_kept(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo", {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    (repo / "phasegate.toml").write_text(scripted_cartridge())
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    try:
        engine = Engine(repo, cartridge, store)
        ids = [engine.start(f"feature {n}", "ticket") for n in range(12)]
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()  # a pid of this host with no process behind it
        dead = f"{os.uname().nodename}:{gone.pid}:dead"
        live = f"{os.uname().nodename}:{os.getpid()}:live"
        for workflow_id in ids[:10]:
            assert store.claim(workflow_id, dead, 600) == 1
        for workflow_id in ids[10:]:
            assert store.claim(workflow_id, live, 600) == 1

        assert store.claim_free(ids, "me", 60, limit=3) == {i: 2 for i in ids[:3]}, "oldest first"
        taken = store.claim_free(ids, "me", 60)
        assert taken == {i: 2 for i in ids[3:10]}, "the dead one's, not the live one's"
        assert store.claim_free(ids, "me", 60) == {}, "its own leases are not free to it"
        rows = [store.workflow_row(i) for i in ids]
        assert [r["lease_owner"] for r in rows] == ["me"] * 10 + [live] * 2
    finally:
        store.close()
