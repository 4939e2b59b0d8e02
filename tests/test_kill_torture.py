"""The random kill-torture harness in CI (issue 9, item 1): whole workflows SIGKILLed at
random moments, every invariant checked on every trial, no violation allowed.

``PHASEGATE_TORTURE_TRIALS`` sets how many trials run (default 20, under two minutes);
``PHASEGATE_TORTURE_SEED`` the first seed (default: a new one each run, printed, so CI
explores new moments and a failure names the seed that replays it).
``benchmarks/kill_torture.py --trials 300`` runs many more and prints the figures.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import pytest

from phasegate.testing.torture import (
    AIMS,
    TARGETS,
    plan_kills,
    run_trial,
    run_uninterrupted,
    trial_mode,
)

# Sandboxed, as on a person's machine: kills land on bwrap and its PID namespace too.
pytestmark = [pytest.mark.slow, pytest.mark.sandboxed]

TRIALS = int(os.environ.get("PHASEGATE_TORTURE_TRIALS", "20"))


def test_kill_plans_are_replayed_by_their_seed_and_cover_every_aim_and_target() -> None:
    assert plan_kills(7, 3.0) == plan_kills(7, 3.0)
    plans = [k for seed in range(200) for k in plan_kills(seed, 3.0)]
    assert {k.aim for k in plans} == set(AIMS)
    assert {k.target for k in plans} == set(TARGETS)
    assert all(0.0 <= k.at_s <= 3.0 for k in plans)
    assert Counter(len(plan_kills(seed, 3.0)) for seed in range(200)).keys() == {1, 2, 3}


def test_random_kills_never_break_an_invariant(tmp_path: Path) -> None:
    first = int(os.environ.get("PHASEGATE_TORTURE_SEED") or random.randrange(1, 10**6))
    spans = {mode: run_uninterrupted(tmp_path / mode, mode=mode) for mode in ("classic", "graph")}
    trials = [
        run_trial(tmp_path / f"trial-{s}", s, span_s=spans[trial_mode(s)])
        for s in range(first, first + TRIALS)
    ]
    kills = Counter(k["phase"] for t in trials for k in t.kills)
    print(f"\nseeds {first}..{first + TRIALS - 1}; uninterrupted {spans}")
    print(f"kills by phase: {dict(kills)}")
    failures = [
        f"seed {t.seed} ({t.root}): {v.kind}: {v.detail}" for t in trials for v in t.violations
    ]
    assert not failures, "replay with PHASEGATE_TORTURE_SEED=<seed>:\n" + "\n".join(failures)
    assert sum(len(t.kills) for t in trials) >= TRIALS  # every trial was really interrupted
    assert all(t.status == "completed" for t in trials)
    assert {t.mode for t in trials} == {"classic", "graph"} or TRIALS < 4
