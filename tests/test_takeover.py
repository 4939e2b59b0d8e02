"""Many repositories, many clones, one store: a worker advances only
its own repository's workflows, and a worker in another clone of the same GitHub
repository takes over a dead worker's workflow once its lease expired.

Real parts: real git clones of the fake GitHub's repository (behind Prism), a real
PostgreSQL server (and a SQLite file where the test runs on both), real
``phasegate worker`` processes, one SIGKILLed. Two machines are played on one by
``PHASEGATE_HOSTNAME``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from phasegate.clock import SystemClock
from phasegate.config.cartridge import Cartridge, load_cartridge
from phasegate.config.forge import ForgeSettings
from phasegate.core import decisions
from phasegate.core.contract import RUNNABLE_STATUSES, PhasegateError
from phasegate.phases import attempts
from phasegate.proc.host import holder_alive, host_name
from phasegate.runtime.engine import Engine
from phasegate.runtime.takeover import ForeignWorkflow, forge_repository, placed_here
from phasegate.store import Store, open_store
from phasegate.store.store import make_dialect
from phasegate.store.values import HEAD_REVISION
from phasegate.testing import InMemoryForge

from conftest import (
    ANSWERS_BUT_BUILD,
    HAPPY_ANSWERS,
    GitHubLab,
    alive,
    git,
    github_repo,
    make_repo,
    recording_build,
    scripted_cartridge,
)

PHASEGATE = Path(sys.executable).parent / "phasegate"
WAIT_S = 600.0  # bound on a wait: a failure message, never a speed judgement


def _shared_repo(path: Path, store_url: str) -> Path:
    """A repository on the local forge whose cartridge names the shared ``store_url``."""
    repo = make_repo(path, {"README.md": "# sample\n", ".gitignore": ".phasegate/\n"})
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    extra = f'[store]\nurl = "{store_url}"\n'
    (repo / "phasegate.toml").write_text(scripted_cartridge(extra=extra))
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cartridge")
    return repo


# -- a worker advances only its repository's workflows ---------------------------------


def test_a_worker_on_a_shared_store_never_claims_another_repositorys_workflow(
    store_url: str, tmp_path: Path
) -> None:
    mine, theirs = (_shared_repo(tmp_path / name, store_url) for name in ("x", "y"))
    stores: list[Store] = []
    engines = []
    for repo in (mine, theirs):
        cartridge = load_cartridge(repo)
        stores.append(open_store(cartridge.store_url(repo)))
        engines.append(Engine(repo, cartridge, stores[-1]))
    x, y = engines
    store = stores[0]
    try:
        foreign = y.start("Theirs", "Write feature.txt")
        own = x.start("Ours", "Write feature.txt")
        before = store.workflow_row(foreign)

        x.run_worker(once=True, concurrency=2)

        assert store.workflow_row(own)["status"] == "completed"
        after = store.workflow_row(foreign)
        # never claimed (the fence never moved), never advanced, nothing recorded
        assert (after["status"], after["version"], after["fence"], after["lease_owner"]) == (
            "preparing",
            before["version"],
            0,
            None,
        )
        assert [e["type"] for e in store.events(foreign)] == ["phase_change"]
        assert not git(theirs, "branch", "--list", "phasegate/*")
        # asked by hand, the engine refuses before any git or forge call
        with pytest.raises(ForeignWorkflow, match="run it from a clone of its own"):
            x.advance(foreign)
        assert store.workflow_row(foreign)["version"] == before["version"]
        assert store.milestones(foreign) == []
        # and its own repository's worker advances it
        y.run_worker(once=True)
        assert store.workflow_row(foreign)["status"] == "completed"
    finally:
        for s in stores:
            s.close()


def test_a_pass_reads_its_forge_repositorys_workflows_from_every_clone_and_its_own_paths(
    store_url: str,
) -> None:
    store = open_store(store_url)
    try:

        def new(repo_path: str, repository: str | None) -> str:
            return store.create_workflow(
                title="t",
                ticket="x",
                repo_path=repo_path,
                base_branch="main",
                auto_merge=False,
                content_language="en",
                repository=repository,
            )

        here = new("/clone-2", "octo/widgets")
        elsewhere = new("/clone-1", "octo/widgets")
        local = new("/clone-2", None)  # the local forge's, or from before 0005
        other_forge = new("/clone-2", "octo/gadgets")
        other_path = new("/clone-1", None)
        child = store.create_workflow(
            title="c",
            ticket="x",
            repo_path="/clone-1",
            base_branch="main",
            auto_merge=False,
            content_language="en",
            parent_workflow_id=elsewhere,
            phase="merge",
        )

        def ids(**mine: str | None) -> list[str]:
            return [r["id"] for r in store.lease_rows(RUNNABLE_STATUSES, **mine)]

        assert ids(repo_path="/clone-2", repository="octo/widgets") == [
            here,
            elsewhere,
            local,
            child,  # a child is of its parent's repository
        ]
        assert ids(repo_path="/clone-2", repository=None) == [local]  # not octo/gadgets
        assert ids(repo_path="/clone-1", repository=None) == [other_path]
        assert len(ids()) == 6  # unfiltered, as before
        assert store.workflow_row(child)["repository"] == "octo/widgets"
        assert other_forge not in ids(repo_path="/clone-2", repository="octo/widgets")
    finally:
        store.close()


def test_migration_0005_upgrades_a_0004_store_its_workflows_claimed_by_their_path(
    store_url: str, tmp_path: Path
) -> None:
    dialect = make_dialect(store_url)
    old = Store(dialect.engine(), SystemClock(), dialect)
    old.migrate("0004")
    assert "repository" not in {c["name"] for c in sa.inspect(old.engine).get_columns("workflows")}
    workflow_id = old.create_workflow(
        title="old",
        ticket="filed before 0005",
        repo_path="/clone-1",
        base_branch="main",
        auto_merge=False,
        content_language="en",
    )
    old.close()

    store = open_store(store_url)
    try:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == (
                HEAD_REVISION
            )
        indexes = {i["name"] for i in sa.inspect(store.engine).get_indexes("workflows")}
        assert "ix_workflows_repository" in indexes
        row = store.workflow_row(workflow_id)
        assert (row["ticket"], row["repository"]) == ("filed before 0005", None)
        mine = store.lease_rows(RUNNABLE_STATUSES, repo_path="/clone-1", repository="o/n")
        assert [r["id"] for r in mine] == [workflow_id]
        assert store.lease_rows(RUNNABLE_STATUSES, repo_path="/clone-2", repository="o/n") == []
    finally:
        store.close()


def test_a_workflow_is_moved_only_from_another_clone_of_the_same_forge_repository(
    tmp_path: Path,
) -> None:
    github = Cartridge().model_copy(
        update={"forge": ForgeSettings(kind="github", repository="Octo/Widgets")}
    )
    assert forge_repository(github, InMemoryForge()) == "octo/widgets"  # one name, any case
    assert forge_repository(Cartridge(), InMemoryForge()) is None  # the local forge
    here, trees = tmp_path / "clone-b", tmp_path / "clone-b" / ".phasegate" / "worktrees"

    def row(repo_path: Path, repository: str | None, worktree: bool = True) -> dict[str, object]:
        tree = str(repo_path / ".phasegate" / "worktrees" / "w1") if worktree else None
        return {"id": "w1", "repo_path": str(repo_path), "repository": repository,
                "worktree_path": tree}  # fmt: skip

    elsewhere = tmp_path / "clone-a"
    assert placed_here(row(elsewhere, "octo/widgets"), here, "octo/widgets", Cartridge()) == {
        "repo_path": str(here),
        "worktree_path": str(trees / "w1"),
    }
    # before preparation made a worktree, only the repository moves
    early = row(elsewhere, "octo/widgets", worktree=False)
    moved = placed_here(early, here, "octo/widgets", Cartridge())
    assert moved == {"repo_path": str(here)}
    assert placed_here(row(here, "octo/widgets"), here, "octo/widgets", Cartridge()) is None
    assert placed_here(row(here, None), here, "octo/widgets", Cartridge()) is None  # before 0005
    for foreign in (row(elsewhere, "octo/gadgets"), row(elsewhere, None), row(here, "o/x")):
        with pytest.raises(ForeignWorkflow):
            placed_here(foreign, here, "octo/widgets", Cartridge())


# -- another clone takes over --------------------------------------------------------------


def _clone(lab: GitHubLab, path: Path) -> Path:
    """A clone of the lab's octo/widgets from its git remote (the bot's token)."""
    url = f"{lab.server.url}/git/{lab.repository}.git"
    header = f"http.extraHeader=Authorization: token {lab.bot.token}"
    subprocess.run(["git", "-c", header, "clone", "-q", url, str(path)], check=True)
    return path


def _team(lab: GitHubLab, tmp_path: Path, store_url: str, review: str | None = None) -> Path:
    """octo/widgets on the lab with a cartridge naming the shared ``store_url``, a
    recording build agent and (``review``) a review role of its own; returns the
    seed checkout it was pushed from (no worker runs there)."""
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    overrides = {"build": recording_build(prompts), **({"review": review} if review else {})}
    text = scripted_cartridge(
        role_overrides=overrides, auto_merge=True, extra=f'[store]\nurl = "{store_url}"\n'
    )
    files = {"README.md": "# widgets\n", ".gitignore": ".phasegate/\n"}
    # A plan of its own for each planning cycle: a repeated one would stop as no_progress.
    plans = "".join(f'[[plan]]\ntext = "1. Write feature.txt (plan {n})"\n' for n in (2, 3))
    answers = ANSWERS_BUT_BUILD.replace("[[plan_review]]", plans + "[[plan_review]]", 1)
    return github_repo(lab, tmp_path / "seed", text, {**files, "answers.toml": answers})


def _worker(repo: Path, host: str, log: Path, ttl: float) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(PHASEGATE), "worker", "--repo", str(repo), "--concurrency", "1"]
            + ["--poll", "0.5", "--lease-ttl", str(ttl)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PHASEGATE_HOSTNAME": host, "COLUMNS": "200"},
        )


def _until(what: str, done: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until ``done()`` while ``proc`` runs; fail with its log."""
    deadline = time.monotonic() + WAIT_S
    while not done():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{what}: worker exit {proc.poll()}\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


