"""Daily and monthly budgets: a workflow pauses with ``budget`` when one is spent and goes
on once a person raises it; spend grouped by ``phasegate costs``, on SQLite and
PostgreSQL (the ``store_url`` fixture)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from test_phases import Build, answers, repo_with

from phasegate.agents.budgets import budgets_of, calendar_budget, since_of
from phasegate.config.cartridge import Cartridge
from phasegate.store import AgentRunRecord, Store, open_store
from phasegate.store.budgets import STORE_SCOPE, BudgetRefused
from phasegate.testing import FixedClock
from phasegate.web import Access, create_app
from phasegate.web.auth import Person, Role

from conftest import git, phasegate_in_process

#: Every call costs a cent: plan and plan_review spend 0.02 before development.
PRICED = (
    answers()
    .replace('text = "the plan"', 'text = "the plan"\ncost_usd = 0.01\ninput_tokens = 100')
    .replace('text = "VERDICT: approve"', 'text = "VERDICT: approve"\ncost_usd = 0.01')
    .replace('"wrote feature.txt"', '"wrote feature.txt"\ncost_usd = 0.01')
)


def test_a_daily_budget_spent_mid_workflow_pauses_it_and_raising_it_lets_it_finish(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = repo_with(tmp_path, PRICED, extra="[limits]\ndaily_budget_usd = 0.015\n")
    engine, store = engine_for(repo)
    row = engine.advance(engine.start("t", "ticket"))
    wf = row["id"]
    # plan (0.01) left 0.005; plan_review crossed it; build is not called.
    assert (row["current_phase"], row["status"]) == ("development", "paused")
    assert [r["role"] for r in store.agent_runs(wf)] == ["plan", "plan_review"]
    reason = row["error"]
    # Said once, readable, the commands within what a notification keeps (300 characters).
    assert reason.startswith(
        f"budget: the daily budget of repository {repo} is spent ($0.0200 of $0.0150, "
        f"UTC day {store.clock.now():%Y-%m-%d}) before the build agent ran; raise it: "
        f"phasegate budget set --daily USD, then phasegate resume {wf} "
    )
    assert reason.count("budget:") == 1 and "before the call" not in reason
    assert reason.endswith("(the budget is set by [limits] daily_budget_usd in phasegate.toml)")
    assert f"phasegate resume {wf}" in reason[:300]

    shown = phasegate_in_process("budget", "--json", "-C", str(repo))
    assert shown.returncode == 0, shown.stderr
    (daily,) = json.loads(shown.stdout)["budgets"]
    assert (daily["source"], daily["spent_usd"], daily["reached"]) == ("cartridge", 0.02, True)

    # The store's setting wins over the cartridge's: raised without a commit.
    raised = phasegate_in_process("budget", "set", "--daily", "1", "--json", "-C", str(repo))
    assert raised.returncode == 0, raised.stderr
    said = json.loads(raised.stdout)
    assert [p["id"] for p in said["paused"]] == [wf] and said["next"] == f"phasegate resume {wf}"
    assert said["budgets"][0]["source"] == "store" and said["budgets"][0]["limit_usd"] == 1.0

    resumed = phasegate_in_process("resume", wf, "--json", "-C", str(repo))
    assert json.loads(resumed.stdout)["status"] == "completed", resumed.stdout

    costs = phasegate_in_process("costs", "--by", "role", "--json", "-C", str(repo))
    report = json.loads(costs.stdout)
    by_role = {r["key"]: (r["cost_usd"], r["calls"]) for r in report["rows"]}
    assert by_role["plan"] == (0.01, 1) and by_role["build"] == (0.01, 1)
    assert report["total"]["calls"] == len(store.agent_runs(wf))
    assert report["total"]["input_tokens"] == 100


def test_a_store_wide_budget_pauses_every_repository_and_names_the_all_flag(
    tmp_path: Path, engine_for: Build
) -> None:
    repo = repo_with(tmp_path, PRICED)
    engine, store = engine_for(repo)
    store.set_budget(STORE_SCOPE, {"monthly": 0.005}, by="ops")
    row = engine.advance(engine.start("t", "ticket"))
    assert (row["current_phase"], row["status"]) == ("planning", "paused")
    assert "the monthly budget of the whole store is spent ($0.0100 of $0.0050" in row["error"]
    assert "raise it: phasegate budget set --monthly USD --all, then" in row["error"]
    assert store.budget_pauses() == [
        {"id": row["id"], "title": "t", "repository": str(repo), "error": row["error"]}
    ]

    def budget_set(*args: str, json_out: bool = True) -> dict:
        flags = ("--json",) if json_out else ()
        done = phasegate_in_process("budget", "set", *args, *flags, "-C", str(repo))
        said = json.loads(done.stdout) if json_out else {"out": done.stdout}
        return {"code": done.returncode, **said}

    # Raising this repository's budget leaves the store's monthly one spent: resuming
    # would only pause the workflow again, so the listing names what still blocks.
    raised = budget_set("--daily", "2", "--repository", str(repo))
    (still,) = raised["paused"]
    assert [(b["scope"], b["kind"]) for b in still["blocked_by"]] == [(STORE_SCOPE, "monthly")]
    assert raised["next"] == still["next"] == "phasegate budget set --monthly USD --all"
    said = budget_set("--daily", "3", json_out=False)["out"]
    assert "the monthly budget of the whole store ($0.0100 of $0.0050) is still spent" in said
    assert "carries it on" not in said
    widened = budget_set("--monthly", "1", "--all")
    assert (widened["scope"], [p["id"] for p in widened["paused"]]) == ("*", [row["id"]])
    assert widened["paused"][0]["blocked_by"] == []
    assert widened["next"] == f"phasegate resume {row['id']}"
    # No budget left for the scope: a sentence, not an empty table.
    cleared = budget_set("--daily", "none", "--monthly", "none", json_out=False)["out"]
    assert f"{repo} has no daily or monthly budget now" in cleared and "┃" not in cleared

    # A forge repository is budgeted here once this store holds its workflows.
    unknown = budget_set("--daily", "2", "--repository", "Octo/Widgets")
    assert unknown["code"] == 2 and unknown["error"]["kind"] == "BudgetRefused"
    _workflow(store, "/clones/widgets", repository="octo/widgets")
    assert budget_set("--daily", "2", "--repository", "Octo/Widgets")["scope"] == "octo/widgets"
    # Another clone keeps its own store: a budget set in this one it would never read.
    other = tmp_path / "other"
    git(other.parent, "init", "-q", str(other))
    before = store.budgets()
    for elsewhere, remedy in (
        (str(other), f"-C {other}`"),
        (str(tmp_path / "nonexistent"), "`phasegate budget set` in that clone"),
    ):
        refused = budget_set("--daily", "2", "--repository", elsewhere)
        assert refused["code"] == 2 and refused["error"]["kind"] == "BudgetRefused"
        message = refused["error"]["message"]
        assert f"this is the store of {repo} (.phasegate/state.db)" in message
        assert remedy in message and "shared store" in message and "docs/budgets.md" in message
    assert store.budgets() == before
    # A clone whose cartridge names this very store shares it: its budget is read there.
    shared = f"sqlite:///{repo / '.phasegate' / 'state.db'}"
    cartridge = (repo / "phasegate.toml").read_text()
    (other / "phasegate.toml").write_text(f'{cartridge}\n[store]\nurl = "{shared}"\n')
    assert budget_set("--daily", "2", "--repository", str(other))["scope"] == str(other)
    both = budget_set("--daily", "2", "--all", "--repository", "octo/widgets")
    assert both["code"] == 2 and "not both" in both["error"]["message"]
    assert budget_set("--daily", "0")["error"]["kind"] == "BudgetRefused"

    # Piped, the table is as wide as its cells: the path and the period whole, on one line.
    assert budget_set("--daily", "2")["code"] == 0
    table = phasegate_in_process("budget", "-C", str(repo)).stdout
    (line,) = [x for x in table.splitlines() if str(repo) in x]
    assert len(line) > 80 and f"{store.clock.now():%Y-%m-%d}" in line and "the store" in line

    # A viewer sees the costs page and its JSON, as `phasegate costs --json` gives them.
    with TestClient(
        create_app(engine, _Viewer(token="viewer-token-for-costs", user="vera"))
    ) as client:
        client.headers["Authorization"] = "Bearer viewer-token-for-costs"
        page = client.get("/costs?by=role")
        assert page.status_code == 200
        assert 'data-key="plan"' in page.text and 'data-scope="*" data-kind="monthly"' in page.text
        answer = client.get("/api/costs", params={"by": "role", "since": "today"}).json()
        cli = phasegate_in_process(
            "costs", "--by", "role", "--since", "today", "--json", "-C", str(repo)
        )
        assert answer["costs"] == json.loads(cli.stdout)
        assert answer["repository"] == str(repo)
        assert [(b["scope"], b["kind"], b["reached"]) for b in answer["budgets"]] == [
            (STORE_SCOPE, "monthly", False),
            (str(repo), "daily", False),
            (str(tmp_path / "other"), "daily", False),
            ("octo/widgets", "daily", False),
        ]
        refused = client.get("/api/costs", params={"by": "provider"})
        assert refused.status_code == 400 and refused.json()["error"]["kind"] == "BudgetRefused"
        bad_since = client.get("/api/costs", params={"since": "yesterday"}).json()["error"]
        assert bad_since["message"].startswith("since takes a date")
        assert "--since" not in bad_since["message"]
        assert client.get("/costs?since=yesterday").status_code == 400


class _Viewer(Access):
    """The token stands for a viewer: sees every page, decides nothing."""

    def bearer(self, token: str) -> Person | None:
        person = super().bearer(token)
        return None if person is None else Person(person.name, Role.VIEWER)


VIEWER_TOKEN = "viewer-token-for-costs"


def _run(store: Store, workflow_id: str, role: str, model: str, usd: float) -> None:
    store.record_agent_run(
        AgentRunRecord(
            workflow_id=workflow_id,
            phase="development",
            role=role,
            session_line="build",
            runner="scripted",
            round=0,
            attempt=0,
            outcome="ok",
            input_tokens=10,
            output_tokens=5,
            cost_usd=usd,
            model=model,
        )
    )


def _workflow(store: Store, repo_path: str, repository: str | None = None) -> str:
    return store.create_workflow(
        title="t",
        ticket="t",
        repo_path=repo_path,
        base_branch="main",
        auto_merge=False,
        content_language="en",
        repository=repository,
    )


def test_costs_group_and_budgets_sum_by_utc_day_and_month(store_url: str) -> None:
    clock = FixedClock(datetime(2026, 11, 30, 23, 30, tzinfo=UTC))
    store = open_store(store_url, clock)
    try:
        here = _workflow(store, "/clones/a")
        there = _workflow(store, "/clones/b", repository="octo/widgets")
        _run(store, here, "build", "m-big", 1.0)  # November
        clock.advance(3600)  # 00:30 on the first of December, UTC
        _run(store, here, "build", "m-big", 0.5)
        _run(store, here, "review", "", 0.25)  # no model named: the runner's name
        _run(store, there, "build", "m-small", 2.0)
        by = {g: store.costs(g) for g in ("repository", "model", "role", "day", "workflow")}
        assert [(r["key"], r["cost_usd"], r["calls"]) for r in by["repository"]] == [
            ("octo/widgets", 2.0, 1),
            ("/clones/a", 1.75, 3),
        ]
        assert [(r["key"], r["cost_usd"]) for r in by["model"]] == [
            ("m-small", 2.0),
            ("m-big", 1.5),
            ("scripted", 0.25),
        ]
        assert [(r["key"], r["calls"]) for r in by["role"]] == [("build", 3), ("review", 1)]
        assert [(r["key"], r["cost_usd"]) for r in by["day"]] == [
            ("2026-11-30", 1.0),
            ("2026-12-01", 2.75),
        ]
        assert by["workflow"][0] == {
            "key": there,
            "cost_usd": 2.0,
            "input_tokens": 10,
            "output_tokens": 5,
            "calls": 1,
        }
        december = since_of("month", clock.now())
        # 7d is whole UTC days: today (December 1) and the 6 before, from 00:00 UTC.
        assert since_of("7d", clock.now()) == datetime(2026, 11, 25, tzinfo=UTC)
        assert since_of("1d", clock.now()) == since_of("today", clock.now())
        with pytest.raises(BudgetRefused, match="^since takes"):
            since_of("0d", clock.now())
        assert [r["key"] for r in store.costs("day", december)] == ["2026-12-01"]
        with pytest.raises(BudgetRefused, match="grouped by"):
            store.costs("provider")

        # A new UTC month: November's dollar counts for neither the day nor the month.
        store.set_budget("/clones/a", {"daily": 0.5, "monthly": 10.0}, by="ops")
        store.set_budget(STORE_SCOPE, {"daily": 100.0}, by="ops")
        cartridge = Cartridge.model_validate({"limits": {"daily_budget_usd": 9.0}})
        found = {(b.scope, b.kind): b for b in budgets_of(store, cartridge, "/clones/a")}
        assert found[("/clones/a", "daily")].spent_usd == pytest.approx(0.75)
        assert found[("/clones/a", "daily")].source == "store"  # the store's wins
        assert found[("/clones/a", "monthly")].spent_usd == pytest.approx(0.75)
        assert found[(STORE_SCOPE, "daily")].spent_usd == pytest.approx(2.75)
        tightest = calendar_budget(store, cartridge, here)
        assert tightest is not None and (tightest.kind, tightest.reached) == ("daily", True)
        store.set_budget("/clones/a", {"daily": None}, by="ops")  # removed: the cartridge's
        tightest = calendar_budget(store, cartridge, here)
        assert tightest is not None and (tightest.source, tightest.limit_usd) == ("cartridge", 9.0)
        with pytest.raises(BudgetRefused, match="more than 0"):
            store.set_budget(STORE_SCOPE, {"daily": -1.0}, by="ops")
    finally:
        store.close()
