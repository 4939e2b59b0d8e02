"""Many repositories, many clones, one store (issue 12, item 2): a worker advances only
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
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from phasegate.cartridge import load_cartridge
from phasegate.clock import SystemClock
from phasegate.contract import RUNNABLE_STATUSES
from phasegate.engine import Engine
from phasegate.store import Store, open_store
from phasegate.store.store import make_dialect
from phasegate.takeover import ForeignWorkflow

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
                "0005"
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
