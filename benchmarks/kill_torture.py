"""Random kill-torture: many trials of ``support.torture``, and what they found.

    python benchmarks/kill_torture.py --trials 300 [--seed 1] [--jobs 2] [--keep DIR]
    python benchmarks/kill_torture.py --github --trials 30     # on the fake GitHub, one job
    python benchmarks/kill_torture.py --mode gitlab --trials 30  # on the fake GitLab, one job
    python benchmarks/kill_torture.py --mode gitea --trials 30   # on the fake Gitea, one job
    python benchmarks/kill_torture.py --mode postgres --trials 30 [--workflows 3]  # two workers

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

``--github`` runs every trial on the GitHub forge (``torture_github``): the fake
GitHub behind one Prism (installed by ``.ci/run``), so one trial at a time.
``--mode gitlab`` and ``--mode gitea`` run them on the GitLab or Gitea forge
(``torture_gitlab``, ``torture_gitea``), one at a time too.

``--mode postgres`` runs every trial on a PostgreSQL store with two workers
(``torture_postgres``: three workflows, each worker of concurrency 2, the kills
aimed at one worker or both): on ``PHASEGATE_POSTGRES_URL``, or a throwaway
server started for the run (``support.postgres``); each trial a
schema of its own. ``--github`` is ``--mode github``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the rig: tests/support
from support.postgres import server_url  # noqa: E402
from support.torture import Trial, run_trial, run_uninterrupted, trial_mode  # noqa: E402
from support.torture_forge import ForgeRig  # noqa: E402
from support.torture_gitea import GiteaRig  # noqa: E402
from support.torture_github import GitHubRig  # noqa: E402
from support.torture_gitlab import GitLabRig  # noqa: E402
from support.torture_postgres import (  # noqa: E402
    WORKFLOWS,
    run_postgres_trial,
    run_postgres_uninterrupted,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1, help="the first trial's seed")
    parser.add_argument("--jobs", type=int, default=2, help="trials run at once")
    parser.add_argument("--keep", type=Path, help="keep every trial's directory under DIR")
    parser.add_argument(
        "--mode",
        choices=("local", "github", "gitlab", "gitea", "postgres"),
        default="local",
        help="local: classic and graph trials on SQLite; github, gitlab, gitea: on that fake "
        "forge (one job); postgres: on PostgreSQL with two workers",
    )
    parser.add_argument("--github", action="store_true", help="the same as --mode github")
    parser.add_argument(
        "--workflows", type=int, default=WORKFLOWS, help="per postgres trial, shared by two workers"
    )
    parser.add_argument(
        "--baseline-runs",
        type=int,
        default=3,
        help="uninterrupted runs per mode whose median span the kills are drawn within",
    )
    args = parser.parse_args(argv)
    if args.github:
        args.mode = "github"
    if args.mode == "postgres":
        url, server = server_url()
        try:
            return run(args, None, url)
        finally:
            if server is not None:
                server.stop()
    if args.mode in ("gitlab", "gitea"):
        return run(args, GitLabRig() if args.mode == "gitlab" else GiteaRig())
    with GitHubRig() if args.mode == "github" else contextlib.nullcontext() as rig:
        return run(args, rig)


def run(args: argparse.Namespace, rig: ForgeRig | None, postgres_url: str = "") -> int:
    """The trials ``args`` ask for (on ``rig``'s fake forge when given, on the
    PostgreSQL server at ``postgres_url`` when given); the exit code."""
    base = args.keep or Path(tempfile.mkdtemp(prefix="phasegate-torture-"))
    base.mkdir(parents=True, exist_ok=True)
    spans = {}
    modes = (rig.name,) if rig else ("postgres",) if postgres_url else ("classic", "graph")
    for mode in modes:
        roots = [base / f"uninterrupted-{mode}-{i}" for i in range(max(1, args.baseline_runs))]
        runs = [
            run_postgres_uninterrupted(root, postgres_url=postgres_url, workflows=args.workflows)
            if postgres_url
            else run_uninterrupted(root, mode=mode, rig=rig)
            for root in roots
        ]
        spans[mode] = statistics.median(runs)
        print(f"uninterrupted {mode} run: {spans[mode]:.2f} s (median of {len(runs)})")

    def trial(seed: int) -> Trial:
        root = base / f"trial-{seed}"
        if postgres_url:
            span = spans["postgres"]
            return run_postgres_trial(
                root, seed, postgres_url=postgres_url, span_s=span, workflows=args.workflows
            )
        mode = rig.name if rig else trial_mode(seed)
        return run_trial(root, seed, span_s=spans[mode], mode=mode, rig=rig)

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=1 if rig else args.jobs) as pool:
        trials = list(pool.map(trial, range(args.seed, args.seed + args.trials)))
    elapsed = time.monotonic() - started

    report(trials, elapsed, spans)
    for trial in trials:
        if trial.ok and not args.keep:
            shutil.rmtree(trial.root, ignore_errors=True)
    bad = [t for t in trials if not t.ok]
    if bad:
        print(f"trial directories kept under {base}")
    elif not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    return 1 if bad else 0


def report(trials: list[Trial], elapsed_s: float, spans: dict[str, float]) -> None:
    kills = [k for t in trials for k in t.kills]
    print(f"trials: {len(trials)}   kills: {len(kills)}   wall time: {elapsed_s:.0f} s")
    for mode, span in spans.items():
        durations = [t.duration_s for t in trials if t.mode == mode]
        if durations:
            per_trial = statistics.median(durations)
            print(
                f"{mode}: {len(durations)} trials, {per_trial:.2f} s median each; "
                f"{per_trial / span:.2f}x an uninterrupted run (kills, restarts, recovery)"
            )
    for title, key in (("kills by phase", "phase"), ("by aim", "aim"), ("by target", "target")):
        counts = Counter(k[key] for k in kills)
        print(f"{title}: " + ", ".join(f"{name} {n}" for name, n in counts.most_common()))
    missed = sum(1 for k in kills if not k["window_hit"])
    print(f"aimed kills whose window never opened (fired at its end): {missed}")
    requests = Counter(k["request"] or "(settled first)" for k in kills if "request" in k)
    if any(t.forge_requests for t in trials):
        per_trial = statistics.median(t.forge_requests for t in trials)
        print(f"requests to the fake forge: {per_trial:.0f} per trial (median)")
    if requests:
        print("requests killed in flight: " + ", ".join(f"{r} {n}" for r, n in requests.items()))
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
