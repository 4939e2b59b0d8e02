"""``status`` reads a SQLite store without SQLAlchemy (phasegate.store.sqlite_board):
the same rows, sums and summaries as the Store, and the Store wherever the board
cannot answer (a server, a store to migrate, an unreadable file)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
from test_gate import clean_run, graph_record, self_modifying_run

from phasegate.cli.workflows import STATUS_FINISHED_SHOWN
from phasegate.clock import SystemClock
from phasegate.config.cartridge import load_cartridge
from phasegate.config.store_url import checkout_store_url
from phasegate.store import HEAD_REVISION, AgentRunRecord, Store, open_store
from phasegate.store import tables as t
from phasegate.store.server_board import open_server_board
from phasegate.store.sqlite_board import DECODED, open_board
from phasegate.store.store import make_dialect
from phasegate.summary import workflow_summaries, workflow_summary
from phasegate.testing import FixedClock
from phasegate.web import views
from phasegate.web.views import FINISHED_SHOWN

from conftest import git, phasegate_cli


def filled_store(db: Path | str, clock: FixedClock) -> tuple[Store, dict[str, str]]:
    """A store (a SQLite file, or the store at a URL) holding what a board shows:
    usage, a fork and its parent, a lease, a finished workflow, and a graph run's
    proposals, one of them decided."""
    store = open_store(db if isinstance(db, str) else f"sqlite:///{db}", clock)
    common = {"repo_path": "/r", "base_branch": "main", "content_language": "en"}
    ids = {
        "parent": store.create_workflow(title="Parent", ticket="p", auto_merge=True, **common),
        "leased": store.create_workflow(
            title="Held", ticket="h", auto_merge=False, repository="o/n", **common
        ),
    }
    clock.advance(1.5)
    ids["child"] = store.create_workflow(
        title="Fork", ticket="c", auto_merge=False, parent_workflow_id=ids["parent"], **common
    )
    for attempt, tokens in enumerate((120, 80)):
        store.record_agent_run(
            AgentRunRecord(
                ids["parent"], "development", "build", "build", "scripted", 1, attempt,
                "ok", input_tokens=tokens, output_tokens=tokens // 4, cost_usd=0.0125,
            )
        )  # fmt: skip
    assert store.claim(ids["leased"], "host:1:abc", ttl_s=600) is not None
    store.record_run(clean_run("r1"), workflow_id=ids["parent"])
    [decided] = store.record_run(self_modifying_run("r2"), workflow_id=ids["child"])
    store.decide_proposal(decided["id"], "rejected", by="ana", reason="not now")
    store.record_run(graph_record("r3"))
    return store, ids


def test_the_board_reads_what_the_store_reads(tmp_path: Path) -> None:
    clock = FixedClock()
    store, ids = filled_store(tmp_path / "state.db", clock)
    board = open_board(f"sqlite:///{tmp_path / 'state.db'}?busy_timeout=3", clock)
    assert board is not None
    try:
        rows = store.list_workflows()
        assert board.list_workflows() == rows and len(rows) == 3
        assert [workflow_summary(board, r) for r in rows] == [
            workflow_summary(store, r) for r in rows
        ]
        summaries = {s["id"]: s for s in (workflow_summary(board, r) for r in rows)}
        assert summaries[ids["parent"]]["tokens"] == 250 and summaries[ids["parent"]]["children"]
        assert summaries[ids["leased"]]["worker"] == "host:1:abc"
        assert board.child_workflows(ids["parent"]) == store.child_workflows(ids["parent"])
        for status in (None, "proposed", "rejected"):
            for workflow_id in (None, ids["parent"], ids["child"]):
                assert board.proposals(status, workflow_id) == store.proposals(
                    status, workflow_id
                ), (status, workflow_id)
        assert board.proposals() and board.proposals("rejected")
        assert board.usage_totals(ids["parent"]) == store.usage_totals(ids["parent"])
        assert board.usage_totals("nobody") == store.usage_totals("nobody")
    finally:
        board.close()
        store.close()


def test_the_decoded_columns_are_the_tables_timestamps_json_and_booleans() -> None:
    kinds = {sa.DateTime: "timestamp", sa.JSON: "json", sa.Boolean: "boolean"}
    for name, decoded in DECODED.items():
        table = t.metadata.tables[name]
        typed = {
            c.name: kind
            for c in table.columns
            for k, kind in kinds.items()
            if isinstance(c.type, k)
        }
        assert decoded == typed, name


def test_the_store_answers_where_the_board_cannot(tmp_path: Path) -> None:
    assert open_board("postgresql://u@127.0.0.1:1/db") is None
    assert open_board("sqlite://") is None and open_board("sqlite:///:memory:") is None
    missing = tmp_path / "none" / "state.db"
    empty = open_board(f"sqlite:///{missing}")
    assert empty is not None and empty.list_workflows() == [] and not missing.parent.exists()
    store, _ids = filled_store(tmp_path / "state.db", FixedClock())
    store.close()
    with sqlite3.connect(tmp_path / "state.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0005'")
    assert open_board(f"sqlite:///{tmp_path / 'state.db'}") is None
    (tmp_path / "junk.db").write_bytes(b"not a database at all" * 100)
    assert open_board(f"sqlite:///{tmp_path / 'junk.db'}") is None


def test_status_reads_a_store_below_head_through_the_store_which_migrates_it(
    tmp_path: Path,
) -> None:
    repo = tmp_path / "repo"
    (repo / ".phasegate").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    db = repo / ".phasegate" / "state.db"
    dialect = make_dialect(f"sqlite:///{db}")
    older = Store(dialect.engine(), SystemClock(), dialect)
    older.migrate("0005")
    older.close()
    done = phasegate_cli("status", "--json", cwd=repo)
    assert (done.returncode, json.loads(done.stdout)) == (0, []), done.stderr
    with sqlite3.connect(db) as conn:
        revision = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    assert revision == (HEAD_REVISION,)


def test_status_json_from_the_board_is_the_stores(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    store, _ids = filled_store(repo / ".phasegate" / "state.db", FixedClock())
    store.close()
    store = open_store(f"sqlite:///{repo / '.phasegate' / 'state.db'}")  # the real clock
    expected = [workflow_summary(store, r) for r in store.list_workflows()]
    store.close()
    done = phasegate_cli("status", "--json", cwd=repo)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(json.dumps(expected))


@pytest.mark.parametrize(
    ("toml", "found"),
    [
        (None, "sqlite:///{repo}/.phasegate/state.db"),
        ("[workflow]\nauto_merge = true\n", "sqlite:///{repo}/.phasegate/state.db"),
        (
            '[store]\nurl = "sqlite:///data/s.db?busy_timeout=3"\n',
            "sqlite:///{repo}/data/s.db?busy_timeout=3",
        ),
        ('[store]\nurl = "sqlite:////abs/s.db"\n', "sqlite:////abs/s.db"),
        ('[store]\nurl = "postgresql://u@h/db"\n', "postgresql://u@h/db"),
        ('[store]\nurl = "sqlite:///:memory:"\n', None),
        ("[store]\nurl = 5\n", None),
        ('store = "x"\n', None),
        ("[store\n", None),
    ],
)
def test_status_finds_a_sqlite_store_without_validating_the_cartridge(
    tmp_path: Path, toml: str | None, found: str | None
) -> None:
    if toml is not None:
        (tmp_path / "phasegate.toml").write_text(toml)
    expected = found.format(repo=tmp_path) if found else None
    assert checkout_store_url(tmp_path) == expected
    if expected is not None and toml is not None:  # the validated cartridge agrees
        assert load_cartridge(tmp_path).store_url(tmp_path) == expected


def test_the_line_under_the_table_names_five_unheld_workflows_and_the_command_for_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from phasegate.cli.status_table import unheld_note

    monkeypatch.chdir(tmp_path)
    rows = [
        {"id": f"wf{n}", "status": "developing", "worker": None, "repo_path": str(tmp_path)}
        for n in range(7)
    ]
    rows.append({"id": "held", "status": "developing", "worker": "h:1:t", "repo_path": "x"})
    rows.append({"id": "mine", "status": "waiting", "worker": None, "repo_path": "x"})
    note = unheld_note(rows)
    assert note is not None
    assert note.startswith("wf0, wf1, wf2, wf3, wf4 and 2 more are not being advanced now")
    assert "`phasegate resume ID` goes on with one" in note
    assert "held" not in note and "mine" not in note  # held, or waiting for a person
    single = unheld_note(rows[:1])
    assert single is not None and "`phasegate resume wf0` goes on with it" in single


def test_summaries_read_at_once_are_those_read_one_by_one(tmp_path: Path) -> None:
    clock = FixedClock()
    store, _ids = filled_store(tmp_path / "state.db", clock)
    board = open_board(f"sqlite:///{tmp_path / 'state.db'}", clock)
    assert board is not None
    try:
        rows = store.list_workflows()
        one_by_one = [workflow_summary(store, r) for r in rows]
        assert workflow_summaries(store, rows) == one_by_one
        assert workflow_summaries(board, board.list_workflows()) == one_by_one
        assert board.board_rows(5) == store.board_rows(5)
    finally:
        board.close()
        store.close()


def test_the_board_and_status_list_the_newest_finished_and_all_with_all(happy_repo: Path) -> None:
    store = open_store(load_cartridge(happy_repo).store_url(happy_repo))
    common = {"repo_path": str(happy_repo), "base_branch": "main", "content_language": "en"}
    try:
        ids = [
            store.create_workflow(title=f"Old {n}", ticket="t", auto_merge=False, **common)
            for n in range(FINISHED_SHOWN + 5)
        ]
        with store.transaction() as conn:
            conn.execute(t.workflows.update().values(status="cancelled"))
        running = store.create_workflow(title="Going", ticket="t", auto_merge=False, **common)
        groups = {g["key"]: g for g in views.board(store, store.clock.now())}
        assert groups["done"]["total"] == len(ids)
        assert [c["id"] for c in groups["done"]["cards"]] == ids[::-1][:FINISHED_SHOWN]
        assert [c["id"] for c in groups["queued"]["cards"]] == [running]
        assert store.board_rows(3)[1] == {"done": len(ids), "failed": 0}
    finally:
        store.close()
    shown = phasegate_cli("status", "-C", str(happy_repo))
    assert shown.returncode == 0, shown.stderr
    assert running in shown.stdout and ids[-1] in shown.stdout and ids[0] not in shown.stdout
    hidden = len(ids) - STATUS_FINISHED_SHOWN
    assert f"{hidden} older finished workflows not listed" in shown.stdout
    every = phasegate_cli("status", "--all", "-C", str(happy_repo))
    assert all(i in every.stdout for i in ids) and "not listed" not in every.stdout
    listed = json.loads(phasegate_cli("status", "--json", "-C", str(happy_repo)).stdout)
    assert len(listed) == len(ids) + 1


def test_the_server_board_reads_what_the_store_reads(pg_url: str) -> None:
    clock = FixedClock()
    store, ids = filled_store(pg_url, clock)
    assert open_server_board(f"{pg_url}&busy_timeout=3") is None  # the Store's to read
    board = open_server_board(pg_url, clock)
    assert board is not None
    try:
        rows = store.list_workflows()
        assert board.list_workflows() == rows and len(rows) == 3
        assert workflow_summaries(board, rows) == [workflow_summary(store, r) for r in rows]
        assert board.board_rows(1) == store.board_rows(1)
        assert board.proposals("proposed") == store.proposals("proposed")
        assert board.usage_by_workflow([ids["parent"]]) == store.usage_by_workflow([ids["parent"]])
        assert board.child_rows() == store.child_rows()
    finally:
        board.close()
        store.close()
    assert open_server_board("postgresql://nobody@127.0.0.1:1/none") is None