def _pid_in(path: Path) -> bool:
    """Whether ``path`` holds a whole pid (the reviewer writes it, then sleeps)."""
    return path.exists() and path.read_text().strip().isdigit()


def _markers(lab: GitHubLab) -> Counter[str]:
    """phasegate's hidden comment markers on every issue and pull request, counted."""
    found: Counter[str] = Counter()
    for issue in lab.server.repo(lab.repository).issues.values():
        for comment in issue.comments:
            tail = (comment.body or "").rsplit("<!-- ", 1)[-1]
            found[tail.split(" -->", 1)[0]] += 1
    return found


def test_a_sigkilled_worker_is_taken_over_by_another_clone_only_after_its_lease(
    github: GitHubLab, pg_url: str, tmp_path: Path
) -> None:
    started = tmp_path / "review-started"
    # Machine A's reviewer hangs (it is killed with its machine); B's answers at once.
    review = (
        'runner = "command"\n'
        f"command = '''if [ ! -e {started} ]; then echo $$ > {started}; exec sleep 300; fi; "
        "echo \"VERDICT: approve\"'''\n"
    )
    _team(github, tmp_path, pg_url, review)
    clone_a = _clone(github, tmp_path / "machine-a" / "widgets").resolve()
    clone_b = _clone(github, tmp_path / "machine-b" / "widgets").resolve()
    gh, name = github.server, github.repository
    store = open_store(pg_url)
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    workers: list[subprocess.Popen[bytes]] = []
    try:
        cartridge = load_cartridge(clone_a)
        workflow_id = Engine(clone_a, cartridge, store).start("Add the feature", "Write it")
        assert store.workflow_row(workflow_id)["repository"] == name

        workers.append(_worker(clone_a, "machine-a", logs[0], ttl=6))
        _until("A's reviewer starts", lambda: _pid_in(started), workers[0], logs[0])
        row = store.workflow_row(workflow_id)
        assert (row["current_phase"], row["repo_path"]) == ("pr_review", str(clone_a))
        assert row["lease_owner"].startswith(f"machine-a:{workers[0].pid}:")
        branch = row["branch_name"]
        pushed = gh.repo(name).git.git("rev-parse", f"refs/heads/{branch}").strip()
        assert gh.counts(name)["pulls"] == 1
        assert git(clone_b, "branch", "--list", branch) == ""  # B never had it

        # Machine A dies: its worker and the reviewer the worker started, at once.
        (agent,) = [
            m
            for m in store.milestones(workflow_id)
            if m.kind == "agent_process" and m.status == "in_progress"
        ]
        assert agent.data["host"] == "machine-a"
        os.killpg(workers[0].pid, signal.SIGKILL)
        os.killpg(int(agent.data["pgid"]), signal.SIGKILL)
        workers[0].wait(timeout=30)
        held = store.workflow_row(workflow_id)
        expires, owner_a = held["lease_expires_at"], held["lease_owner"]
        assert owner_a.startswith("machine-a:") and expires is not None

        workers.append(_worker(clone_b, "machine-b", logs[1], ttl=6))
        seen_before_expiry = 0

        def completed() -> bool:
            nonlocal seen_before_expiry
            current = store.workflow_row(workflow_id)
            if datetime.now(UTC) < expires:  # read before the expiry: still A's
                seen_before_expiry += 1
                assert current["lease_owner"] == owner_a, current["lease_owner"]
            assert current["status"] not in ("failed", "paused"), current["error"]
            return current["status"] == "completed"

        _until("B completes the workflow", completed, workers[1], logs[1])
        assert seen_before_expiry > 0  # B was running while A's lease held
        assert not alive(int(started.read_text()))

        row = store.workflow_row(workflow_id)
        events = store.events(workflow_id)
        (moved,) = [e for e in events if e["type"] == "taken_over"]
        # B took it only once the lease had expired, and recorded where the work went
        assert moved["created_at"] >= expires
        assert moved["data"]["from_repo_path"] == str(clone_a)
        assert moved["data"]["by"].startswith(f"machine-b:{workers[1].pid}:")
        assert moved["data"]["worktree_path"] == str(clone_b / ".phasegate/worktrees" / row["id"])
        assert row["repo_path"] == str(clone_b)
        (fetched,) = [e for e in events if e["type"] == "branch_fetched"]
        assert fetched["data"]["sha"] == pushed  # the worktree was made from the pushed branch
        assert any(e["type"] == "worktree_healed" for e in events)
        assert not any(e["type"] == "branch_recreated" for e in events)

        counts = gh.counts(name)
        assert (counts["issues"], counts["pulls"], counts["merges"]) == (1, 1, 1)
        issue = gh.issue(name, row["issue_number"])
        assert issue.state == "closed"
        assert len([e for e in issue.events if e.event == "closed"]) == 1
        said = _markers(github)
        assert sum(said.values()) == counts["comments"] and max(said.values()) == 1, said
        assert gh.repo(name).git.git("rev-parse", "refs/heads/main").strip() == row["merge_sha"]
    finally:
        for proc in workers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
        store.close()


