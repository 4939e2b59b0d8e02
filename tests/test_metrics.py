"""``/metrics``: the store's figures in Prometheus' text format, parsed with
prometheus-client's own parser, moving as a real workflow runs (scripted agents,
a real repository and SQLite store), and refused to a client elsewhere without
a token.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from phasegate import operations
from phasegate.core.contract import EventWrite
from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.web import Access, create_app

TOKEN = "metrics-token-for-tests-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(client: TestClient) -> Samples:
    """Every sample of one scrape, by name and sorted labels."""
    answer = client.get("/metrics", headers=BEARER)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        v
        for (n, got), v in samples.items()
        if n == name and all((k, labels[k]) in got for k in labels)
    )


def test_metrics_move_as_a_workflow_runs(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, store = engine_for(happy_repo)
    app = create_app(engine, Access(token=TOKEN, user="alice"))
    with TestClient(app) as client:
        empty = scrape(client)
        assert total(empty, "phasegate_workflows") == 0
        assert total(empty, "phasegate_queue_depth") == 0

        workflow_id = engine.start("Add the feature", "Write feature.txt", auto_merge=False)
        filed = scrape(client)
        assert total(filed, "phasegate_workflows", status="preparing", phase="preparation") == 1
        assert total(filed, "phasegate_queue_depth") == 1

        # A worker of another machine holds it, its build agent started: running, not queued.
        assert store.claim(workflow_id, "elsewhere:7:token", 60) is not None
        store.add_event(workflow_id, EventWrite("agent_started", {"role": "build"}))
        held = scrape(client)
        assert total(held, "phasegate_queue_depth") == 0
        assert total(held, "phasegate_worker_leases", state="held") == 1
        assert total(held, "phasegate_workers_holding_leases") == 1
        assert total(held, "phasegate_agents_running", role="build") == 1
        store.release(workflow_id, "elsewhere:7:token")

        row = engine.advance(workflow_id)
        assert (row["current_phase"], row["status"]) == ("wait", "waiting")
        waiting = scrape(client)
        assert total(waiting, "phasegate_workflows", status="waiting", phase="wait") == 1
        assert total(waiting, "phasegate_workflows", status="preparing") == 0
        assert total(waiting, "phasegate_queue_depth") == 0  # it waits for a person
        assert total(waiting, "phasegate_agents_running") == 0
        runs = total(waiting, "phasegate_agent_runs_total")
        assert runs == len(store.agent_runs(workflow_id)) >= 4
        assert total(waiting, "phasegate_agent_duration_seconds_count") == runs
        # the scripted build reports 100 input tokens, 50 output, $0.01
        assert (
            total(waiting, "phasegate_agent_tokens_total", role="build", direction="input") == 100
        )
        assert total(waiting, "phasegate_agent_cost_usd_total", role="build") == 0.01
        # by model too: this binding names none, so the runner's own is ""
        assert total(waiting, "phasegate_agent_cost_usd_total", role="build", model="") == 0.01
        assert total(waiting, "phasegate_phase_duration_seconds_count", phase="planning") == 1

        operations.approve_merge(engine, workflow_id, by="alice")
        row = engine.advance(workflow_id)
        assert row["status"] == "completed"
        store.add_event(workflow_id, EventWrite("forge_retry", {"call": "GET /x", "status": 502}))
        done = scrape(client)
        assert total(done, "phasegate_workflows", status="completed") == 1
        assert total(done, "phasegate_workflows", status="waiting") == 0
        assert total(done, "phasegate_forge_faults_total", type="forge_retry") == 1
        assert total(done, "phasegate_journaled_effects_total", status="completed") > total(
            waiting, "phasegate_journaled_effects_total", status="completed"
        )

        # Pruned, its forge fault still counts: a counter does not go down.
        pruned = store.prune(store.clock.now())
        assert pruned.workflows == [workflow_id]
        after = scrape(client)
        assert total(after, "phasegate_forge_faults_total", type="forge_retry") == 1
        assert total(after, "phasegate_phase_duration_seconds_count") == total(
            done, "phasegate_phase_duration_seconds_count"
        )


def test_metrics_without_a_token_only_from_this_machine_and_only_when_configured(
    happy_repo: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    engine, _store = engine_for(happy_repo)
    access = Access(token=TOKEN, user="alice")
    local = create_app(engine, access, metrics_mode="local")
    with TestClient(local, client=("10.1.2.3", 50000)) as elsewhere:
        assert elsewhere.get("/metrics").status_code == 401
        assert elsewhere.get("/metrics", headers=BEARER).status_code == 200
        assert (
            elsewhere.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        )
    with TestClient(local, client=("127.0.0.1", 50000)) as here:
        assert here.get("/metrics").status_code == 200
        assert here.get("/").status_code == 401  # the exception is /metrics' alone
    with TestClient(local, client=("::1", 50000)) as here:
        assert here.get("/metrics").status_code == 200
    token = create_app(engine, access)  # the default: a token, from anywhere
    with TestClient(token, client=("127.0.0.1", 50000)) as here:
        assert here.get("/metrics").status_code == 401
        assert here.get("/metrics", headers=BEARER).status_code == 200
    off = create_app(engine, access, metrics_mode="off")
    with TestClient(off, client=("127.0.0.1", 50000)) as here:
        assert here.get("/metrics", headers=BEARER).status_code == 404
