"""``GET /metrics``: the store's figures in Prometheus' text format.

Computed from the store at each scrape (``Store.figures``) by a collector of
our own, not counted in this process: a dashboard beside several workers on a
shared store reports what all of them did. Who may read it is ``serve
--metrics`` (METRICS_MODES): ``token``, a person's bearer token or session as
for every page; ``local``, that or any client of this machine (loopback) with
none; ``off``, no such page. Behind a reverse proxy on the same machine every
request comes from loopback: use ``token`` there (docs/operations-at-scale.md).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Iterator

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from phasegate.core.contract import NEEDS_YOU_STATUSES, RUNNABLE_STATUSES
from phasegate.store import Store
from phasegate.store.figures import AGENT_BUCKETS_S, Figures, PhaseTally

__all__ = ["METRICS_MODES", "PATH", "StoreCollector", "open_to", "router"]

PATH = "/metrics"
#: ``serve --metrics``: who may read PATH (see the module's docstring).
METRICS_MODES = ("token", "local", "off")


def open_to(request: Request, mode: str) -> bool:
    """Whether ``request`` may read PATH without a token: in ``local`` mode, from a
    loopback address (127.0.0.0/8, ::1) only."""
    if mode != "local" or request.url.path != PATH or request.method != "GET":
        return False
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name, not an address: not a client we can place
        return False


def router(store: Store) -> APIRouter:
    """The route of PATH on ``store``'s figures."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    routes = APIRouter()

    @routes.get(PATH, include_in_schema=False)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return routes


class StoreCollector(Collector):
    """Every figure of ``Store.figures`` as metric families, read at each collect."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.phases = PhaseTally()
        self._lock = threading.Lock()  # two scrapes at once: one tally brought up to date

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        with self._lock:
            figures = self.store.figures(
                self.store.clock.now(), RUNNABLE_STATUSES, NEEDS_YOU_STATUSES, self.phases
            )
        yield from families(figures)
        took = GaugeMetricFamily(
            "phasegate_scrape_store_seconds", "Seconds this scrape spent reading the store."
        )
        took.add_metric([], time.perf_counter() - started)
        yield took


def families(f: Figures) -> Iterator[Metric]:
    """``f`` as Prometheus metric families (names and labels: docs/operations-at-scale.md)."""
    workflows = GaugeMetricFamily(
        "phasegate_workflows", "Workflows by status and phase.", labels=["status", "phase"]
    )
    for (status, phase), n in sorted(f.workflows.items()):
        workflows.add_metric([status, phase], n)
    yield workflows
    yield GaugeMetricFamily(
        "phasegate_queue_depth",
        "Workflows a worker would take now: runnable, due, not waiting for a person, "
        "no live lease.",
        value=f.queue_depth,
    )
    agents = GaugeMetricFamily(
        "phasegate_agents_running", "Agents running now, by role.", labels=["role"]
    )
    for role, n in sorted(f.agents_running.items()):
        agents.add_metric([role], n)
    yield agents
    yield GaugeMetricFamily(
        "phasegate_checks_running",
        "Workflows running their checks now (a live lease, in development, the build done).",
        value=f.checks_running,
    )
    leases = GaugeMetricFamily(
        "phasegate_worker_leases", "Workflow leases by state.", labels=["state"]
    )
    for state in ("held", "expired"):
        leases.add_metric([state], f.leases.get(state, 0))
    yield leases
    yield GaugeMetricFamily(
        "phasegate_workers_holding_leases",
        "Distinct workers (host:pid) holding a live lease.",
        value=f.lease_holders,
    )
    phases = SummaryMetricFamily(
        "phasegate_phase_duration_seconds",
        "Time from entering a phase to entering the next, over phases left.",
        labels=["phase"],
    )
    for phase, (count, seconds) in sorted(f.phase_seconds.items()):
        phases.add_metric([phase], count_value=count, sum_value=seconds)
    yield phases
    durations = HistogramMetricFamily(
        "phasegate_agent_duration_seconds",
        "Agent runs by how long they took, by role and runner.",
        labels=["role", "runner"],
    )
    for (role, runner), (counts, n, seconds) in sorted(f.agent_seconds.items()):
        buckets = [(f"{bound:g}", c) for bound, c in zip(AGENT_BUCKETS_S, counts, strict=True)]
        durations.add_metric([role, runner], [*buckets, ("+Inf", n)], seconds)
    yield durations
    runs = CounterMetricFamily(
        "phasegate_agent_runs", "Agent runs finished.", labels=["role", "runner", "outcome"]
    )
    for key, n in sorted(f.agent_runs.items()):
        runs.add_metric(list(key), n)
    yield runs
    tokens = CounterMetricFamily(
        "phasegate_agent_tokens",
        "Tokens agents used.",
        labels=["role", "runner", "model", "direction"],
    )
    cost = CounterMetricFamily(
        "phasegate_agent_cost_usd", "What agents cost, USD.", labels=["role", "runner", "model"]
    )
    for (role, runner, model), (tokens_in, tokens_out, usd) in sorted(f.usage.items()):
        tokens.add_metric([role, runner, model, "input"], tokens_in)
        tokens.add_metric([role, runner, model, "output"], tokens_out)
        cost.add_metric([role, runner, model], usd)
    yield tokens
    yield cost
    faults = CounterMetricFamily(
        "phasegate_forge_faults",
        "Forge faults met: forge_retry (a call failed and was tried again), "
        "forge_auto_resume (a forge pause resumed), comment_dropped.",
        labels=["type"],
    )
    for kind, n in sorted(f.forge_faults.items()):
        faults.add_metric([kind], n)
    yield faults
    effects = CounterMetricFamily(
        "phasegate_journaled_effects",
        "Journaled side effects (forge issues, pull requests, comments, merges) by status.",
        labels=["kind", "status"],
    )
    for (kind, status), n in sorted(f.effects.items()):
        effects.add_metric([kind, status], n)
    yield effects