def test_a_branch_never_pushed_is_made_again_from_its_start_in_the_clone_taking_over(
    github: GitHubLab, pg_url: str, tmp_path: Path
) -> None:
    _team(github, tmp_path, pg_url)
    clone_a = _clone(github, tmp_path / "machine-a" / "widgets").resolve()
    clone_b = _clone(github, tmp_path / "machine-b" / "widgets").resolve()
    gh, name = github.server, github.repository
    store = open_store(pg_url)
    try:
        first = Engine(clone_a, load_cartridge(clone_a), store)
        workflow_id = first.start("Add the feature", "Write it")
        # A makes the issue and the branch, plans, and is gone before development
        row = first.advance(workflow_id, max_steps=2)
        assert row["current_phase"] == "development", row["error"]
        branch = row["branch_name"]
        start = git(clone_a, "rev-parse", branch)
        assert gh.repo(name).git.git("branch", "--list", branch).strip() == ""

        second = Engine(clone_b, load_cartridge(clone_b), store)
        row = second.advance(workflow_id)
        assert row["status"] == "completed", row["error"]
        events = store.events(workflow_id)
        (made,) = [e for e in events if e["type"] == "branch_recreated"]
        assert made["data"]["sha"] == start and "lost" in made["data"]["note"]
        assert row["repo_path"] == str(clone_b)
        counts = gh.counts(name)
        assert (counts["issues"], counts["pulls"], counts["merges"]) == (1, 1, 1)
        assert "feature" in gh.repo(name).git.git("show", f"{row['merge_sha']}:feature.txt")
    finally:
        store.close()


