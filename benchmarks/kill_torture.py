"""Random kill-torture: many trials of ``phasegate.testing.torture``, and what they found.

    python benchmarks/kill_torture.py --trials 300 [--seed 1] [--jobs 2] [--keep DIR]

Each trial runs one whole workflow (command agents that really edit files, a
profile that merges unattended), SIGKILLs it 1–3 times at moments drawn from
its seed (uniformly at random, or aimed at a journal window, a git command,
the merge, acceptance verification, a running agent; the worker alone or every
process of the trial), lets a new worker settle it and checks the invariants.
Prints the trials, the kills by phase, aim and target, and the violations by
kind with the seeds to replay them (``--seed S --trials 1``). Exit 1 when any
trial violated an invariant.

The peer it runs beside is the uninterrupted run: the same workflow with no
kill (``--calibrate``), so the slowdown a crash costs is a ratio.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from phasegate.testing.torture import Trial, run_trial, run_uninterrupted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1, help="the first trial's seed")
    parser.add_argument("--jobs", type=int, default=2, help="trials run at once")
    parser.add_argument("--keep", type=Path, help="keep every trial's directory under DIR")
    args = parser.parse_args(argv)

    base = args.keep or Path(tempfile.mkdtemp(prefix="phasegate-torture-"))
    base.mkdir(parents=True, exist_ok=True)
    clean = [run_uninterrupted(base / f"uninterrupted-{i}") for i in range(3)]
    span = statistics.median(clean)
    print(f"uninterrupted run: {span:.2f} s (median of 3)")

    started = time.monotonic()
    seeds = range(args.seed, args.seed + args.trials)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        trials = list(pool.map(lambda s: run_trial(base / f"trial-{s}", s, span_s=span), seeds))
    elapsed = time.monotonic() - started

    report(trials, elapsed, span)
    for trial in trials:
        if trial.ok and not args.keep:
            shutil.rmtree(trial.root, ignore_errors=True)
    bad = [t for t in trials if not t.ok]
    if bad:
        print(f"trial directories kept under {base}")
    elif not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if bad else 0


def report(trials: list[Trial], elapsed_s: float, span_s: float) -> None:
    kills = [k for t in trials for k in t.kills]
    print(f"trials: {len(trials)}   kills: {len(kills)}   wall time: {elapsed_s:.0f} s")
    per_trial = statistics.median(t.duration_s for t in trials)
    print(
        f"a trial: {per_trial:.2f} s median; {per_trial / span_s:.2f}x an uninterrupted run"
        f" (kills, restarts, recovery)"
    )
    for title, key in (("kills by phase", "phase"), ("by aim", "aim"), ("by target", "target")):
        counts = Counter(k[key] for k in kills)
        print(f"{title}: " + ", ".join(f"{name} {n}" for name, n in counts.most_common()))
    missed = sum(1 for k in kills if not k["window_hit"])
    print(f"aimed kills whose window never opened (fired at its end): {missed}")
    statuses = Counter(t.status for t in trials)
    print("final status: " + ", ".join(f"{s} {n}" for s, n in statuses.most_common()))
    print(f"resumes after a pause: {sum(t.resumes for t in trials)}")
    violations = Counter(v.kind for t in trials for v in t.violations)
    total = sum(violations.values())
    print(f"violations: {total}" + (": " if total else ""))
    for kind, n in violations.most_common():
        seeds = [t.seed for t in trials if any(v.kind == kind for v in t.violations)]
        example = next(v.detail for t in trials for v in t.violations if v.kind == kind)
        print(f"  {kind}: {n} (seeds {seeds[:10]}) e.g. {example[:300]}")


if __name__ == "__main__":
    sys.exit(main())