def test_a_clone_taking_a_workflow_back_takes_the_forges_branch_not_its_older_copy(
    github: GitHubLab, pg_url: str, tmp_path: Path
) -> None:
    # A builds and pushes, B takes over and builds again, A takes it back and builds
    # once more: A's push is forced (phasegate's branches are its own), so building
    # on A's older copy would push B's work away.
    _team(github, tmp_path, pg_url)
    clone_a = _clone(github, tmp_path / "machine-a" / "widgets").resolve()
    clone_b = _clone(github, tmp_path / "machine-b" / "widgets").resolve()
    gh, name = github.server, github.repository
    store = open_store(pg_url)
    try:
        first = Engine(clone_a, load_cartridge(clone_a), store)
        second = Engine(clone_b, load_cartridge(clone_b), store)
        workflow_id = first.start("Add the feature", "Write it")
        row = first.advance(workflow_id, max_steps=3)
        assert row["current_phase"] == "pr_review", row["error"]
        branch = row["branch_name"]
        older = git(clone_a, "rev-parse", branch)
        assert gh.repo(name).git.git("rev-parse", branch).strip() == older

        def back_to_planning(engine: Engine) -> None:
            engine.decide(
                workflow_id,
                lambda c: decisions.revert(c, "planning", "again", datetime.now(UTC)),
            )

        back_to_planning(second)
        row = second.advance(workflow_id, max_steps=2)  # takes over, plans, builds, pushes
        assert row["repo_path"] == str(clone_b) and row["current_phase"] == "pr_review"
        theirs = git(clone_b, "rev-parse", branch)
        assert theirs != older and gh.repo(name).git.git("rev-parse", branch).strip() == theirs

        back_to_planning(first)
        row = first.advance(workflow_id)  # takes it back, builds on the forge's, merges
        assert row["status"] == "completed", row["error"]
        assert row["repo_path"] == str(clone_a)
        merged = gh.repo(name).git.git("rev-list", row["merge_sha"]).split()
        assert theirs in merged, "B's pushed work is in what was merged"
        fetched = [e["data"] for e in store.events(workflow_id) if e["type"] == "branch_fetched"]
        assert [d.get("replaced") for d in fetched] == [None, older], fetched
        assert fetched[-1]["sha"] == theirs and "older" in fetched[-1]["note"]
        counts = gh.counts(name)
        assert (counts["issues"], counts["pulls"], counts["merges"]) == (1, 1, 1)
    finally:
        store.close()


def test_an_attempt_dead_in_another_clone_from_a_commit_never_pushed_is_discarded_here(
    github: GitHubLab, pg_url: str, tmp_path: Path
) -> None:
    _team(github, tmp_path, pg_url)
    clone_a = _clone(github, tmp_path / "machine-a" / "widgets").resolve()
    clone_b = _clone(github, tmp_path / "machine-b" / "widgets").resolve()
    gh, name = github.server, github.repository
    store = open_store(pg_url)
    try:
        first = Engine(clone_a, load_cartridge(clone_a), store)
        workflow_id = first.start("Add the feature", "Write it")
        row = first.advance(workflow_id, max_steps=2)
        assert row["current_phase"] == "development", row["error"]
        # A's build attempt started from a commit of A's own, and A died before its
        # commit and before any push: B never had that commit.
        worktree = Path(row["worktree_path"])
        git(worktree, "commit", "-q", "--allow-empty", "-m", "A's own, never pushed")
        only_a = git(worktree, "rev-parse", "HEAD")
        ctx = store.load_context(workflow_id)
        dead = attempts.Attempt(workflow_id, ctx.dev_round, 1, only_a, 0)
        store.write_milestone(workflow_id, "development", dead.journal())

        second = Engine(clone_b, load_cartridge(clone_b), store)
        row = second.advance(workflow_id)
        assert row["status"] == "completed", row["error"]
        # Nothing of A's attempt is here to discard: B's attempt 1 ran from B's branch.
        journals = {
            (m["data"]["start"] == only_a, m["status"])
            for m in store.milestone_rows(workflow_id)
            if m["kind"] == "build_attempt" and m["round"] == ctx.dev_round and m["attempt"] == 1
        }
        assert journals == {(True, "cancelled"), (False, "completed")}, journals
        counts = gh.counts(name)
        assert (counts["issues"], counts["pulls"], counts["merges"]) == (1, 1, 1)
    finally:
        store.close()


def test_phasegate_hostname_names_the_machine_in_lease_owners_and_refuses_what_breaks_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    repo = _shared_repo(tmp_path / "x", f"sqlite:///{tmp_path / 'state.db'}")
    monkeypatch.setenv("PHASEGATE_HOSTNAME", "machine-a")
    cartridge = load_cartridge(repo)
    store = open_store(cartridge.store_url(repo))
    try:
        assert Engine(repo, cartridge, store).owner.startswith(f"machine-a:{os.getpid()}:")
        monkeypatch.setenv("PHASEGATE_HOSTNAME", "machine:a")
        with pytest.raises(PhasegateError, match="must not contain ':'"):
            host_name()
        # status prints it, and the owner must fit the store's 255-character column
        monkeypatch.setenv("PHASEGATE_HOSTNAME", "evil\n\x1b[31mred")
        with pytest.raises(PhasegateError, match="spaces or control characters"):
            host_name()
        monkeypatch.setenv("PHASEGATE_HOSTNAME", "h" * 201)
        with pytest.raises(PhasegateError, match="201 characters is longer than 200"):
            host_name()
        monkeypatch.setenv("PHASEGATE_HOSTNAME", "h" * 200)
        assert host_name() == "h" * 200
    finally:
        store.close()


def test_a_holder_that_exited_unreaped_is_gone_and_a_running_one_is_not() -> None:
    # A killed worker stays a zombie until its parent reaps it: it runs nothing more.
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    stat = Path(f"/proc/{child.pid}/stat")
    deadline = time.monotonic() + 30
    while stat.read_text().rpartition(")")[2].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    try:
        assert not holder_alive(f"{host_name()}:{child.pid}:token")
        assert holder_alive(f"{host_name()}:{os.getpid()}:token")
        assert holder_alive(f"elsewhere:{child.pid}:token")  # another host's: not ours to judge
    finally:
        child.wait()
    assert not holder_alive(f"{host_name()}:{child.pid}:token")
